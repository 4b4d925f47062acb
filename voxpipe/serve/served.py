"""The model a server holds once it is loaded: what app.py answers with and server.py builds.

It lives apart from both so that the app (routes) and the server (loading, uvicorn) do not import
each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from voxpipe.track.voices import ASSUMED_LOCALE

if TYPE_CHECKING:
    from voxpipe.model.voxcpm2 import VoxCPM2

NO_ADAPTER = "none"  # the adapter label of a model served without one


@dataclass(frozen=True)
class ServedModel:
    model: VoxCPM2
    version: str  # models:/NAME/VERSION (pinned), or the checkpoint folder
    voices: Path | None  # the version's voices folder (track/voices.py), if it has one
    sample_rate: int  # the model's own (VoxCPM2: 48 kHz)
    created: int  # unix seconds, for /v1/models
    adapter: str | None = None  # sha256 of the served LoRA adapter's weights (merged or not), if any
    locale: str = ASSUMED_LOCALE  # the model's text is read in it (request.model_locale)

    @property
    def adapter_label(self) -> str:
        return self.adapter or NO_ADAPTER

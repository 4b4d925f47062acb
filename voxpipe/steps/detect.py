"""`detect`'s section and step: is a clip marked (PerTh watermark, C2PA manifest)?"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from voxpipe.section import Section
from voxpipe.steps import Step


class DetectParams(Section):
    """`detect`: is a clip voxpipe's? Per file, PerTh's watermark (present, score) and the C2PA manifest
    (present, valid, signer, model version)."""

    files: list[str] = Field(default_factory=list, description="the audio files to check (WAV, FLAC, MP3, "
                             "OGG: what soundfile reads; C2PA from WAV and MP3)",
                             json_schema_extra={"result": False})
    format: Literal["table", "json"] = Field("table", description="table: one line per file; json: a list "
                                             "of one object per file", json_schema_extra={"result": False})


ORDER = 155
SECTIONS = {"detect": DetectParams}

STEPS = (
    Step("detect", "per audio file: PerTh's watermark (present, score) and its C2PA manifest (valid, signer, "
         "model version)", target="voxpipe.evaluate.detect:detect", reads=("detect",), section="detect",
         out_folder=False),
)

"""`promote`'s section and step: @champion moved by hand, with who, when and why."""

from __future__ import annotations

from pydantic import Field

from voxpipe.section import Section
from voxpipe.steps import Step


class PromoteParams(Section):
    """`promote`: move @champion to a version by hand, recording who, when and why on it."""

    model: str | None = Field(None, description="registered model name; None: register.model_name's")
    version: int = Field(0, ge=0, description="the version to make @champion (required)")
    reason: str = Field("", description="why, recorded on the version (required)")


ORDER = 120
SECTIONS = {"promote": PromoteParams}

STEPS = (
    Step("promote", "move @champion to a version by hand (the rule decides only on the same data); who, when "
         "and why become tags of the version", target="voxpipe.track.promote:promote",
         reads=("promote", "register.model_name", "register.lock_timeout_s", "ingest.input", "tracking"),
         hide=("register.model_name", "ingest.input"), out_folder=False),
)

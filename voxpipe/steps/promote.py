"""`promote`: its settings."""

from __future__ import annotations

from pydantic import Field

from voxpipe.section import Section


class PromoteParams(Section):
    """`promote`: move @champion to a version by hand, recording who, when and why on it."""

    model: str | None = Field(None, description="registered model name; None: register.model_name's")
    version: int = Field(0, ge=0, description="the version to make @champion (required)")
    reason: str = Field("", description="why, recorded on the version (required)")

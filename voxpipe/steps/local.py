"""`local`: this machine under `dvc repro` (no step of its own; the stages' torchrun reads it)."""

from __future__ import annotations

from pydantic import Field

from voxpipe.section import Section

MAX_LOCAL_NPROC = 64  # torchrun processes on one box: as many as a pod may have devices (MAX_DEVICES_PER_POD)


class LocalParams(Section):
    """This machine under `dvc repro` / make (not the cluster: that is `launch`)."""

    nproc: int = Field(
        2, ge=1, le=MAX_LOCAL_NPROC, description="torchrun processes per step (train, encode): CPU processes "
        "here, one per GPU/NPU on an accelerator box; at most "
        f"{MAX_LOCAL_NPROC}. The world size changes the data order, so DVC tracks it"
    )


ORDER = 180
SECTIONS = {"local": LocalParams}

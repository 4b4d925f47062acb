"""`sweep`: its settings."""

from __future__ import annotations

from pydantic import Field

from voxpipe.section import Section


class SweepParams(Section):
    """`sweep-open` / `sweep-close`: one MLflow parent run per sweep, its children the grid's points; only
    the best child by the promotion rule is registered (voxpipe/track/sweep.py)."""

    grid: list[str] = Field(
        default_factory=list, description="the swept settings, one `section.key=v1,v2,...` each; the sweep "
        "runs every combination (recorded on the parent run)"
    )
    out: str = Field("work/sweep", description="sweep.json (the parent run id, the grid and, once closed, "
                     "the best child)", json_schema_extra={"result": False})
    workers: int = Field(0, ge=0, description="experiments run at once by the local sweep (`dvc queue start "
                         "-j`); 0: one per two cores, at least one")

"""`sweep`'s section and the sweep-open / sweep-close steps around a grid of runs."""

from __future__ import annotations

from pydantic import Field

from voxpipe.section import Section
from voxpipe.steps import Step


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


ORDER = 140
SECTIONS = {"sweep": SweepParams}

STEPS = (
    Step("sweep-open", "open a sweep: its MLflow parent run, the grid recorded on it; the id in "
         "sweep.out/sweep.json (each point then runs with --set tracking.parent_run=ID)",
         target="voxpipe.track.sweep:sweep_open",
         reads=("sweep", "tracking", "register.model_name", "ingest.input"),
         hide=("ingest.input", "sweep.workers", "tracking.parent_run")),
    Step("sweep-close", "close a sweep: rank its children by the promotion rule then loss, tag the best on "
         "the parent and register only it (@champion only by beating the current one)",
         target="voxpipe.track.sweep:sweep_close",
         reads=("sweep", "tracking", "register.model_name", "register.lock_timeout_s", "ingest.input"),
         hide=("ingest.input", "sweep.grid", "sweep.workers")),
)

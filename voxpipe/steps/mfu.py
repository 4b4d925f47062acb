"""`mfu`'s section and step (a stage): a training run's model FLOPs utilisation."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from voxpipe.section import Section
from voxpipe.steps import Out, Stage, Step


class MfuParams(Section):
    """`mfu`: model FLOPs utilisation of a training run, from its report.json and metrics.jsonl."""

    train_report: str = Field("work/train/report.json", description="the train step's report.json",
                              json_schema_extra={"result": False, "wired": True})
    metrics: str | None = Field(None, description="metrics.jsonl (None: next to train_report)",
                                json_schema_extra={"result": False, "wired": True})
    out: str = Field("work/mfu", description="output folder: mfu.json, mfu.md, report.json",
                     json_schema_extra={"result": False, "wired": True})
    peak_tflops: float | None = Field(
        None, gt=0, description="peak dense TFLOP/s of one device (None: table by device name; CPU: measured)"
    )
    dtype: Literal["float32", "bfloat16"] | None = Field(
        None, description="training compute dtype (None: the train report's)"
    )
    warmup_steps: int = Field(1, ge=0, description="first optimizer steps left out (allocation, warm-up)")


ORDER = 100
SECTIONS = {"mfu": MfuParams}

STEPS = (
    Step("mfu", "model FLOPs utilisation of a training run: mfu.json (DVC metric) + mfu.md",
         target="voxpipe.mfu.report:mfu", reads=("mfu", "model.base"),
         stage=Stage(
             deps=("${model.base}", "${mfu.train_report}", "${train.out}/metrics.jsonl"),
             outs=(Out("${mfu.out}/mfu.md", cache=False,
                       note="figures of this run's timings: a record, not cached"),
                   Out("${mfu.out}/report.json", cache=False)),
             metrics=(Out("${mfu.out}/mfu.json", cache=False),),
             notes=(("${train.out}/metrics.jsonl", "mfu.metrics: null = next to the train report"),))),
)

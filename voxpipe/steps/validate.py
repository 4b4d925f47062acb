"""`validate`'s section and step (a stage): a manifest checked before accelerator time."""

from __future__ import annotations

from pydantic import Field

from voxpipe.section import Section
from voxpipe.steps import Out, Stage, Step


class ValidateParams(Section):
    """`validate`: a manifest checked against ingest's sample rate and duration bounds."""

    manifest: str = Field("work/manifest/train.jsonl", description="manifest .jsonl to check",
                          json_schema_extra={"result": False})
    out: str = Field(
        "work/validate", description="output folder: validate.json (rows, hours, every problem); under DVC "
        "and KFP encode starts only after a usable manifest",
        json_schema_extra={"result": False},
    )


ORDER = 30
SECTIONS = {"validate": ValidateParams}

STEPS = (
    Step("validate", "check a manifest before spending accelerator time: files exist, decode, durations in "
         "ingest's bounds", target="voxpipe.data.validate:validate_manifest",
         reads=("validate", "ingest.sample_rate", "ingest.min_seconds", "ingest.max_seconds"),
         stage=Stage(
             deps=("${manifest.out}", "${ingest.out}"), outs=(Out("${validate.out}"),),
             note="the train manifest against ingest's bounds, before encode spends accelerator time",
             notes=(("${ingest.out}", "the audio the manifest points at"),))),
)

"""`manifest`'s section and step (a stage): raw.jsonl into train / val manifests."""

from __future__ import annotations

from pydantic import Field

from voxpipe.section import Section
from voxpipe.steps import Out, Stage, Step


class ManifestParams(Section):
    """`manifest`: raw.jsonl split into train.jsonl / val.jsonl (upstream format), same-speaker references."""

    input: list[str] = Field(
        default_factory=lambda: ["work/ingest/raw.jsonl"], description="raw.jsonl files from ingest",
        json_schema_extra={"result": False, "wired": True},
    )
    out: str = Field(
        "work/manifest", description="output folder: train.jsonl and val.jsonl (upstream VoxCPM format), "
        "report.json",
        json_schema_extra={"result": False, "wired": True},
    )
    val_fraction: float = Field(
        0.05, ge=0, lt=1, description="share of rows held out for validation (by id hash: a row keeps its "
        "side as the set grows)"
    )
    min_val: int = Field(2, ge=0, description="top val up to this many rows (the lowest-hash ones)")
    min_speaker_rows_for_val: int = Field(
        4, ge=1, description="a speaker with at least this many rows gets one held out"
    )
    ref_fraction: float = Field(
        0.3, ge=0, le=1, description="share of train rows given a same-speaker ref_audio (upstream advice: "
        "30-50 %)"
    )
    seed: int = Field(0, description="seed of the reference choice")


ORDER = 20
SECTIONS = {"manifest": ManifestParams}

STEPS = (
    Step("manifest", "raw.jsonl → train.jsonl / val.jsonl in the upstream VoxCPM format",
         target="voxpipe.data.manifest:build_manifest", section="manifest", reads=("manifest",),
         stage=Stage(deps=("${ingest.out}",), outs=(Out("${manifest.out}"),))),
)

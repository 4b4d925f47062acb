"""`encode`'s section and step (a `dvc repro` stage under torchrun): AudioVAE latents, once."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from voxpipe.section import Section
from voxpipe.steps import Out, Stage, Step


class EncodeParams(Section):
    """`encode`: AudioVAE latents + token ids of every manifest row, computed once, offline."""

    manifest: list[str] = Field(
        default_factory=lambda: ["work/manifest/train.jsonl", "work/manifest/val.jsonl"],
        description="manifest .jsonl files to encode (train, val); the outputs are named after them",
        json_schema_extra={"result": False, "wired": True},
    )
    out: str = Field(
        "work/encoded", description="output folder: safetensors shards, train.jsonl / val.jsonl pointing "
        "at them, report.json",
        json_schema_extra={"result": False, "wired": True},
    )
    device: Literal["auto", "cpu", "cuda", "npu"] = Field(
        "auto", description="AudioVAE device: auto = npu, else cuda, else cpu"
    )
    batch_seconds: float = Field(
        0.0, ge=0, description="padded audio seconds per AudioVAE batch; 0 = auto: 60 on accelerators, "
        "8 on CPU (memory-bound there: bigger batches fall out of cache, see benchmarks/encode.py)"
    )
    shard_mb: float = Field(256.0, gt=0, description="latent megabytes per safetensors shard")
    cpu_threads: int = Field(
        1, ge=1, description="torch threads per encode process on CPU. Latents depend on it (by ~1e-7), "
        "so it is fixed, not the core count: use more processes (torchrun, local.nproc) for more cores"
    )


ORDER = 50
SECTIONS = {"encode": EncodeParams}

STEPS = (
    Step("encode", "manifests → AudioVAE latents + token ids in safetensors shards (resumable, done once)",
         target="voxpipe.data.encode.step:encode", reads=("encode", "model.base"),
         stage=Stage(
             deps=("${manifest.out}", "${ingest.out}", "${validate.out}", "${model.base}"), torchrun=True,
             outs=(Out("${encode.out}", persist=True,
                       note="a rerun (or a resumed one) reuses every shard already written"),),
             notes=(("${ingest.out}", "the audio the manifests point at"),
                    ("${validate.out}", "runs after a usable manifest only")))),
)

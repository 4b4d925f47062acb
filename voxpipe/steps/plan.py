"""`plan`'s section and step: will training fit, before any device is allocated."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from voxpipe.accelerators import DEVICE_MEMORY_GIB
from voxpipe.section import Section
from voxpipe.steps import Step

MAX_DEVICE_MEMORY_GIB = 4096.0  # one device's (or one CPU rank's) memory: 4 TiB


class PlanParams(Section):
    """`plan`: the per-device memory of a training configuration, planned on fake tensors."""

    device: Literal["cpu", *DEVICE_MEMORY_GIB] = Field(
        "cpu", description="the accelerator the run is planned for (its memory: voxpipe/device.py's "
        "table); cpu = this host's free RAM"
    )
    device_memory_gib: float = Field(
        0.0, ge=0, le=MAX_DEVICE_MEMORY_GIB, description="memory of one device in GiB, at most "
        f"{MAX_DEVICE_MEMORY_GIB}; 0 = plan.device's figure from the table"
    )
    headroom: float = Field(
        0.1, ge=0, lt=1, description="fraction of the device memory kept free (allocator fragmentation, "
        "the CUDA/HCCL context, communication buffers): fits = peak <= (1 - headroom) x device memory"
    )
    missing_base: Literal["error", "preset"] = Field(
        "error", description="when model.base does not exist: error (a mistyped folder is not planned as "
        "another model), or preset = plan model.preset's shape (a recipe planned before its checkpoint is "
        "downloaded)"
    )
    checkpoint_write_gbps: float = Field(
        0.1, gt=0, description="checkpoint bandwidth of one rank, in GB/s (1e9 bytes): writing its share to "
        "the checkpoint volume and hashing it for the signed manifest. The plan's checkpoint save time is "
        "each rank's bytes over it, and launch.grace_seconds: auto renders that time plus a margin. The "
        "default is a conservative network volume's; set it from the write_gbps that train logs and "
        "writes in report.json (checkpoint_save) after a save"
    )
    launcher: Literal["local", "launch"] = Field(
        "local", description="whose world size the plan uses: local = local.nproc (torchrun on one box, "
        "`make repro`), launch = launch.pods x launch.devices_per_pod (`voxpipe launch-train`)"
    )
    json_: bool = Field(
        False, alias="json", description="print one JSON object instead of the table",
        json_schema_extra={"result": False},
    )


ORDER = 70
SECTIONS = {"plan": PlanParams}

STEPS = (
    Step("plan", "will train fit? per-device peak memory by category on fake tensors, the largest "
         "train.max_tokens that fits (no device needed)", target="voxpipe.train.plan:plan",
         reads=("plan", "train.max_tokens", "train.dtype", "train.activation_checkpointing", "train.lora",
          "train.export_dtype", "model.base", "model.preset", "local.nproc", "launch.pods",
          "launch.devices_per_pod"),
         out_folder=False),
)

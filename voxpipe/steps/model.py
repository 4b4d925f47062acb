"""`model`'s section (the base checkpoint, read by most steps) and the init-model step (a stage)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from voxpipe.section import Section
from voxpipe.steps import Out, Stage, Step


class ModelParams(Section):
    """The base model: `base` is read by encode, train, evaluate and mfu; `init-model` writes `out`."""

    base: str = Field(
        "work/base_model", description="base checkpoint folder (upstream VoxCPM2 layout: config.json, "
        "weights, AudioVAE, tokenizer) that encode, train, evaluate (as the baseline) and mfu read. The "
        "real model: the folder you downloaded (openbmb/VoxCPM2); the demo: init-model's out",
        json_schema_extra={"result": False, "wired": True},
    )
    preset: Literal["tiny", "small", "voxcpm2"] = Field(
        "tiny", description="init-model's size (and `voxpipe plan`'s model when model.base has no "
        "config.json): tiny (tests, the demo), small (CPU benchmarks) or voxcpm2 (the real 2.29 B shape)"
    )
    out: str = Field("work/base_model", description="init-model's output folder (a random-init checkpoint)",
                     json_schema_extra={"result": False, "wired": True})
    seed: int = Field(0, description="seed of init-model's random weights")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="dtype of the saved weights (upstream ships bfloat16)"
    )
    kernels: Literal["auto", "fused", "eager"] = Field(
        "auto", description="model kernels of train, evaluate and the served model: auto = torch_npu's fused "
        "RMSNorm + SwiGLU and bf16 RoPE on an Ascend NPU, eager PyTorch elsewhere; fused = force them "
        "(needs torch_npu); eager = never (docs/accelerators.md)"
    )


ORDER = 40
SECTIONS = {"model": ModelParams}

STEPS = (
    Step("init-model", "write a random-init VoxCPM2 checkpoint (upstream layout) with its own small "
         "tokenizer", target="voxpipe.train.init_model:init_model", section="model",
         reads=("model.preset", "model.out", "model.seed", "model.dtype"),
         stage=Stage(
             outs=(Out("${model.out}"),),
             note="the random-init base model; a real checkpoint: set model.base to its folder "
                  "(docs/pipeline.md)")),
)

"""Fused Ascend kernels for the MiniCPM blocks and the `model.kernels` setting that turns them on.

The seed port's speed on Ascend came from three changes: torch_npu's fused `npu_rms_norm` and
`npu_swiglu` and RoPE kept in bf16. `model.kernels` decides them for every step that builds a
model: `auto` = all three on an NPU, the portable PyTorch code elsewhere; `fused` forces them
(torch_npu must be importable); `eager` never uses them. Once set, a block follows its switch
whatever device its tensors are on, so a test double put in place of torch_npu exercises the
very path an NPU runs. torch_npu is imported on first use only: importing it without CANN
breaks torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

import torch
from torch import nn

from voxpipe.errors import StepError

KernelsChoice = Literal["auto", "fused", "eager"]


@dataclass(frozen=True)
class NpuKernels:
    rms_norm: bool = False  # torch_npu.npu_rms_norm instead of the fp32 reference norm
    swiglu: bool = False  # torch_npu.npu_swiglu on the concatenated gate/up projections
    bf16_rope: bool = False  # rotate q/k in their own dtype instead of upcasting to fp32

    @classmethod
    def all(cls) -> NpuKernels:
        return cls(rms_norm=True, swiglu=True, bf16_rope=True)

    @property
    def label(self) -> str:
        """What the train report and the MLflow run record: 'fused' or 'eager'."""
        return "fused" if self == NpuKernels.all() else "eager" if self == OFF else repr(self)


OFF = NpuKernels()


def torch_npu() -> ModuleType:
    """torch_npu, imported on first use (sys.modules makes later calls a dict lookup)."""
    return importlib.import_module("torch_npu")


def resolve_kernels(choice: KernelsChoice, device: torch.device) -> NpuKernels:
    """The switches `model.kernels` means on `device`; `fused` without torch_npu is a StepError."""
    if choice == "eager" or (choice == "auto" and device.type != "npu"):
        return OFF
    if choice == "fused":
        try:
            torch_npu()
        except (ImportError, OSError, RuntimeError) as e:
            raise StepError(
                f"model.kernels is 'fused' but torch_npu cannot be imported here ({e}). The fused RMSNorm "
                "and SwiGLU kernels exist only on Ascend NPUs with CANN: set model.kernels to auto (fused "
                "on an NPU, eager elsewhere) or eager."
            ) from e
    return NpuKernels.all()


def use_npu_kernels(model: nn.Module, kernels: NpuKernels) -> None:
    """Set the switches on every block of `model` that reads them."""
    for module in model.modules():
        if hasattr(module, "npu_kernels"):
            module.npu_kernels = kernels


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch_npu().npu_rms_norm(x, weight.to(x.dtype), epsilon=eps)[0]


def fused_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """npu_swiglu splits its input in halves along `dim`: silu(first) * second."""
    return torch_npu().npu_swiglu(torch.cat((gate, up), dim=-1), dim=-1)

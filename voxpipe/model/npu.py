"""Fused Ascend kernels for the MiniCPM blocks, each behind its own switch.

The switches only act on tensors that live on an `npu` device; everywhere else the portable
PyTorch code runs and torch_npu is never imported (importing it without CANN breaks torch).
Turn them on for a whole model with `use_npu_kernels(model, NpuKernels(...))`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from types import ModuleType

import torch
from torch import nn


@dataclass(frozen=True)
class NpuKernels:
    rms_norm: bool = False  # torch_npu.npu_rms_norm instead of the fp32 reference norm
    swiglu: bool = False  # torch_npu.npu_swiglu on the concatenated gate/up projections
    bf16_rope: bool = False  # rotate q/k in their own dtype instead of upcasting to fp32

    @classmethod
    def all(cls) -> NpuKernels:
        return cls(rms_norm=True, swiglu=True, bf16_rope=True)


OFF = NpuKernels()


def use_npu_kernels(model: nn.Module, kernels: NpuKernels) -> None:
    """Set the switches on every block of `model` that reads them."""
    for module in model.modules():
        if hasattr(module, "npu_kernels"):
            module.npu_kernels = kernels


def on_npu(x: torch.Tensor) -> bool:
    return x.device.type == "npu"


@cache
def torch_npu() -> ModuleType:
    """Imported on first use only: a tensor on an npu device means the backend is already loaded."""
    return importlib.import_module("torch_npu")


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch_npu().npu_rms_norm(x, weight.to(x.dtype), epsilon=eps)[0]


def fused_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch_npu().npu_swiglu(torch.cat((gate, up), dim=-1), dim=-1)

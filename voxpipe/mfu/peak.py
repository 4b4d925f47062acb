"""Peak dense FLOP/s of one device: the denominator of MFU, always reported with where it came from.

Accelerators use a table of published dense bf16 peaks (no sparsity); a CPU has no meaningful
published figure, so its peak is measured here with square GEMMs in the training dtype. An
explicit override always wins.
"""

from __future__ import annotations

import functools
import importlib
import time

import torch

from voxpipe.errors import StepError

# (substring of the lower-cased device name, label, dense bf16 FLOP/s). First match wins, so the
# more specific names come first ("h200" before "h20", "h100 pcie" before "h100").
PEAK_TABLE: tuple[tuple[str, str, float], ...] = (
    # one Ascend 910B2 / one 910C die: 24 cube cores x 16^3 MAC x 2 FLOP x 1.8 GHz
    ("ascend910b2", "Ascend 910B2", 24 * 16**3 * 2 * 1.8e9),
    ("ascend910_939", "Ascend 910C die", 24 * 16**3 * 2 * 1.8e9),
    ("h200", "H200", 989e12),
    ("h100 pcie", "H100 PCIe", 756e12),
    ("h100", "H100 SXM", 989e12),
    ("h20", "H20", 148e12),
    ("a100", "A100", 312e12),
    ("mi300x", "MI300X", 1300e12),
    ("l40s", "L40S", 362e12),
)

CPU_GEMM_SIZE = 2048
CPU_GEMM_BUDGET_S = 1.5


class UnknownPeakError(StepError):
    """No table entry for an accelerator and no override: MFU cannot be stated honestly."""


def table_peak(device_name: str) -> tuple[float, str] | None:
    """(FLOP/s, source) from the table for a device name such as 'NVIDIA H200' or 'Ascend910B2'."""
    name = device_name.lower().replace("-", " ")
    for key, label, value in PEAK_TABLE:
        if key in name:
            return value, f"table: {label}"
    return None


def _dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return resolved


@functools.cache
def measure_cpu_gemm_peak(
    dtype: torch.dtype | str = torch.float32, threads: int | None = None, size: int = CPU_GEMM_SIZE
) -> float:
    """Best FLOP/s of square [size x size] matmuls on this CPU with `threads` torch threads.

    A CPU "device" is one training process, so its peak depends on the threads that process had
    (torchrun gives each rank one unless OMP_NUM_THREADS says otherwise); None = this process's.
    One warm-up, then repeats until the time budget is spent (at least two); the best run is the
    closest this machine gets to its peak for the dtype.
    """
    dtype = _dtype(dtype)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _best_gemm_rate(dtype, size)
    finally:
        torch.set_num_threads(before)


def _best_gemm_rate(dtype: torch.dtype, size: int) -> float:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(dtype)
    b = torch.randn(size, size, generator=gen).to(dtype)
    torch.mm(a, b)
    best = float("inf")
    spent = 0.0
    runs = 0
    while runs < 2 or spent < CPU_GEMM_BUDGET_S:
        start = time.perf_counter()
        torch.mm(a, b)
        took = time.perf_counter() - start
        best, spent, runs = min(best, took), spent + took, runs + 1
    return 2 * size**3 / best


def device_name(device: torch.device) -> str:
    """The accelerator's marketing name; torch_npu is imported only when an NPU is asked for."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "npu":
        importlib.import_module("torch_npu")
        return torch.npu.get_device_name(device.index or 0)
    return device.type


def peak_flops(
    device: torch.device | str,
    dtype: torch.dtype | str,
    override: float | None = None,
    cpu_threads: int | None = None,
) -> tuple[float, str]:
    """Peak FLOP/s of one device and where the figure came from.

    Priority: override > measured CPU GEMM (device cpu) > the table (bf16 dense peak, also used as
    the reference for other training dtypes, which the source then says).
    """
    if override is not None:
        if override <= 0:
            raise ValueError(f"peak override must be positive, got {override}")
        return float(override), "override"
    device = torch.device(device)
    dtype = _dtype(dtype)
    dtype_name = str(dtype).removeprefix("torch.")
    if device.type == "cpu":
        threads = cpu_threads or torch.get_num_threads()
        return measure_cpu_gemm_peak(dtype, threads), f"measured cpu gemm ({dtype_name}, {threads} threads)"
    return lookup_peak(device_name(device), dtype_name)


def lookup_peak(name: str, dtype_name: str = "bfloat16") -> tuple[float, str]:
    """Table peak for a device name; an unknown accelerator is an error naming the way out."""
    found = table_peak(name)
    if found is None:
        known = ", ".join(label for _, label, _ in PEAK_TABLE)
        raise UnknownPeakError(
            f"no peak FLOP/s known for device {name!r} (table: {known}); set mfu.peak_tflops"
        )
    value, source = found
    if dtype_name != "bfloat16":
        source += f" (bf16 peak; training dtype {dtype_name})"
    return value, source

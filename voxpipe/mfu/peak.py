"""Peak dense FLOP/s of one device: the denominator of MFU, always reported with where it came from.

Accelerators use a table of published dense bf16 peaks (no sparsity). A CPU has no published figure,
and a GEMM benchmark re-measured in every run is no denominator: on a shared machine it moves with the
load (three runs of one model at similar throughput read 8.3 %, 7.8 % and 17.4 % MFU), so a CPU's MFU
is null with the reason unless a recorded peak is given. An explicit override always wins.
`measure_cpu_gemm_peak` stays for the benchmarks (benchmarks/mfu_cpu.py), which report it as what it is.
"""

from __future__ import annotations

import functools
import importlib
import time

import torch

from voxpipe.errors import StepError


def _cann_peak(cube_cores: int, cube_ghz: float) -> float:
    """CANN's formula for an Ascend die: cube cores x 16^3 MAC per cycle x 2 FLOP x cube frequency."""
    return cube_cores * 16**3 * 2 * cube_ghz * 1e9


# 910B and 910C dies by the name torch.npu.get_device_name() reports. Inputs are the [SoCInfo]
# cube_core_cnt and [AICoreSpec] cube_freq of CANN's platform_config/<name>.ini. CANN's SoC
# table pairs each 910C die with a 910B class (9391/9392 ~ B1, 9381/9382 ~ B2, 9372 ~ B3,
# 9362 ~ B4); docs/accelerators.md says which inputs were read from an .ini and which inferred.
_B_24_CORES = _cann_peak(24, 1.8)  # Ascend910B2.ini: cube_freq=1800; 24 cube cores
_B3 = _cann_peak(20, 1.8)  # 20 cube cores at the B2's 1.8 GHz
_B4 = _cann_peak(20, 1.5)  # Ascend910B4.ini: cube_core_cnt=20, cube_freq=1500
ASCEND_SOURCE = "CANN formula cube cores x 16^3 x 2 x GHz"

# (substring of the lower-cased device name, label, dense bf16 FLOP/s, source). First match wins,
# so the more specific names come first ("h200" before "h20", "h100 pcie" before "h100").
PEAK_TABLE: tuple[tuple[str, str, float, str], ...] = (
    ("ascend910b1", "Ascend 910B1", _B_24_CORES, f"{ASCEND_SOURCE}: 24 x 1.8"),
    ("ascend910b2", "Ascend 910B2", _B_24_CORES, f"{ASCEND_SOURCE}: 24 x 1.8 (Ascend910B2.ini)"),
    ("ascend910b3", "Ascend 910B3", _B3, f"{ASCEND_SOURCE}: 20 x 1.8"),
    ("ascend910b4", "Ascend 910B4", _B4, f"{ASCEND_SOURCE}: 20 x 1.5 (Ascend910B4.ini)"),
    ("ascend910_9372", "Ascend 910C die (B3 class)", _B3, f"{ASCEND_SOURCE}: 20 x 1.8"),
    ("ascend910_9362", "Ascend 910C die (B4 class)", _B4, f"{ASCEND_SOURCE}: 20 x 1.5"),
    # 9391, 9392, 9381, 9382 (the port's die): 24 cube cores (Ascend910_9392.ini) at 1.8 GHz
    ("ascend910_93", "Ascend 910C die", _B_24_CORES, f"{ASCEND_SOURCE}: 24 x 1.8"),
    ("h200", "H200", 989e12, "NVIDIA H200 datasheet, dense BF16"),
    ("h100 pcie", "H100 PCIe", 756e12, "NVIDIA H100 datasheet, dense BF16"),
    ("h100", "H100 SXM", 989e12, "NVIDIA H100 datasheet, dense BF16"),
    ("h20", "H20", 148e12, "NVIDIA H20 datasheet, dense BF16"),
    ("a100", "A100", 312e12, "NVIDIA A100 datasheet, dense BF16"),
    ("mi300x", "MI300X", 1300e12, "AMD MI300X datasheet, dense BF16"),
    ("l40s", "L40S", 362e12, "NVIDIA L40S datasheet, dense BF16"),
)

CPU_GEMM_SIZE = 2048
CPU_GEMM_BUDGET_S = 1.5


CPU_NO_PEAK = (
    "a CPU has no recorded peak FLOP/s, and a GEMM benchmark re-measured in each run moves with the "
    "machine's load (on a shared machine one model's MFU read 8 % in one run and 17 % in another), so an "
    "MFU here would measure the neighbours; set mfu.peak_tflops (or train.peak_tflops) to this CPU's "
    "recorded peak for one. tokens/s is the run's speed figure"
)


class UnknownPeakError(StepError):
    """No table entry for an accelerator (or a CPU) and no override: MFU cannot be stated honestly."""


def table_peak(device_name: str) -> tuple[float, str] | None:
    """(FLOP/s, source) from the table for a device name such as 'NVIDIA H200' or 'Ascend910B2'."""
    name = device_name.lower().replace("-", " ")
    for key, label, value, source in PEAK_TABLE:
        if key in name:
            return value, f"table: {label} ({source})"
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
    dtype: torch.dtype | str = torch.float32, threads: int | None = None, size: int = CPU_GEMM_SIZE,
    budget_s: float = CPU_GEMM_BUDGET_S,
) -> float:
    """Best FLOP/s of square [size x size] matmuls on this CPU with `threads` torch threads.

    A CPU "device" is one training process, so its peak depends on the threads that process had
    (torchrun gives each rank one unless OMP_NUM_THREADS says otherwise); None = this process's.
    One warm-up, then repeats until `budget_s` is spent (at least two runs); the best run is the
    closest this machine gets to its peak for the dtype.
    """
    dtype = _dtype(dtype)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _best_gemm_rate(dtype, size, budget_s)
    finally:
        torch.set_num_threads(before)


def _best_gemm_rate(dtype: torch.dtype, size: int, budget_s: float) -> float:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(dtype)
    b = torch.randn(size, size, generator=gen).to(dtype)
    torch.mm(a, b)
    best = float("inf")
    spent = 0.0
    runs = 0
    while runs < 2 or spent < budget_s:
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
) -> tuple[float, str]:
    """Peak FLOP/s of one device and where the figure came from.

    Priority: override > the table (bf16 dense peak, also used as the reference for other training
    dtypes, which the source then says); a CPU without an override is an UnknownPeakError.
    """
    if override is not None:
        if override <= 0:
            raise ValueError(f"peak override must be positive, got {override}")
        return float(override), "override"
    device = torch.device(device)
    dtype = _dtype(dtype)
    dtype_name = str(dtype).removeprefix("torch.")
    if device.type == "cpu":
        raise UnknownPeakError(CPU_NO_PEAK)
    return lookup_peak(device_name(device), dtype_name)


def lookup_peak(name: str, dtype_name: str = "bfloat16") -> tuple[float, str]:
    """Table peak for a device name; an unknown accelerator is an error naming the way out."""
    found = table_peak(name)
    if found is None:
        known = ", ".join(label for _, label, _, _ in PEAK_TABLE)
        raise UnknownPeakError(
            f"no peak FLOP/s known for device {name!r} (table: {known}); set mfu.peak_tflops"
        )
    value, source = found
    if dtype_name != "bfloat16":
        source += f" (bf16 peak; training dtype {dtype_name})"
    return value, source

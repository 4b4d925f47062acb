"""Per-step speed figures: step time, data-wait fraction, tokens/s, samples/s, FLOPs, live MFU, memory.

`tokens` counts padded LM positions (what the hardware computed, the MFU convention of voxpipe.mfu);
`real_tokens` counts positions holding text or audio (the useful work, behind tokens/s, the run's one
speed figure: the train report's `tokens_per_s`). Everything is counted from the host batch (numpy,
never the device), and the counts of all ranks travel in the trainer's one all-reduce per step, so the
meter adds no device-to-host sync; nor does it synchronize the device: the step's one read bounds it,
and a step's optimizer kernels are paid by the next step's read (the same total over a run). Live MFU
needs a peak from the device table or `train.peak_tflops`; a CPU has none unless given (a GEMM benchmark
moves with the machine's load: voxpipe/mfu/peak.py), so its MFU is null.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from voxpipe.data.token_budget import TokenBudget
from voxpipe.errors import StepError
from voxpipe.mfu.flops import row_counts, training_flops
from voxpipe.mfu.peak import peak_flops
from voxpipe.model.config import VoxCPM2Config
from voxpipe.steps.train import TrainParams
from voxpipe.train.device import Runtime

GIB = 2**30


def _peak(rt: Runtime, dtype: torch.dtype, p: TrainParams) -> float | None:
    """FLOP/s of one device, or None when no honest figure is at hand."""
    if p.peak_tflops:
        return p.peak_tflops * 1e12
    if rt.device.type == "cpu":
        return None
    try:
        return peak_flops(rt.device, dtype)[0]
    except StepError:
        return None


def peak_memory(device: torch.device) -> tuple[float, str]:
    """(GiB, what was measured): the allocator's peak on an accelerator, the process's max RSS on CPU."""
    if device.type in ("cuda", "npu"):
        return getattr(torch, device.type).max_memory_allocated(device) / GIB, "max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB, "max RSS (process)"


def peak_memory_per_rank(rt: Runtime) -> dict[str, Any]:
    """Every rank's peak memory (collective: all ranks call it), for the train report."""
    gib, kind = peak_memory(rt.device)
    ranks: list[float] = [0.0] * rt.world_size
    dist.all_gather_object(ranks, round(gib, 3))
    return {"peak_memory_gib": max(ranks), "peak_memory_gib_per_rank": ranks, "peak_memory_kind": kind}


class Throughput:
    def __init__(self, config: VoxCPM2Config, dtype: torch.dtype, rt: Runtime, p: TrainParams):
        self.config = config
        self.rt = rt
        self.peak = _peak(rt, dtype, p)
        self._begin = 0.0
        self._wait = 0.0
        self._counts = [0.0, 0.0, 0.0, 0.0]  # padded tokens, real tokens, samples, flops
        self._shapes: list[list[int]] = []

    def start(self) -> None:
        self._begin = time.perf_counter()
        self._wait = 0.0
        self._counts = [0.0, 0.0, 0.0, 0.0]
        self._shapes = []

    def wait_for(self, fetch: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        t = time.perf_counter()
        batch = fetch()
        self._wait += time.perf_counter() - t
        return batch

    def count(self, batch: dict[str, torch.Tensor], rows: dict[str, torch.Tensor]) -> None:
        """One micro-batch still on the host, and the rows (`host_rows`) its encoder and DiT run on."""
        b, length = batch["text_tokens"].shape
        real = int(np.count_nonzero((batch["text_mask"].numpy() > 0) | (batch["audio_mask"].numpy() > 0)))
        counts = row_counts(rows)
        flops = training_flops(self.config, b, length, **counts)
        for i, value in enumerate((TokenBudget.cost(b, length), real, b, flops)):
            self._counts[i] += value
        self._shapes.append([b, length, counts["dit_rows"], counts["enc_rows"], counts["lm_rows"]])

    def counts(self) -> list[float]:
        """This rank's totals of the step, for the trainer's one all-reduce."""
        return list(self._counts)

    def finish(self, totals: Sequence[float]) -> dict[str, Any]:
        """The step's figures from the all-ranks `totals` (same order as `counts`)."""
        elapsed = time.perf_counter() - self._begin
        padded, real, samples, flops = totals
        per_device = flops / elapsed / self.rt.world_size
        memory, _ = peak_memory(self.rt.device)
        return {
            "step_time_s": elapsed,
            "data_wait_frac": self._wait / elapsed,
            "tokens": int(padded),
            "real_tokens": int(real),
            "samples": int(samples),
            "tokens_per_s": real / elapsed,
            "samples_per_s": samples / elapsed,
            "padding_frac": 1.0 - real / padded if padded else 0.0,
            "shapes": self._shapes,
            "flops": flops,
            "tflops_per_device": per_device / 1e12,
            "mfu": per_device / self.peak if self.peak else None,
            "memory/peak_gib": memory,  # this rank's (rank 0 logs); the report has every rank's
        }

"""Per-step speed figures: step time, data-wait fraction, tokens/s, samples/s, FLOPs and live MFU.

`tokens` counts padded LM positions (what the hardware computed, the MFU convention of
voxpipe.mfu); `real_tokens` counts positions holding text or audio (the useful work, behind
tokens/s). FLOPs come from voxpipe.mfu when it is installed; live MFU needs a peak from the
device table or `train.peak_tflops` (on CPU the `voxpipe mfu` step measures the peak instead,
so training does not spend seconds on a GEMM benchmark).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from voxpipe.errors import StepError
from voxpipe.model.config import VoxCPM2Config
from voxpipe.params import TrainParams
from voxpipe.train.device import Runtime


def _optional(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def _sync(device: torch.device) -> None:
    if device.type in ("cuda", "npu"):
        getattr(torch, device.type).synchronize(device)


def _peak(rt: Runtime, dtype: torch.dtype, p: TrainParams) -> float | None:
    """FLOP/s of one device, or None when no honest figure is at hand."""
    if p.peak_tflops:
        return p.peak_tflops * 1e12
    peak = _optional("voxpipe.mfu.peak")
    if peak is None or rt.device.type == "cpu":
        return None
    try:
        return peak.peak_flops(rt.device, dtype)[0]
    except StepError:
        return None


class Throughput:
    def __init__(self, config: VoxCPM2Config, dtype: torch.dtype, rt: Runtime, p: TrainParams):
        self.config = config
        self.rt = rt
        self.flops_model = _optional("voxpipe.mfu.flops")
        self.peak = _peak(rt, dtype, p)
        self._begin = 0.0
        self._wait = 0.0
        self._counts = [0.0, 0.0, 0.0, 0.0]  # padded tokens, real tokens, samples, flops
        self._shapes: list[list[int]] = []

    def start(self) -> None:
        _sync(self.rt.device)
        self._begin = time.perf_counter()
        self._wait = 0.0
        self._counts = [0.0, 0.0, 0.0, 0.0]
        self._shapes = []

    def wait_for(self, fetch: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        t = time.perf_counter()
        batch = fetch()
        self._wait += time.perf_counter() - t
        return batch

    def count(self, batch: dict[str, torch.Tensor]) -> None:
        b, length = batch["text_tokens"].shape
        real = int(((batch["text_mask"] > 0) | (batch["audio_mask"] > 0)).sum())
        flops, shape = 0.0, [b, length]
        if self.flops_model:
            dit_rows = self.flops_model.batch_dit_rows(batch)
            flops = self.flops_model.training_flops(self.config, b, length, dit_rows=dit_rows)
            shape.append(dit_rows)
        for i, value in enumerate((b * length, real, b, flops)):
            self._counts[i] += value
        self._shapes.append(shape)

    def finish(self, rt: Runtime) -> dict[str, Any]:
        _sync(rt.device)
        elapsed = time.perf_counter() - self._begin
        totals = torch.tensor(self._counts, dtype=torch.float64, device=rt.device)
        dist.all_reduce(totals)
        padded, real, samples, flops = totals.tolist()
        stats: dict[str, Any] = {
            "step_time_s": elapsed,
            "data_wait_frac": self._wait / elapsed,
            "tokens": int(padded),
            "real_tokens": int(real),
            "samples": int(samples),
            "tokens_per_s": real / elapsed,
            "samples_per_s": samples / elapsed,
            "padding_frac": 1.0 - real / padded if padded else 0.0,
            "shapes": self._shapes,
        }
        if self.flops_model:
            stats["flops"] = flops
            per_device = flops / elapsed / rt.world_size
            stats["tflops_per_device"] = per_device / 1e12
            stats["mfu"] = per_device / self.peak if self.peak else None
        return stats

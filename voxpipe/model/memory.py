"""Refuse a model that cannot fit before allocating it.

A config.json with a typo in hidden_size or num_hidden_layers asks for tens of GB; allocating it
makes the kernel's OOM killer end the step (no message) or swaps the host to a halt. The model is
built on the meta device (no memory) to count its parameters exactly, and the bytes they need
are compared with what the device has free.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from voxpipe.errors import StepError

GB = 1e9


class _NoRandomOnMeta(TorchFunctionMode):
    """No random numbers for meta tensors, which hold no values: initialisers do nothing, random factories
    make empty tensors. torch's meta `normal_` and `randn` are Python references whose first calls import
    torch._dynamo and sympy: 1-2 s of every process that builds a model on meta (evaluate, serve,
    synthesize, export), for nothing. Only inside `on_meta`, where every new tensor is a meta one; modes
    are per thread."""

    INITIALISERS = frozenset({"normal_", "uniform_", "trunc_normal_", "fill_", "zero_"})
    FACTORIES = frozenset({"randn", "rand"})

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 (torch's protocol)
        kwargs = kwargs or {}
        name = getattr(func, "__name__", None)
        target = args[0] if args else kwargs.get("tensor")  # torch.nn.init's pass it by name
        if name in self.INITIALISERS and isinstance(target, torch.Tensor) and target.is_meta:
            return target
        if name in self.FACTORIES and func.__module__ == "torch" and kwargs.get("device") in (None, "meta"):
            return torch.empty(*args, **{k: v for k, v in kwargs.items() if k != "generator"})
        return func(*args, **kwargs)


@contextmanager
def on_meta() -> Iterator[None]:
    """Build modules on the meta device: their shapes and dtypes, no memory, no initialisation."""
    with torch.device("meta"), _NoRandomOnMeta():
        yield


def parameter_bytes(build: Callable[[], nn.Module], dtype: torch.dtype = torch.float32) -> int:
    """Bytes the parameters of `build()` take in `dtype`, counted on the meta device."""
    with on_meta():
        model = build()
    size = torch.empty((), dtype=dtype).element_size()
    return sum(p.numel() for p in model.parameters()) * size


def _cgroup_free() -> int | None:
    """Memory left under this container's cgroup v2 limit, if it has one."""
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int((root / "memory.current").read_text())
    except (OSError, ValueError):
        return None


def available_bytes(device: torch.device) -> int | None:
    """Free memory on `device` (host RAM for cpu: MemAvailable, capped by the cgroup); None if unknown."""
    if device.type in ("cuda", "npu"):
        return int(getattr(torch, device.type).mem_get_info(device)[0])
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    free = next((int(line.split()[1]) * 1024 for line in meminfo.splitlines()
                 if line.startswith("MemAvailable:")), None)
    limit = _cgroup_free()
    return min(x for x in (free, limit) if x is not None) if free or limit else None


def ensure_fits(needed: int, device: torch.device, what: str, config: Path) -> None:
    """StepError naming the config when `needed` bytes exceed the free memory of `device`.

    On CPU every rank of this host draws on the same RAM, so the need is multiplied by the local
    world size (LOCAL_WORLD_SIZE under torchrun).
    """
    if device.type == "cpu":
        needed *= int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    free = available_bytes(device)
    if free is None or needed <= free:
        return
    raise StepError(
        f"{config}: {what} needs about {needed / GB:.1f} GB for its parameters alone, but {device} has "
        f"{free / GB:.1f} GB free; nothing was allocated. Check the sizes in config.json (hidden_size, "
        "intermediate_size, num_hidden_layers, vocab_size), or run on a larger device or more ranks"
    )

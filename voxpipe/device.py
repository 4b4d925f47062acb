"""Which device a step runs on: `auto` = an Ascend NPU if torch_npu sees one, else CUDA, else the CPU.

One rule for encode, train, evaluate and serving, below all of them (voxpipe/data does not import the
trainer for it). torch_npu is imported only here and only when probed: without CANN its import fails.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import torch

from voxpipe.errors import StepError

DeviceChoice = Literal["auto", "cpu", "cuda", "npu"]


def npu_available() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        importlib.import_module("torch_npu")
    except (ImportError, OSError, RuntimeError):
        return False
    return bool(torch.npu.is_available())


def resolve_device_type(choice: DeviceChoice) -> str:
    """The device type for a `device` param; a device asked for by name must be there."""
    if choice == "auto":
        if npu_available():
            return "npu"
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "npu" and not npu_available():
        raise StepError("device npu requested but torch_npu is not importable or no NPU is visible")
    if choice == "cuda" and not torch.cuda.is_available():
        raise StepError("device cuda requested but torch.cuda.is_available() is False")
    return choice


@contextmanager
def cpu_threads(device: torch.device, threads: int) -> Iterator[None]:
    """torch's intra-op thread count fixed at `threads` on the CPU (restored after): a result that depends
    on how a reduction was split (latents, generated audio) then never depends on the machine's core
    count. Accelerators keep their own."""
    if device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)

"""EMA weights beside the live ones (`train.ema_decay`): one more candidate for evaluate to judge.

F5-TTS ships its EMA weights, not the live ones: an average over the last ~1/(1-decay) steps is often the
better voice when the loss curve is noisy. The EMA keeps a copy of each trainable parameter's *local
shard* (FSDP2 DTensors: the copy is a DTensor on the same mesh and placements, so DCP saves each rank's
shard once and a resume restores it), in the parameters' own (fp32 master) dtype; with LoRA only the
adapters are trainable, so only they are copied. After every optimizer step that updated the weights:
`ema = ema + (1 - decay) * (live - ema)`, one `torch._foreach_lerp_` over the local shards, no
communication. `voxpipe plan` counts the copy (voxpipe/train/plan.py).

An export of the EMA swaps it into the model one tensor at a time (no second copy of the model) and
back, so the export code path is the live export's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.distributed.tensor import DTensor

EMA_SUFFIX = "-ema"  # exports/step-N-ema/ beside exports/step-N/


def _local(t: torch.Tensor) -> torch.Tensor:
    """The rank's shard of a DTensor (a view: writing it writes the DTensor), a plain tensor as it is."""
    return t.to_local() if isinstance(t, DTensor) else t


class EMA:
    """The exponential moving average of the trainable parameters, sharded like them."""

    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        with torch.no_grad():
            self.shadow = {name: p.detach().clone() for name, p in self.named}

    @torch.no_grad()
    def update(self) -> None:
        """One step of the average, on each rank's local shards."""
        live = [_local(p.detach()) for _, p in self.named]
        torch._foreach_lerp_([_local(self.shadow[name]) for name, _ in self.named], live, 1.0 - self.decay)

    @torch.no_grad()
    def reset_to_live(self) -> None:
        """Start the average from the live weights (a checkpoint saved before EMA was on)."""
        for name, p in self.named:
            _local(self.shadow[name]).copy_(_local(p.detach()))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The shards by parameter name, for DCP (saved and loaded in place)."""
        return self.shadow

    def local_bytes(self) -> int:
        """This rank's bytes of the EMA copy (what a checkpoint grows by)."""
        return sum(_local(t).numel() * _local(t).element_size() for t in self.shadow.values())

    @torch.no_grad()
    def _swap(self) -> None:
        for name, p in self.named:
            live, ema = _local(p.detach()), _local(self.shadow[name])
            held = live.clone()  # one tensor at a time: never a second copy of the model
            live.copy_(ema)
            ema.copy_(held)

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The model holds the EMA weights inside the block (the live ones come back after it, exactly)."""
        self._swap()
        try:
            yield
        finally:
            self._swap()

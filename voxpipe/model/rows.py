"""Which positions of a right-padded [B, T] training batch each tower of VoxCPM2 computes.

The losses read the LMs only just before a loss row: the DiT's condition and the stop logit of row t
come from the LMs' outputs at t-1. Both LMs are causal, so in each sequence the positions after its
last loss row's predecessor (padding, the final patch, the end token) can change no loss and are not
computed at all (`lm_rows`); the residual LM returns only the outputs the DiT reads (`loss_prev`).
The local encoder runs on the audio rows among them, the local DiT on the loss rows. Upstream runs
every tower on all B*T positions; the losses are the same.

Indices are flat (into B*T) unless named slots (into `lm_rows`). Every set has at least one entry, so
each FSDP-sharded tower still runs on every rank, whose collectives need all ranks.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch


class RowPlan(NamedTuple):
    lm_rows: torch.Tensor  # [N] positions the base and residual LMs compute, sorted
    audio_rows: torch.Tensor  # [A] audio positions among them: the local encoder's rows
    audio_slots: torch.Tensor  # [A] where each of those sits among the N
    loss_rows: torch.Tensor  # [L] positions with loss weight: the local DiT's rows
    loss_prev: torch.Tensor  # [L] slot of the position before each; -1 at a sequence's start (zeros)


def _host(mask: torch.Tensor) -> np.ndarray:
    mask = mask.detach()
    return (mask if mask.device.type == "cpu" else mask.cpu()).numpy() > 0


def _nonzero_or_first(mask: np.ndarray) -> np.ndarray:
    rows = np.flatnonzero(mask)
    return rows if rows.size else np.zeros(1, dtype=np.int64)


def plan_rows(audio_mask: torch.Tensor, loss_mask: torch.Tensor) -> RowPlan:
    """The plan of a batch's [B, T] masks, on the masks' device. Planning reads the masks on the host:
    from a device that is a sync, so the trainer plans on its host batch instead (`host_rows`)."""
    audio, weighted = _host(audio_mask), _host(loss_mask)
    t = weighted.shape[1]
    positions = np.arange(t)
    last_loss = np.where(weighted, positions, -1).max(axis=1, keepdims=True)
    lm_mask = (positions < last_loss).reshape(-1)
    loss_rows = _nonzero_or_first(weighted.reshape(-1))
    lm_rows = _nonzero_or_first(lm_mask)
    lm_mask[lm_rows] = True  # the fallback row, when no sequence has a loss row after its start
    slots = np.cumsum(lm_mask) - 1
    audio_rows = np.flatnonzero(audio.reshape(-1) & lm_mask)
    if not audio_rows.size:
        audio_rows = lm_rows[:1]  # its encoding is multiplied by a zero audio weight
    loss_prev = np.where(loss_rows % t == 0, -1, slots[np.maximum(loss_rows - 1, 0)])
    plan = (lm_rows, audio_rows, slots[audio_rows], loss_rows, loss_prev)
    return RowPlan(*(torch.from_numpy(x.astype(np.int64)).to(loss_mask.device) for x in plan))


def host_rows(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The plan of a batch still in host memory, as keyword arguments of `VoxCPM2.forward`: moved to
    the device with the batch, it spares the forward its device-to-host syncs."""
    return plan_rows(batch["audio_mask"], batch["loss_mask"])._asdict()

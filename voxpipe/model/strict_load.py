"""The one key/shape comparison behind every strict weight load.

Upstream loads with strict=False and so hides mismatched checkpoints; we list every missing,
unexpected and misshaped key instead, for the LM weights and the AudioVAE alike.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def mismatches(own: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor]) -> list[str]:
    """Lines naming each missing, unexpected and wrong-shape key; empty when `state` fits `own`."""
    missing = sorted(own.keys() - state.keys())
    unexpected = sorted(state.keys() - own.keys())
    misshaped = sorted(
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own.keys() & state.keys()
        if state[k].shape != own[k].shape
    )
    return [
        f"  {title} ({len(keys)}): " + ", ".join(keys)
        for title, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", misshaped))
        if keys
    ]

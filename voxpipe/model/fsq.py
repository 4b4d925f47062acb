"""Finite scalar quantisation bottleneck between the base LM and the residual LM."""

from __future__ import annotations

import torch
from torch import nn


class ScalarQuantizer(nn.Module):
    """Project down, squash with tanh, round to `scale` levels per side, project back up.

    Training passes gradients straight through the rounding; eval rounds hard (same values).
    """

    def __init__(self, in_dim: int, out_dim: int, latent_dim: int, scale: int):
        super().__init__()
        self.scale = scale
        self.in_proj = nn.Linear(in_dim, latent_dim)
        self.out_proj = nn.Linear(latent_dim, out_dim)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        latent = torch.tanh(self.in_proj(hidden.to(self.in_proj.weight.dtype)))
        quantized = torch.round(latent * self.scale) / self.scale
        if self.training:
            quantized = latent + (quantized - latent).detach()
        return self.out_proj(quantized)

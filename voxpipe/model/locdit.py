"""Local diffusion transformer: predicts the velocity of one patch of latent frames.

The bidirectional sequence is [LM conditions (mu), time token, previous patch (cond), noisy
patch (x)]; only the noisy-patch positions are read out, and the last layer computes only those.
`mu` holds one or more condition vectors per row (VoxCPM2 concatenates the base-LM and residual-LM
projections).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from voxpipe.model.config import MiniCPM4Config
from voxpipe.model.minicpm import MiniCPMModel


def timestep_embedding(t: torch.Tensor, dim: int, scale: float = 1000.0) -> torch.Tensor:
    """Sinusoidal embedding [N, dim] of diffusion times t ([N] or scalar), computed in t's dtype."""
    t = t.reshape(-1)
    half = dim // 2
    freqs = torch.exp(torch.arange(half, dtype=t.dtype, device=t.device) * -(math.log(10000) / (half - 1)))
    angles = scale * t.unsqueeze(1) * freqs.unsqueeze(0)
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


class TimestepMLP(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(dim, dim, bias=True)
        self.linear_2 = nn.Linear(dim, dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(nn.functional.silu(self.linear_1(x)))


class LocalDiT(nn.Module):
    def __init__(self, config: MiniCPM4Config, in_channels: int):
        super().__init__()
        if config.vocab_size != 0:
            raise ValueError("the local DiT stack takes no tokens: vocab_size must be 0")
        if config.hidden_size % 2:
            raise ValueError(f"DiT hidden size {config.hidden_size} must be even for the time embedding")
        hidden = config.hidden_size
        self.in_channels = in_channels
        self.hidden_size = hidden
        self.in_proj = nn.Linear(in_channels, hidden, bias=True)
        self.cond_proj = nn.Linear(in_channels, hidden, bias=True)
        self.out_proj = nn.Linear(hidden, in_channels, bias=True)
        self.time_mlp = TimestepMLP(hidden)
        self.delta_time_mlp = TimestepMLP(hidden)
        self.decoder = MiniCPMModel(config)

    def forward(
        self, x: torch.Tensor, mu: torch.Tensor, t: torch.Tensor, cond: torch.Tensor, dt: torch.Tensor
    ) -> torch.Tensor:
        """x [N, C, P] noisy patch, mu [N, k*hidden], t/dt [N] (or scalar), cond [N, C, P'] -> [N, C, P]."""
        dtype = self.in_proj.weight.dtype
        x = self.in_proj(x.transpose(1, 2).to(dtype))
        cond = self.cond_proj(cond.transpose(1, 2).to(dtype))
        time = self.time_mlp(timestep_embedding(t, self.hidden_size).to(x.dtype))
        time = time + self.delta_time_mlp(timestep_embedding(dt, self.hidden_size).to(x.dtype))
        mu = mu.reshape(x.size(0), -1, self.hidden_size)
        prefix = mu.size(1) + 1 + cond.size(1)
        # one dtype for the sequence: the parameters' (under autocast, pieces arrive in mixed dtypes)
        parts = (mu, time.expand(x.size(0), -1).unsqueeze(1), cond, x)
        seq = torch.cat([part.to(dtype) for part in parts], dim=1)
        hidden = self.decoder(seq, is_causal=False, read=slice(prefix, None))
        return self.out_proj(hidden).transpose(1, 2)

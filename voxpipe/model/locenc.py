"""Local encoder: summarises each patch of latent frames into one LM-width vector.

Every patch [P, D] becomes a short sequence [special token, P projected frames] run through a
bidirectional MiniCPM stack; the special token's output is the patch embedding, and the last layer
computes only that position.
"""

from __future__ import annotations

import torch
from torch import nn

from voxpipe.model.config import MiniCPM4Config
from voxpipe.model.minicpm import MiniCPMModel


class LocalEncoder(nn.Module):
    def __init__(self, config: MiniCPM4Config, input_dim: int):
        super().__init__()
        if config.vocab_size != 0:
            raise ValueError("the local encoder stack takes no tokens: vocab_size must be 0")
        self.special_token = nn.Parameter(torch.randn(1, 1, 1, config.hidden_size))
        self.in_proj = nn.Linear(input_dim, config.hidden_size, bias=True)
        self.encoder = MiniCPMModel(config)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """patches [B, T, P, D] -> patch embeddings [B, T, hidden]."""
        b, t, p, _ = patches.shape
        frames = self.in_proj(patches.to(self.in_proj.weight.dtype))
        special = self.special_token.expand(b, t, 1, -1)
        seq = torch.cat((special, frames.to(special.dtype)), dim=2).reshape(b * t, p + 1, -1)
        return self.encoder(seq, is_causal=False, read=slice(0, 1))[:, 0].reshape(b, t, -1)

"""VoxCPM2's generation as a rolling batch: rows join between patches and leave when they stop.

Each row is one text's prompt (upstream's layout: [103, ref patches, 104,] text ids, 101) with its own
limits, guidance, Euler steps, random generator and check. Rows that join together are prefilled as one
left-padded batch; their KV caches are then placed beside the running rows', right-aligned so that every
row's next token lands in the same slot (the padding before a row is masked out, as a left-padded prompt's
is). A row leaves as soon as its stop head fires, it reaches its max_len, or its check raises (its request's
deadline passed, its client left); its cache rows go with it. `VoxCPM2.generate` is one batch joined at once
and run until every row has left; `voxpipe serve`'s batcher (voxpipe/serve/batcher.py) joins rows as
requests arrive.

A row's patches do not depend on its batch-mates: its noise comes from its own generator, its guidance,
limits and Euler steps are its own, and masked padding adds exact zeros (the sums' order may differ: float
rounding).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from voxpipe.model.minicpm import KVCache


@dataclass
class Prompt:
    """One generation prompt, upstream layout: [103, ref patches, 104,] text ids, 101."""

    tokens: torch.Tensor  # [L] long
    feats: torch.Tensor  # [L, P, D]
    text_mask: torch.Tensor  # [L]
    audio_mask: torch.Tensor  # [L]


@dataclass
class Row:
    prompt: Prompt
    max_len: int = 2000  # patches at most
    min_len: int = 2  # the stop head is read only after this many
    cfg_value: float = 2.0
    inference_timesteps: int = 10  # the DiT's Euler steps per patch
    generator: torch.Generator | None = None  # None: the global RNG
    check: Callable[[], None] | None = None  # called before each patch; what it raises ends the row
    owner: Any = None  # whatever the caller knows the row by
    patches: list[torch.Tensor] = field(default_factory=list)


@dataclass
class Finished:
    row: Row
    patches: torch.Tensor | None  # [n, P, D] fp32, up to and including the patch where the stop fired
    hit_limit: bool  # no stop within max_len
    error: Exception | None = None  # what the row's check raised (then patches is None)


def _left_pad(x: torch.Tensor, length: int) -> torch.Tensor:
    return F.pad(x, (0, 0) * (x.dim() - 1) + (length - x.size(0), 0))


class RollingBatch:
    """The running rows, and what they carry from one patch to the next (caches, hidden states, the last
    patch)."""

    def __init__(self, model: torch.nn.Module) -> None:  # a VoxCPM2 (which imports this module)
        self.model = model
        self.rows: list[Row] = []
        self.base: KVCache | None = None
        self.residual: KVCache | None = None
        self.lm_hidden = self.residual_hidden = self.previous = torch.empty(0)

    def __len__(self) -> int:
        return len(self.rows)

    @torch.inference_mode()
    def join(self, rows: list[Row]) -> None:
        """Prefill the rows' prompts (one left-padded batch) and place them beside the running rows."""
        if not rows:
            return
        m = self.model
        device, dtype = m.enc_to_lm_proj.weight.device, m._compute_dtype()
        longest = max(r.prompt.tokens.numel() for r in rows)

        def stacked(name: str) -> torch.Tensor:
            return torch.stack([_left_pad(getattr(r.prompt, name), longest) for r in rows]).to(device)

        tokens, text_mask, audio_mask = stacked("tokens"), stacked("text_mask"), stacked("audio_mask")
        feats = stacked("feats").to(dtype)
        valid = torch.stack([_left_pad(torch.ones(r.prompt.tokens.numel(), dtype=torch.bool), longest)
                             for r in rows]).to(device)
        text_w, audio_w = text_mask.to(dtype).unsqueeze(-1), audio_mask.to(dtype).unsqueeze(-1)
        embed, feat_embed = m._embed(tokens, feats, text_w, audio_w)
        base = m.base_lm.new_cache(longest)
        enc = m.base_lm(embed, attention_mask=valid, cache=base)
        enc = m.fsq_layer(enc) * audio_w + enc * text_w
        residual = m.residual_lm.new_cache(longest)
        residual_in = m.fusion_concat_proj(torch.cat((enc, audio_w * feat_embed), dim=-1))
        residual_out = m.residual_lm(residual_in, attention_mask=valid, cache=residual)

        everyone = [*self.rows, *rows]
        room = max(r.max_len - len(r.patches) for r in everyone)  # tokens each row may still add
        running = self.base is not None and bool(self.rows)
        self.base = KVCache.beside([self.base, base] if running else [base], room)
        self.residual = KVCache.beside([self.residual, residual] if running else [residual], room)
        new = (enc[:, -1], residual_out[:, -1], feats[:, -1].float())
        old = (self.lm_hidden, self.residual_hidden, self.previous)
        self.lm_hidden, self.residual_hidden, self.previous = (
            torch.cat((o, n)) if running else n for o, n in zip(old, new, strict=True))
        self.rows = everyone

    @torch.inference_mode()
    def step(self) -> list[Finished]:
        """One patch for every running row; the rows that stop, reach their limit or fail leave."""
        out: list[Finished] = []
        failed = []
        for i, row in enumerate(self.rows):
            try:
                if row.check is not None:
                    row.check()
            except Exception as e:  # noqa: BLE001 - the row's own end (deadline, client gone): it leaves
                out.append(Finished(row, None, False, e))
                failed.append(i)
        if failed:
            self._leave(failed)
        if not self.rows:
            return out
        m = self.model
        mu = torch.cat((m.lm_to_dit_proj(self.lm_hidden), m.res_to_dit_proj(self.residual_hidden)), dim=-1)
        cfg = torch.tensor([r.cfg_value for r in self.rows])
        patch = m.feat_decoder.sample(
            mu, [r.inference_timesteps for r in self.rows], m.patch_size, self.previous.transpose(1, 2),
            cfg_value=cfg, generator=[r.generator for r in self.rows],
        ).transpose(1, 2)  # [B, P, D]
        stops = (m._stop_logits(self.lm_hidden).argmax(dim=-1) == 1).tolist()
        ended = []
        for i, (row, stop) in enumerate(zip(self.rows, stops, strict=True)):
            row.patches.append(patch[i])
            made = len(row.patches)
            stopped = stop and made - 1 > row.min_len
            if stopped or made >= row.max_len:
                out.append(Finished(row, torch.stack(row.patches), not stopped))
                ended.append(i)
        if ended:
            kept = self._leave(ended)
            if kept is None:
                return out
            patch = patch.index_select(0, kept)
        patch_embed = m.enc_to_lm_proj(m.feat_encoder(patch.unsqueeze(1)))  # [B, 1, H]
        self.lm_hidden = m.fsq_layer(m.base_lm(patch_embed, cache=self.base)[:, 0])
        residual_in = m.fusion_concat_proj(torch.cat((self.lm_hidden, patch_embed[:, 0]), dim=-1))
        self.residual_hidden = m.residual_lm(residual_in.unsqueeze(1), cache=self.residual)[:, 0]
        self.previous = patch
        return out

    def _leave(self, gone: list[int]) -> torch.Tensor | None:
        """The rows `gone` leave with their caches; returns the kept rows' indices (None: none left)."""
        kept = [i for i in range(len(self.rows)) if i not in set(gone)]
        self.rows = [self.rows[i] for i in kept]
        if not kept:
            self.base = self.residual = None
            return None
        index = torch.tensor(kept, device=self.lm_hidden.device)
        self.base.keep(index)
        self.residual.keep(index)
        self.lm_hidden, self.residual_hidden, self.previous = (
            x.index_select(0, index) for x in (self.lm_hidden, self.residual_hidden, self.previous))
        return index

    def run(self, rows: list[Row]) -> list[Finished]:
        """Every row joined at once, stepped until each has left; in the rows' order."""
        self.join(rows)
        done: dict[int, Finished] = {}
        while self.rows:
            for f in self.step():
                done[id(f.row)] = f
        return [done[id(r)] for r in rows]

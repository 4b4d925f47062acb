"""The assembled VoxCPM2: training loss on the upstream batch contract, and batched generation.

Submodule names equal upstream's checkpoint keys (`base_lm`, `residual_lm`, `feat_encoder`,
`feat_decoder`, `fsq_layer`, the projections, `stop_*`) so weights move both ways unchanged.
The AudioVAE and the tokenizer are attached helpers, not submodules: the trained state dict
(and model.safetensors) never contains the frozen VAE.

Unlike upstream the forward never casts to a config dtype: inputs follow the parameters' dtype
(fp32, bf16 under FSDP2 mixed precision, or whatever autocast picks) and both losses are fp32.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from voxpipe.model.cfm import ConditionalFlowMatching
from voxpipe.model.config import (
    AUDIO_START_ID,
    REF_AUDIO_END_ID,
    REF_AUDIO_START_ID,
    VoxCPM2Config,
)
from voxpipe.model.fsq import ScalarQuantizer
from voxpipe.model.locdit import LocalDiT
from voxpipe.model.locenc import LocalEncoder
from voxpipe.model.minicpm import MiniCPMModel, Packed
from voxpipe.model.rolling import Prompt, RollingBatch, Row
from voxpipe.model.rows import RowPlan, plan_rows

DECODE_BUCKET = 8  # patches (1.28 s): the lengths a row's latents are decoded at (`VoxCPM2.decode`)


def decode_patches(vae: nn.Module, patches: torch.Tensor, patch_size: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """A row's patches [n, P, D] -> (mono waveform at the VAE's output rate, latents [D, n * P]), on the
    CPU: `VoxCPM2.decode`, and voxpipe serve's finishing processes with their own copy of the VAE.

    The latents are decoded right-padded with zeros to a multiple of DECODE_BUCKET patches, and the
    audio cut back to the row's: the decoder is causal, so the padding never changes the samples kept,
    and rows of every length share a few shapes. Each new shape cost the CPU's convolutions (oneDNN) a
    first call 4-7 times slower than the next, which made decoding, not generation, the bulk of a
    batch's time."""
    vae_device = next(vae.parameters()).device
    n = patches.size(0)
    with torch.inference_mode():
        z = patches.permute(2, 0, 1).reshape(patches.size(2), -1)  # [D, n * P]
        padded = F.pad(z, (0, (-n % DECODE_BUCKET) * patch_size))
        audio = vae.decode(padded.unsqueeze(0).float().to(vae_device))[0, 0].float().cpu()
    return audio[: z.size(1) * vae.decode_hop_length], z.cpu()


def _shift_right(x: torch.Tensor) -> torch.Tensor:
    """Along dim 1: position t sees what position t-1 produced (zeros at t=0)."""
    return torch.cat((torch.zeros_like(x[:, :1]), x[:, :-1]), dim=1)


@dataclass
class GeneratedSpeech:
    audio: list[torch.Tensor]  # mono float32 waveform per text, at `sample_rate`
    latents: list[torch.Tensor]  # [feat_dim, frames] per text: what the VAE decoded
    hit_length_limit: list[bool]  # True where no stop was predicted within max_len (a stop failure)
    sample_rate: int


class VoxCPM2(nn.Module):
    """Base LM -> FSQ -> residual LM -> local DiT per patch, plus the stop head (docs/accelerators.md)."""

    def __init__(self, config: VoxCPM2Config):
        super().__init__()
        self.config = config
        self.patch_size = config.patch_size
        self.feat_dim = config.feat_dim
        lm = config.lm_config
        hidden = lm.hidden_size
        self.base_lm = MiniCPMModel(lm)
        self.residual_lm = MiniCPMModel(config.residual_lm_config())
        self.feat_encoder = LocalEncoder(config.encoder_lm_config(), input_dim=config.feat_dim)
        dit = config.dit_config
        self.feat_decoder = ConditionalFlowMatching(
            config.feat_dim,
            dit.cfm_config,
            LocalDiT(config.dit_lm_config(), in_channels=config.feat_dim),
            mean_mode=dit.dit_mean_mode,
        )
        self.fsq_layer = ScalarQuantizer(
            hidden, hidden, config.scalar_quantization_latent_dim, config.scalar_quantization_scale
        )
        self.enc_to_lm_proj = nn.Linear(config.encoder_config.hidden_dim, hidden)
        self.lm_to_dit_proj = nn.Linear(hidden, dit.hidden_dim)
        self.res_to_dit_proj = nn.Linear(hidden, dit.hidden_dim)
        self.fusion_concat_proj = nn.Linear(2 * hidden, hidden)
        self.stop_proj = nn.Linear(hidden, hidden)
        self.stop_head = nn.Linear(hidden, 2, bias=False)
        # muP scales token embeddings here, not inside the decoder stack (as upstream does)
        self.embed_scale = lm.scale_emb if lm.use_mup else 1.0
        self.audio_vae: Any = None
        self.tokenizer: Any = None

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "audio_vae":  # a helper, never a submodule: the trained state dict excludes the VAE
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def attach(self, audio_vae: nn.Module | None = None, tokenizer: Any = None) -> VoxCPM2:
        """Give generation its VAE and tokenizer (the VAE stays out of the state dict)."""
        if audio_vae is not None:
            self.audio_vae = audio_vae
        if tokenizer is not None:
            self.tokenizer = tokenizer
        return self

    def layers_to_shard(self) -> list[nn.Module]:
        """Every transformer block (base LM, residual LM, local encoder, local DiT): FSDP2 shards each."""
        stacks = (
            self.base_lm, self.residual_lm, self.feat_encoder.encoder, self.feat_decoder.estimator.decoder
        )
        return [layer for stack in stacks for layer in stack.layers]

    # -- shared pieces of training and generation -------------------------------------------------
    def _compute_dtype(self) -> torch.dtype:
        # a root-owned parameter: under FSDP2 it is already cast to param_dtype during forward
        return self.enc_to_lm_proj.weight.dtype

    def _embed_text(self, tokens: torch.Tensor) -> torch.Tensor:
        text_embed = self.base_lm.embed_tokens(tokens.long())
        return text_embed * self.embed_scale if self.embed_scale != 1.0 else text_embed

    def _embed(
        self, tokens: torch.Tensor, feats: torch.Tensor, text_w: torch.Tensor, audio_w: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """LM input (text embedding or patch embedding per position) and the patch embeddings."""
        feat_embed = self.enc_to_lm_proj(self.feat_encoder(feats))
        return text_w * self._embed_text(tokens) + audio_w * feat_embed, feat_embed

    def _stop_logits(self, lm_hidden: torch.Tensor) -> torch.Tensor:
        return self.stop_head(F.silu(self.stop_proj(lm_hidden)))

    # -- training -------------------------------------------------------------------------------
    def forward(
        self,
        text_tokens: torch.Tensor,
        text_mask: torch.Tensor,
        audio_feats: torch.Tensor,
        audio_mask: torch.Tensor,
        loss_mask: torch.Tensor,
        position_ids: torch.Tensor,
        labels: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        cond_dropout: bool = True,
        progress: float = 0.0,
        lm_rows: torch.Tensor | None = None,
        audio_rows: torch.Tensor | None = None,
        audio_slots: torch.Tensor | None = None,
        loss_rows: torch.Tensor | None = None,
        loss_prev: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Flow-matching and stop losses (fp32 scalars) for a right-padded batch.

        Shapes: tokens/masks/labels [B, T], audio_feats [B, T, P, D]. Like upstream, positions
        are 0..T-1 and padding needs no attention mask: it only ever follows the real tokens, and
        the LMs are causal while the local encoder/DiT never mix patches. `position_ids` is
        accepted for the batch contract only. Random draws (condition dropout, t, noise) come
        from `generator` when given, else from the global RNG in upstream's order.

        Work not done (voxpipe/model/rows.py): each tower computes only the positions the losses
        read. `lm_rows` ... `loss_prev` are that plan (`host_rows` of the host batch); None = planned
        here from the masks, a device-to-host sync each on an accelerator.
        """
        del position_ids
        given = (lm_rows, audio_rows, audio_slots, loss_rows, loss_prev)
        if all(x is None for x in given):
            plan = plan_rows(audio_mask, loss_mask)
        elif any(x is None for x in given):
            raise ValueError("the row plan is all five of lm_rows ... loss_prev (host_rows), or none of them")
        else:
            plan = RowPlan(*given)
        dtype = self._compute_dtype()
        b, t, p, d = audio_feats.shape
        feats = audio_feats.to(dtype).reshape(b * t, p, d)
        text_w = text_mask.reshape(-1).index_select(0, plan.lm_rows).to(dtype).unsqueeze(-1)  # [N, 1]
        audio_w = audio_mask.reshape(-1).index_select(0, plan.lm_rows).to(dtype).unsqueeze(-1)

        patches = feats.index_select(0, plan.audio_rows).unsqueeze(0)  # [1, A, P, D]
        encoded = self.enc_to_lm_proj(self.feat_encoder(patches))[0]
        feat_embed = encoded.new_zeros(plan.lm_rows.numel(), encoded.size(-1)).index_copy(
            0, plan.audio_slots, encoded
        )  # [N, H]: zeros off audio rows, which their zero audio weight would multiply away
        text_embed = self._embed_text(text_tokens.reshape(-1).index_select(0, plan.lm_rows))
        packed = Packed(b, t, plan.lm_rows)
        enc = self.base_lm(text_w * text_embed + audio_w * feat_embed, packed=packed)
        enc = self.fsq_layer(enc) * audio_w + enc * text_w
        # the LMs' outputs just before each loss row (zeros at a sequence's start, as a shift right gives)
        at_start = (plan.loss_prev < 0).unsqueeze(-1)
        before = plan.loss_prev.clamp(min=0)
        residual_in = self.fusion_concat_proj(torch.cat((enc, audio_w * feat_embed), dim=-1))
        residual_hidden = self.residual_lm(residual_in, packed=packed, read=before).masked_fill(at_start, 0.0)
        lm_hidden = enc.index_select(0, before).masked_fill(at_start, 0.0)  # [L, H]

        mu = torch.cat((self.lm_to_dit_proj(lm_hidden), self.res_to_dit_proj(residual_hidden)), dim=-1)
        target = feats.transpose(1, 2)
        previous = _shift_right(feats.view(b, t, p, d)).reshape(b * t, p, d).transpose(1, 2)
        weights = loss_mask.float().reshape(-1)
        diff_loss = self.feat_decoder(
            target.contiguous(),
            mu,
            cond=previous.contiguous(),
            tgt_mask=weights.view(b * t, 1, 1).expand(b * t, 1, p),
            progress=progress,
            generator=generator,
            cond_dropout=cond_dropout,
            rows=plan.loss_rows,
        )

        stop_logits = self._stop_logits(lm_hidden).float()
        stop_labels = labels.reshape(-1).index_select(0, plan.loss_rows).long()
        stop_losses = F.cross_entropy(stop_logits, stop_labels, reduction="none")
        stop_weights = weights.index_select(0, plan.loss_rows)
        stop_loss = (stop_losses * stop_weights).sum() / weights.sum().clamp(min=1.0)
        return {"loss/diff": diff_loss, "loss/stop": stop_loss}

    # -- generation (the decoding loop: voxpipe/model/rolling.py) -----------------------------------
    def _reference_patches(self, reference: Any) -> torch.Tensor:
        """16 kHz waveform [N] -> VAE latent patches [R, P, D]; latents [D, frames] / patches pass through."""
        ref = reference if isinstance(reference, torch.Tensor) else torch.from_numpy(np.asarray(reference))
        p, d = self.patch_size, self.feat_dim
        if ref.dim() == 3:
            patches = ref
        elif ref.dim() == 2:
            if ref.size(0) != d or ref.size(1) % p:
                raise ValueError(f"reference latents must be [{d}, frames] with frames a multiple of {p}")
            patches = ref.reshape(d, -1, p).permute(1, 2, 0)
        elif ref.dim() == 1:
            vae = self._require("audio_vae")
            wav = vae.pad_to_multiple(ref.float().reshape(1, 1, -1), p)  # right pad like upstream
            vae_device = next(vae.parameters()).device
            with torch.inference_mode():
                latents = vae.encode(wav.to(vae_device), vae.sample_rate)[0]
            patches = latents.reshape(d, -1, p).permute(1, 2, 0)
        else:
            raise ValueError(f"reference must be a waveform [N], latents [D, T] or patches [R, P, D]; "
                             f"got shape {tuple(ref.shape)}")
        if tuple(patches.shape[1:]) != (p, d):
            raise ValueError(f"reference patches must be [R, {p}, {d}], got {tuple(patches.shape)}")
        return patches.float()

    def _prompt(self, ids: list[int], reference: Any, continued: bool = False) -> Prompt:
        """continued: `ids` begin with the reference clip's transcript, and the clip is the start of the audio
        that the generation continues (upstream's prompt-text mode); else the clip is a voice reference
        before the text."""
        p, d = self.patch_size, self.feat_dim
        text = torch.tensor([*ids, AUDIO_START_ID], dtype=torch.long)
        n = text.numel()
        if reference is None:
            return Prompt(text, torch.zeros(n, p, d), torch.ones(n), torch.zeros(n))
        ref = self._reference_patches(reference)
        r = ref.size(0)
        if continued:
            return Prompt(torch.cat((text, torch.zeros(r, dtype=torch.long))),
                           torch.cat((torch.zeros(n, p, d), ref.cpu())),
                           torch.cat((torch.ones(n), torch.zeros(r))),
                           torch.cat((torch.zeros(n), torch.ones(r))))
        one = torch.ones(1)
        tokens = torch.cat((torch.tensor([REF_AUDIO_START_ID]), torch.zeros(r, dtype=torch.long),
                            torch.tensor([REF_AUDIO_END_ID]), text))
        feats = torch.cat((torch.zeros(1, p, d), ref.cpu(), torch.zeros(1 + n, p, d)))
        text_mask = torch.cat((one, torch.zeros(r), one, torch.ones(n)))
        audio_mask = torch.cat((torch.zeros(1), torch.ones(r), torch.zeros(1 + n)))
        return Prompt(tokens, feats, text_mask, audio_mask)

    def _require(self, name: str) -> Any:
        value = getattr(self, name)
        if value is None:
            raise RuntimeError(f"generation needs the {name}: load with from_pretrained or call attach()")
        return value

    def prompts(self, texts: list[str], references: list[Any], reference_text: str | None = None
                ) -> list[Prompt]:
        """One prompt per text, in the voice of references[i] (`generate` says what a reference may be)."""
        tokenizer = self._require("tokenizer")
        lead = f"{reference_text} " if reference_text else ""
        # whitespace collapsed as upstream's VoxCPM.generate does before tokenizing
        ids = [tokenizer.encode(re.sub(r"\s+", " ", (lead if r is not None else "") + t))
               for t, r in zip(texts, references, strict=True)]
        return [self._prompt(i, r, bool(lead)) for i, r in zip(ids, references, strict=True)]

    def decode(self, patches: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A row's patches [n, P, D] -> (mono waveform at the VAE's output rate, latents [D, n * P]), on the
        CPU (`decode_patches`)."""
        return decode_patches(self._require("audio_vae"), patches, self.patch_size)

    def generate(
        self,
        text: str | list[str],
        reference: Any = None,
        *,
        max_len: int = 2000,
        min_len: int = 2,
        inference_timesteps: int = 10,
        cfg_value: float = 2.0,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        reference_text: str | None = None,
        check: Callable[[], None] | None = None,
    ) -> GeneratedSpeech:
        """Synthesize each text (optionally in the voice of a reference) as a 48 kHz waveform.

        reference: None, one reference for every text, or a list with one (or None) per text;
        each is a 16 kHz mono waveform, VAE latents [D, frames] or patches [R, P, D]. A fixed
        `seed` gives identical audio: each text draws from its own generator seeded with it, so a
        text says the same in any batch as alone. `generator`: one the texts draw from in turn;
        neither: the global RNG.
        reference_text: the references' transcript; the speech then continues the clip (`prompts`).
        check: called before every generated patch; what it raises (a deadline passed, a client gone)
        ends the generation there, and the caches go with the batch.
        """
        texts = [text] if isinstance(text, str) else list(text)
        if not texts:
            raise ValueError("generate needs at least one text")
        refs = reference if isinstance(reference, list) else [reference] * len(texts)
        if len(refs) != len(texts):
            raise ValueError(f"{len(refs)} references for {len(texts)} texts")
        self._require("audio_vae")
        device = self.enc_to_lm_proj.weight.device
        prompts = self.prompts(texts, refs, reference_text)

        def own() -> torch.Generator | None:
            if generator is None and seed is not None:
                return torch.Generator(device).manual_seed(seed)
            return generator

        rows = [Row(pr, max_len, min_len, cfg_value, inference_timesteps, own(), check) for pr in prompts]
        was_training = self.training
        self.eval()
        try:
            finished = RollingBatch(self).run(rows)
        finally:
            self.train(was_training)
        for f in finished:
            if f.error is not None:
                raise f.error
        decoded = [self.decode(f.patches) for f in finished]
        return GeneratedSpeech([a for a, _ in decoded], [z for _, z in decoded],
                               [f.hit_limit for f in finished], self.audio_vae.out_sample_rate)

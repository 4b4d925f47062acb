"""Analytic FLOPs of one VoxCPM2 training step at the real padded shapes of a batch.

Conventions (they decide every MFU figure, so they are fixed here and tested):
- Only matrix multiplies count (2 FLOPs per multiply-add): linear layers and the two attention
  matmuls. Norms, activations, RoPE, softmax, losses and embedding lookups are left out, as in
  `torch.utils.flop_counter.FlopCounterMode`, which the tests match within 2 %.
- Attention counts the full L x L score square even for the causal LMs: that is what the MATH
  SDPA backend executes and what the counter reports. `causal_half=True` halves the score and
  value matmuls of the causal stacks (base and residual LM), the convention of ports that count
  only the lower triangle.
- Training = 3 x forward (backward does two matmuls per forward matmul). Activation recompute
  is not model work and is not counted.
- Work the model leaves out does not count (voxpipe/model/rows.py). The LMs' position-wise work
  (projections, MLP, FSQ, fusion) runs on `lm_rows` positions: in each sequence those before its
  last loss row (`lm_rows=None`: all B*L, as upstream and voxpipe before 2026-12 ran them); their
  attention runs on the padded [B, L] layout, so its square counts in full. The last layer of each
  stack computes only what is read: the residual LM the `dit_rows` positions before the loss rows,
  the local encoder one position (the special token), the local DiT the P noisy-patch positions;
  the layer's keys and values still cover every position.
- The local encoder runs on `enc_rows` inner sequences of P+1 (a special token + P frames,
  bidirectional): voxpipe's model encodes only the audio rows (targets and references), so a
  batch counts those; `enc_rows=None` means all B*L rows, as upstream's model runs it.
- The local DiT runs on `dit_rows` inner sequences of 2 + 1 + P + P (base-LM and residual-LM
  conditions, the time token, the previous patch, the noisy patch): voxpipe's model feeds it only
  the patch rows that carry loss weight (target audio), so a batch counts those
  (`batch_training_flops`). `dit_rows=None` means all B*L rows: upstream's model computes them all,
  and the published port's figure counts them all.
- Not modelled: `dit_mean_mode` (its JVP roughly doubles the DiT's forward); all shipped
  configs have it off.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from voxpipe.model.config import MiniCPM4Config, VoxCPM2Config
from voxpipe.model.rows import plan_rows

TOWERS = ("base_lm", "residual_lm", "local_encoder", "local_dit", "projections", "fsq", "stop_head")
DIT_CONDITION_TOKENS = 2  # the base-LM and the residual-LM condition vectors (mu)
BACKWARD_FACTOR = 2  # backward FLOPs per forward FLOP (input grad + weight grad)


def _linear(rows: int, fan_in: int, fan_out: int) -> int:
    return 2 * rows * fan_in * fan_out


def stack_flops(
    config: MiniCPM4Config,
    sequences: int,
    length: int,
    causal_half: bool = False,
    *,
    tokens: int | None = None,
    read: int | None = None,
    read_queries: int | None = None,
) -> int:
    """Forward FLOPs of one MiniCPM decoder stack over `sequences` sequences of `length` tokens.

    tokens: positions the position-wise work runs on (None: all); read: positions the last layer
    returns, whose queries, output projection and MLP it computes (None: `tokens`); read_queries:
    query positions per sequence of the last layer's attention (None: `length`, the padded layout).
    """
    hidden, head_dim = config.hidden_size, config.head_dim
    q_width = config.num_attention_heads * head_dim
    kv_width = config.num_key_value_heads * head_dim
    tokens = sequences * length if tokens is None else tokens
    read = tokens if read is None else read

    def layer(queries: int, query_length: int) -> int:
        projections = _linear(queries, hidden, q_width) * 2 + _linear(tokens, hidden, kv_width) * 2
        mlp = _linear(queries, hidden, config.intermediate_size) * 3
        # QK^T and AV: every query head against the (shared) KV heads, one score per query and key
        attention = 2 * 2 * sequences * config.num_attention_heads * query_length * length * head_dim
        return projections + mlp + (attention // 2 if causal_half else attention)

    last = layer(read, length if read_queries is None else read_queries)
    return (config.num_hidden_layers - 1) * layer(tokens, length) + last


def dit_inner_length(config: VoxCPM2Config) -> int:
    """Tokens the local DiT sees per patch: conditions + time token + previous patch + noisy patch."""
    return DIT_CONDITION_TOKENS + 1 + 2 * config.patch_size


def forward_flops(
    config: VoxCPM2Config,
    batch_size: int,
    seq_len: int,
    causal_half: bool = False,
    dit_rows: int | None = None,
    enc_rows: int | None = None,
    lm_rows: int | None = None,
) -> dict[str, int]:
    """Forward FLOPs per tower for a batch padded to [batch_size, seq_len] LM positions."""
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch shape must be positive, got B={batch_size}, L={seq_len}")
    rows = batch_size * seq_len if lm_rows is None else lm_rows  # one patch per LM position
    dit_rows = batch_size * seq_len if dit_rows is None else dit_rows
    enc_rows = batch_size * seq_len if enc_rows is None else enc_rows
    p, d = config.patch_size, config.feat_dim
    hidden = config.lm_config.hidden_size
    enc, dit = config.encoder_config.hidden_dim, config.dit_config.hidden_dim
    latent = config.scalar_quantization_latent_dim
    return {
        "base_lm": stack_flops(config.lm_config, batch_size, seq_len, causal_half, tokens=rows),
        "residual_lm": stack_flops(
            config.residual_lm_config(), batch_size, seq_len, causal_half, tokens=rows, read=dit_rows
        ),
        "local_encoder": (
            _linear(enc_rows * p, d, enc)
            + stack_flops(config.encoder_lm_config(), enc_rows, p + 1, read=enc_rows, read_queries=1)
        ),
        "local_dit": (
            _linear(dit_rows * p, d, dit) * 2  # in_proj (noisy patch) and cond_proj (previous patch)
            + _linear(dit_rows, dit, dit) * 4  # time_mlp and delta_time_mlp, two layers each
            + stack_flops(config.dit_lm_config(), dit_rows, dit_inner_length(config), read=dit_rows * p,
                          read_queries=p)
            + _linear(dit_rows * p, dit, d)  # out_proj
        ),
        "projections": (
            _linear(enc_rows, enc, hidden)  # enc_to_lm_proj
            + _linear(rows, 2 * hidden, hidden)  # fusion_concat_proj
            + _linear(dit_rows, hidden, dit) * 2  # lm_to_dit_proj, res_to_dit_proj: at the DiT's rows
        ),
        "fsq": _linear(rows, hidden, latent) + _linear(rows, latent, hidden),
        "stop_head": _linear(dit_rows, hidden, hidden) + _linear(dit_rows, hidden, 2),  # at the loss rows
    }


def training_flops(
    config: VoxCPM2Config,
    batch_size: int,
    seq_len: int,
    causal_half: bool = False,
    dit_rows: int | None = None,
    enc_rows: int | None = None,
    lm_rows: int | None = None,
) -> float:
    """Model FLOPs of one forward + backward over a [batch_size, seq_len] batch (3 x forward)."""
    per_tower = forward_flops(config, batch_size, seq_len, causal_half, dit_rows, enc_rows, lm_rows)
    return float((1 + BACKWARD_FACTOR) * sum(per_tower.values()))


def batch_shape(batch: Mapping[str, torch.Tensor], config: VoxCPM2Config) -> tuple[int, int]:
    """(B, L) of a training batch, checked against the config's patch shape."""
    feats = batch["audio_feats"]
    if feats.dim() != 4 or tuple(feats.shape[2:]) != (config.patch_size, config.feat_dim):
        raise ValueError(
            f"audio_feats must be [B, L, {config.patch_size}, {config.feat_dim}], got {tuple(feats.shape)}"
        )
    return int(feats.size(0)), int(feats.size(1))


def row_counts(plan: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """How many rows each tower runs on under a row plan (rows.py; `host_rows`'s keys), as this
    module's keyword arguments."""
    return {"dit_rows": plan["loss_rows"].numel(), "enc_rows": plan["audio_rows"].numel(),
            "lm_rows": plan["lm_rows"].numel()}


def batch_rows(batch: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """How many rows each tower of the model runs on for this batch (its row plan, rows.py)."""
    return row_counts(plan_rows(batch["audio_mask"], batch["loss_mask"])._asdict())


def batch_training_flops(config: VoxCPM2Config, batch: Mapping[str, torch.Tensor]) -> float:
    """Training FLOPs of one micro-batch: its padded shape and the rows its towers run on."""
    return training_flops(config, *batch_shape(batch, config), **batch_rows(batch))


def tower_shares(per_tower: Mapping[str, float]) -> dict[str, float]:
    """Fraction of the step's FLOPs spent in each tower."""
    total = sum(per_tower.values())
    return {name: value / total for name, value in per_tower.items()}

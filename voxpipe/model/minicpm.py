"""MiniCPM-4 decoder stack, written for training: any dtype, any device, padded batches.

Parameter names follow upstream's checkpoint keys (`layers.N.self_attn.q_proj.weight`, ...).
Differences from upstream's inference-first module, all numerically neutral in fp32:
- no buffers at all: RoPE tables are computed per call from the positions, so the model builds
  on the meta device and needs nothing recomputed after `to_empty`;
- optional `[B, T]` padding mask and per-row positions, turned into 4-D SDPA masks;
- KV caches are per-call objects (`MiniCPMModel.new_cache`), never allocated at construction;
- work whose output nobody reads is not done: a causal stack can compute only some positions of a
  right-padded batch (`Packed`), and any stack's last layer only the positions its caller reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from voxpipe.model.config import MiniCPM4Config
from voxpipe.model.npu import OFF, NpuKernels, fused_rms_norm, fused_swiglu


class RMSNorm(nn.Module):
    npu_kernels: NpuKernels = OFF

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.npu_kernels.rms_norm:
            return fused_rms_norm(x, self.weight, self.eps)
        # statistics in fp32 whatever the activations are; result goes back to the input dtype
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (normed.to(x.dtype) * self.weight).to(x.dtype)


def rope_cos_sin(config: MiniCPM4Config, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """LongRoPE cos/sin (fp32, shape positions.shape + [head_dim]) the way upstream tabulates them.

    Upstream picks the long factors only when max_position_embeddings exceeds the original
    context, independent of the actual sequence length, and scales cos/sin by its attention factor.
    """
    dim = config.head_dim
    scaling = config.rope_scaling
    device = positions.device
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, device=device).float() / dim))
    use_long = config.max_position_embeddings > scaling.original_max_position_embeddings
    factors = torch.tensor(scaling.long_factor if use_long else scaling.short_factor, device=device)
    scale = math.sqrt(
        1
        + math.log(config.max_position_embeddings / scaling.original_max_position_embeddings)
        / math.log(scaling.original_max_position_embeddings)
    )
    freqs = positions.float().unsqueeze(-1) * (1.0 / factors) * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos() * scale, angles.sin() * scale


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, upcast: bool = True) -> torch.Tensor:
    """Rotate x ([B, H, T, D]) with cos/sin ([T, D] or [B, T, D]); fp32 math unless told otherwise."""
    if cos.dim() == 3:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    work = torch.float32 if upcast else x.dtype
    x_ = x.to(work)
    return (x_ * cos.to(work) + _rotate_half(x_) * sin.to(work)).to(x.dtype)


@dataclass(frozen=True)
class Packed:
    """Some positions (`rows`, flat indices into batch * length, sorted) of a [batch, length] batch.

    The position-wise work of a layer (norms, projections, MLP) runs on these rows only; attention runs
    on the padded layout, where the other positions hold zeros. That is exact in a causal stack when no
    kept position comes after a left-out one of its sequence (right padding, a sequence's unread tail).
    """

    batch: int
    length: int
    rows: torch.Tensor

    def unpack(self, x: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """[n, C] values of `rows` (default: all kept) -> [batch, length, C], zeros elsewhere."""
        rows = self.rows if rows is None else rows
        flat = x.new_zeros(self.batch * self.length, x.size(-1)).index_copy(0, rows, x)
        return flat.view(self.batch, self.length, -1)

    def pack(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """[batch, length, C] -> [n, C] at `rows`."""
        return x.reshape(self.batch * self.length, -1).index_select(0, rows)


Read = slice | torch.Tensor | None  # the positions a layer returns: None = all


def _pick(x: torch.Tensor, read: Read) -> torch.Tensor:
    """The positions `read` of x: a slice of dim 1 of [B, T, H], or indices into the rows of packed [N, H].

    A slice is copied out: a GEMM on the strided view gave results that varied in the last bit from
    call to call on CPU (MKL). The copy is one position (the encoder) or one F.linear's reshape would
    make anyway (the DiT's P of 2P + 3)."""
    if read is None:
        return x
    return x[:, read].contiguous() if isinstance(read, slice) else x.index_select(0, read)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool
) -> torch.Tensor:
    """SDPA with grouped KV heads; `mask` is a 4-D boolean mask (True = attend) or None."""
    if q.device.type in ("cpu", "cuda", "meta"):  # strided [B, H, T, D] views as they come: no copies
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=True)
    groups = q.size(1) // k.size(1)  # backends without enable_gqa (npu, mps) get expanded heads
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q.contiguous(), k, v, attn_mask=mask, is_causal=is_causal)


class KVCache:
    """Keys/values of one decoding call, created by the caller and sized for that call only.

    Buffers are allocated on the first write, in the dtype and on the device the keys arrive in
    (so bf16 compute under FSDP or autocast gets a bf16 cache). `valid` marks which slots hold
    real tokens: rows of a batch may have prompts of different lengths, and every later token
    attends only to the valid slots of its own row.
    """

    def __init__(self, num_layers: int, capacity: int):
        self.capacity = capacity
        self.length = 0
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.valid: torch.Tensor | None = None

    def context_valid(self, new_valid: torch.Tensor) -> torch.Tensor:
        """[B, length + T]: which keys the new tokens may see (cached slots, then themselves)."""
        if self.valid is None:
            return new_valid
        return torch.cat((self.valid[:, : self.length], new_valid), dim=1)

    def next_positions(self, batch_size: int, device: torch.device) -> torch.Tensor:
        """Per-row position of the next real token (= real tokens cached so far)."""
        if self.valid is None:
            return torch.zeros(batch_size, dtype=torch.long, device=device)
        return self.valid.sum(dim=1)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this layer's new keys/values ([B, H_kv, T, D]); return all cached for the layer."""
        end = self.length + k.size(2)
        if end > self.capacity:
            raise ValueError(f"KV cache full: {end} tokens do not fit its capacity of {self.capacity}")
        if self.keys[layer] is None:
            shape = (k.size(0), k.size(1), self.capacity, k.size(3))
            self.keys[layer], self.values[layer] = k.new_zeros(shape), v.new_zeros(shape)
        keys, values = self.keys[layer], self.values[layer]
        keys[:, :, self.length : end] = k
        values[:, :, self.length : end] = v
        return keys[:, :, :end], values[:, :, :end]

    def commit(self, new_valid: torch.Tensor) -> None:
        """Called once all layers have written: the new tokens become part of the context."""
        if self.valid is None:
            self.valid = new_valid.new_zeros(new_valid.size(0), self.capacity)
        end = self.length + new_valid.size(1)
        self.valid[:, self.length : end] = new_valid
        self.length = end

    # -- continuous batching (voxpipe/model/rolling.py): rows join and leave between tokens ------------------
    def keep(self, rows: torch.Tensor) -> None:
        """Only `rows` stay (the others left the batch); slots that no remaining row holds a real token in
        (the left padding of a row that left) are dropped, so the cache shrinks with the batch."""
        assert self.valid is not None, "keep() after the prompt is in"
        valid = self.valid.index_select(0, rows)
        first = int(valid[:, : self.length].any(dim=0).int().argmax())  # the oldest slot still read
        self.valid = valid[:, first:]
        for i, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            self.keys[i] = k.index_select(0, rows)[:, :, first:]
            self.values[i] = v.index_select(0, rows)[:, :, first:]
        self.length -= first
        self.capacity -= first

    @staticmethod
    def beside(caches: list[KVCache], room: int) -> KVCache:
        """One cache of the caches' rows, each right-aligned so that every row's last token is in the same
        slot (the others' left padding is invalid, as a left-padded prompt's is): the next token of every row
        is written together, and `room` more fit."""
        length = max(c.length for c in caches)
        out = KVCache(len(caches[0].keys), length + room)
        out.length = length
        first = caches[0]
        assert first.valid is not None, "beside() after the prompts are in"
        out.valid = first.valid.new_zeros(sum(c.valid.size(0) for c in caches), out.capacity)
        row = 0
        for c in caches:
            n, start = c.valid.size(0), length - c.length
            out.valid[row : row + n, start:length] = c.valid[:, : c.length]
            row += n
        for layer in range(len(first.keys)):
            for name in ("keys", "values"):
                k0 = getattr(first, name)[layer]
                merged = k0.new_zeros(out.valid.size(0), k0.size(1), out.capacity, k0.size(3))
                row = 0
                for c in caches:
                    src = getattr(c, name)[layer]
                    n, start = src.size(0), length - c.length
                    merged[row : row + n, :, start:length] = src[:, :, : c.length]
                    row += n
                getattr(out, name)[layer] = merged
        return out


class MiniCPMAttention(nn.Module):
    npu_kernels: NpuKernels = OFF

    def __init__(self, config: MiniCPM4Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor | None,
        is_causal: bool,
        cache: KVCache | None = None,
        packed: Packed | None = None,
        read: Read = None,
    ) -> torch.Tensor:
        """x [B, T, H], or [N, H] rows of a `packed` batch; outputs at the positions `read` only."""
        q, k, v = self.q_proj(_pick(x, read)), self.k_proj(x), self.v_proj(x)
        if packed is not None:
            q_rows = packed.rows if read is None else packed.rows.index_select(0, read)
            q, k, v = packed.unpack(q, q_rows), packed.unpack(k), packed.unpack(v)
        b, t = k.shape[:2]
        q = q.reshape(b, q.size(1), self.num_heads, self.head_dim).transpose(1, 2)
        k = k.reshape(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.reshape(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            cos, sin = rope
            upcast = not self.npu_kernels.bf16_rope
            q_at = read if isinstance(read, slice) else slice(None)  # packed queries sit in the padded layout
            q, k = rotate(q, cos[..., q_at, :], sin[..., q_at, :], upcast), rotate(k, cos, sin, upcast)
        if cache is not None:
            k, v = cache.write(self.layer_idx, k, v)
        out = attention(q, k, v, mask, is_causal)
        out = out.transpose(1, 2).reshape(b, q.size(2), self.num_heads * self.head_dim)
        if packed is not None:
            out = packed.pack(out, q_rows)
        return self.o_proj(out)


class MiniCPMMLP(nn.Module):
    npu_kernels: NpuKernels = OFF

    def __init__(self, config: MiniCPM4Config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.npu_kernels.swiglu:
            return self.down_proj(fused_swiglu(self.gate_proj(x), self.up_proj(x)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MiniCPMDecoderLayer(nn.Module):
    def __init__(self, config: MiniCPM4Config, layer_idx: int):
        super().__init__()
        self.self_attn = MiniCPMAttention(config, layer_idx)
        self.mlp = MiniCPMMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # muP depth scaling of both residual branches (1.0 and skipped when use_mup is off)
        self.branch_scale = (
            config.scale_depth / math.sqrt(config.num_hidden_layers) if config.use_mup else None
        )

    def _residual(self, x: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        return x + branch if self.branch_scale is None else torch.add(x, branch, alpha=self.branch_scale)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor | None,
        is_causal: bool,
        cache: KVCache | None = None,
        packed: Packed | None = None,
        read: Read = None,
    ) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(x), rope, mask, is_causal, cache, packed, read)
        x = self._residual(_pick(x, read), attended)
        return self._residual(x, self.mlp(self.post_attention_layernorm(x)))


class MiniCPMModel(nn.Module):
    """Decoder stack over input embeddings; `embed_tokens` exists only when vocab_size > 0.

    The owner embeds tokens (and applies muP's scale_emb) itself, as upstream's VoxCPM2 does.
    """

    def __init__(self, config: MiniCPM4Config):
        super().__init__()
        self.config = config
        if config.vocab_size > 0:
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(MiniCPMDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def new_cache(self, capacity: int) -> KVCache:
        """An empty KV cache for one decoding call of up to `capacity` tokens."""
        return KVCache(self.config.num_hidden_layers, capacity)

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        is_causal: bool = True,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: KVCache | None = None,
        *,
        packed: Packed | None = None,
        read: Read = None,
    ) -> torch.Tensor:
        """Hidden states [B, T, H] after the final norm.

        attention_mask: [B, T], True/1 on real tokens (None: all real, upstream's behaviour).
        position_ids: [T] or [B, T] (None: counted over real tokens, continuing after the cache).
        cache: KVCache from `new_cache`; the new tokens are appended to it (causal stacks only).
        packed: inputs_embeds is [N, H], the kept rows of a right-padded batch (`Packed`; causal
        stacks only), and so are the hidden states returned.
        read: the positions returned, computed only in the last layer (the others are keys and values
        only): a slice of T (bidirectional stacks), or indices into the packed rows. None: all.
        """
        if cache is not None and not is_causal:
            raise ValueError("a KV cache needs causal attention")
        if packed is not None and (not is_causal or cache is not None or attention_mask is not None):
            raise ValueError("packed rows need causal attention, no cache and no attention mask")
        if isinstance(read, slice) and (is_causal or cache is not None):
            raise ValueError("a slice of positions to read needs bidirectional attention and no cache")
        if isinstance(read, torch.Tensor) and packed is None:
            raise ValueError("indices of positions to read are indices into packed rows")
        if packed is not None:
            b, t = packed.batch, packed.length
        else:
            b, t, _ = inputs_embeds.shape
        device = inputs_embeds.device
        new_valid = (
            torch.ones(b, t, dtype=torch.bool, device=device)
            if attention_mask is None
            else attention_mask.bool()
        )
        start = cache.length if cache is not None else 0

        mask = None
        if cache is not None or attention_mask is not None:
            keys_valid = new_valid if cache is None else cache.context_valid(new_valid)
            key_idx = torch.arange(start + t, device=device)
            query_idx = torch.arange(start, start + t, device=device).unsqueeze(-1)
            allowed = keys_valid[:, None, None, :]
            if is_causal:
                allowed = allowed & (key_idx <= query_idx)
            mask = allowed | (key_idx == query_idx)  # a padded query still sees itself: no all-masked rows
        use_sdpa_causal = is_causal and mask is None

        rope = None
        if not self.config.no_rope:
            if position_ids is None:
                if attention_mask is None and cache is None:
                    position_ids = torch.arange(t, device=device)
                else:
                    offset = cache.next_positions(b, device).unsqueeze(-1) if cache is not None else 0
                    position_ids = (offset + new_valid.long().cumsum(dim=1) - 1).clamp(min=0)
            rope = rope_cos_sin(self.config, position_ids)

        hidden = inputs_embeds.to(self.norm.weight.dtype)  # e.g. fp32 embeddings into a bf16 model
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            hidden = layer(hidden, rope, mask, use_sdpa_causal, cache, packed, read if i == last else None)
        if cache is not None:
            cache.commit(new_valid)
        return self.norm(hidden)

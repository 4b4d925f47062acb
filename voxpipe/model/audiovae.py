"""AudioVAE v2: the 16 kHz -> 25 Hz latent encoder and 48 kHz decoder that VoxCPM2 trains against.

Module attribute names mirror upstream's checkpoint keys so `audiovae.pth` / `audiovae.safetensors`
load strictly in both directions; the code itself is ours. Weight norm is kept in upstream's
stored form (`weight_g` / `weight_v` parameters) and folded into the kernel on every forward with
the same primitive torch.nn.utils.weight_norm uses, so no key conversion is needed and results
match upstream bit for bit on the same device.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict
from torch import nn

from voxpipe.files import read_state_dict
from voxpipe.model.strict_load import mismatches
from voxpipe.voxcpm2_format import SAMPLE_RATE


class AudioVAEConfig(BaseModel):
    """The `audio_vae_config` block of a VoxCPM2 config.json (upstream key names and defaults)."""

    model_config = ConfigDict(extra="forbid")

    encoder_dim: int = 128
    encoder_rates: list[int] = [2, 5, 8, 8]
    latent_dim: int = 64
    decoder_dim: int = 2048
    decoder_rates: list[int] = [8, 6, 5, 2, 2, 2]
    depthwise: bool = True
    sample_rate: int = SAMPLE_RATE
    out_sample_rate: int = 48000
    use_noise_block: bool = False
    sr_bin_boundaries: list[int] | None = [20000, 30000, 40000]
    cond_type: str = "scale_bias"
    cond_dim: int = 128
    cond_out_layer: bool = False


# ---------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------


class _WeightNormed(nn.Module):
    """Shared init for the weight-normed convolutions: torch's default conv init, then g = ||v||."""

    def _init_params(self, v_shape: tuple[int, ...], fan_in: int, out_channels: int, bias: bool) -> None:
        v = torch.empty(v_shape)
        nn.init.kaiming_uniform_(v, a=math.sqrt(5))
        # on meta only g's shape matters, and torch's meta norm would import torch._dynamo (memory.on_meta)
        g_shape = (v_shape[0], *[1] * (len(v_shape) - 1))
        self.weight_g = nn.Parameter(torch.empty(g_shape) if v.is_meta else torch.norm_except_dim(v, 2, 0))
        self.weight_v = nn.Parameter(v)
        if bias:
            bound = 1 / math.sqrt(fan_in)
            self.bias = nn.Parameter(torch.empty(out_channels).uniform_(-bound, bound))
        else:
            self.register_parameter("bias", None)

    def folded_weight(self) -> torch.Tensor:
        """g * v / ||v|| per slice of dim 0: the kernel torch.nn.utils.weight_norm would compute."""
        return torch._weight_norm(self.weight_v, self.weight_g, 0)


class CausalConv(_WeightNormed):
    """Weight-normed Conv1d that only looks back: `left_pad` zeros go in front, none behind."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
        left_pad: int = 0,
        bias: bool = True,
    ):
        super().__init__()
        self.stride, self.dilation, self.groups, self.left_pad = stride, dilation, groups, left_pad
        self._init_params(
            (out_channels, in_channels // groups, kernel_size),
            in_channels // groups * kernel_size,
            out_channels,
            bias,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.folded_weight()
        if self._per_channel(x):
            return _causal_taps(x, weight, self.bias, self.dilation)
        x = F.pad(x, (self.left_pad, 0))
        return F.conv1d(x, weight, self.bias, self.stride, 0, self.dilation, self.groups)

    def _per_channel(self, x: torch.Tensor) -> bool:
        """A few channels on the CPU, each its own filter, all taps looking back, and no gradient:
        `_causal_taps` is the faster way."""
        channels = self.weight_v.size(0)
        return (self.groups == channels == x.size(1) <= TAPS_MAX_CHANNELS and self.stride == 1
                and x.device.type == "cpu" and x.dtype == self.weight_v.dtype and not torch.is_grad_enabled()
                and self.left_pad == (self.weight_v.size(-1) - 1) * self.dilation)


# Channels up to which a depthwise causal conv runs as shifted multiply-adds on the CPU. oneDNN's
# depthwise conv1d on a few channels of a long signal (the 48 kHz end of the decoder: 1-8 channels of
# 10^5-10^6 samples) took 15-30 times longer than the shifted multiply-adds on one thread (5-50 ms
# against 1.6 ms a layer), which made the VAE, not generation, the bulk of serving's work; from a few
# dozen channels on the two are even.
TAPS_MAX_CHANNELS = 16


def _causal_taps(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int
                 ) -> torch.Tensor:
    """A depthwise causal conv ([B, C, T], weight [C, 1, K], padded K-1 taps in front) as K shifted
    multiply-adds: y[t] = b + sum_k w[k] x[t - (K-1-k) * dilation], zeros before the start. The same sums
    as the conv in another order: equal to float rounding."""
    taps = weight.size(-1)
    length = x.size(-1)
    w = weight[:, 0].unsqueeze(-1)  # [C, K, 1]
    y = x * w[:, taps - 1]
    if bias is not None:
        y += bias.unsqueeze(-1)
    for k in range(taps - 1):
        shift = (taps - 1 - k) * dilation
        if shift < length:
            y[..., shift:].addcmul_(x[..., : length - shift], w[:, k])
    return y


class CausalConvTranspose(_WeightNormed):
    """Weight-normed ConvTranspose1d whose look-ahead tail (`right_trim` samples) is cut off."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, *, stride: int, right_trim: int
    ):
        super().__init__()
        if right_trim <= 0:
            raise ValueError("right_trim must be positive")
        self.stride, self.right_trim = stride, right_trim
        # ConvTranspose1d stores [in, out, k]; its default init uses fan_in = out * k.
        self._init_params(
            (in_channels, out_channels, kernel_size), out_channels * kernel_size, out_channels, True
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv_transpose1d(x, self.folded_weight(), self.bias, self.stride)[..., : -self.right_trim]


class Snake1d(nn.Module):
    """x + sin^2(alpha x) / alpha with a learned per-channel alpha (periodic inductive bias for audio)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inverse = (self.alpha + 1e-9).reciprocal()
        if torch.is_grad_enabled():
            return x + inverse * torch.sin(self.alpha * x).pow(2)
        # the same operations in place, in one buffer: at 48 kHz each new buffer of a long clip cost more
        # than the arithmetic in it (the same results, bit for bit)
        y = self.alpha * x
        return y.sin_().pow_(2).mul_(inverse).add_(x)


def _strided_conv_padding(stride: int) -> int:
    """Left pad (encoder) / right trim (decoder) for a kernel of 2*stride: frame t sees its own hop."""
    return 2 * math.ceil(stride / 2) - stride % 2


class ResidualUnit(nn.Module):
    """Dilated 7-tap conv + 1x1 conv with snake activations, added back onto the input."""

    def __init__(self, dim: int, dilation: int, groups: int):
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(dim),
            CausalConv(dim, dim, 7, dilation=dilation, groups=groups, left_pad=6 * dilation),
            Snake1d(dim),
            CausalConv(dim, dim, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


def _residual_stack(dim: int, groups: int) -> list[nn.Module]:
    return [ResidualUnit(dim, dilation, groups) for dilation in (1, 3, 9)]


class EncoderBlock(nn.Module):
    """Three residual units, then a strided conv that downsamples by `stride` and doubles channels."""

    def __init__(self, in_dim: int, out_dim: int, stride: int, groups: int):
        super().__init__()
        self.block = nn.Sequential(
            *_residual_stack(in_dim, groups),
            Snake1d(in_dim),
            CausalConv(in_dim, out_dim, 2 * stride, stride=stride, left_pad=_strided_conv_padding(stride)),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class Encoder(nn.Module):
    """Waveform [B,1,N] -> hidden [B, dim * 2^len(rates), N / prod(rates)] -> mean and log-variance."""

    def __init__(self, dim: int, latent_dim: int, rates: list[int], depthwise: bool):
        super().__init__()
        layers: list[nn.Module] = [CausalConv(1, dim, 7, left_pad=6)]
        for stride in rates:
            layers.append(EncoderBlock(dim, dim * 2, stride, groups=dim if depthwise else 1))
            dim *= 2
        self.block = nn.Sequential(*layers)
        self.fc_mu = CausalConv(dim, latent_dim, 3, left_pad=2)
        self.fc_logvar = CausalConv(dim, latent_dim, 3, left_pad=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Posterior mean only: VoxCPM2 never samples from the posterior, so logvar is not computed."""
        return self.fc_mu(self.block(x))


class NoiseBlock(nn.Module):
    """Adds input-scaled Gaussian noise; draws from the global RNG exactly as upstream does."""

    def __init__(self, dim: int):
        super().__init__()
        self.linear = CausalConv(dim, dim, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.randn((x.shape[0], 1, x.shape[2]), device=x.device, dtype=x.dtype)
        return x + noise * self.linear(x)


class DecoderBlock(nn.Module):
    """Transposed conv that upsamples by `stride` and halves channels, then three residual units."""

    def __init__(self, in_dim: int, out_dim: int, stride: int, groups: int, noise: bool):
        super().__init__()
        layers: list[nn.Module] = [
            Snake1d(in_dim),
            CausalConvTranspose(
                in_dim, out_dim, 2 * stride, stride=stride, right_trim=_strided_conv_padding(stride)
            ),
        ]
        if noise:
            layers.append(NoiseBlock(out_dim))
        layers += _residual_stack(out_dim, groups)
        self.block = nn.Sequential(*layers)
        self.in_dim = in_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class RateCondition(nn.Module):
    """Conditions a decoder block's input on the bucket of the requested output sample rate."""

    def __init__(self, dim: int, buckets: int, cond_type: str, cond_dim: int, out_layer: bool):
        super().__init__()
        self.cond_type = cond_type
        out_in_dim = dim
        if cond_type in ("scale_bias", "scale_bias_init"):
            self.scale_embed = nn.Embedding(buckets, dim)
            self.bias_embed = nn.Embedding(buckets, dim)
            if cond_type == "scale_bias":  # starts as identity
                nn.init.ones_(self.scale_embed.weight)
                nn.init.zeros_(self.bias_embed.weight)
            else:
                nn.init.normal_(self.scale_embed.weight, mean=1.0)
                nn.init.normal_(self.bias_embed.weight)
        elif cond_type in ("add", "concat"):
            self.cond_embed = nn.Embedding(buckets, cond_dim if cond_type == "concat" else dim)
            nn.init.normal_(self.cond_embed.weight)
            if cond_type == "concat":
                if not out_layer:
                    raise ValueError(
                        "cond_type 'concat' needs cond_out_layer=True to project back to the block width"
                    )
                out_in_dim = dim + cond_dim
        else:
            raise ValueError(
                f"unknown cond_type {cond_type!r}; expected scale_bias, scale_bias_init, add or concat"
            )
        self.out_layer = (
            nn.Sequential(Snake1d(out_in_dim), CausalConv(out_in_dim, dim, 1)) if out_layer else nn.Identity()
        )

    def forward(self, x: torch.Tensor, bucket: torch.Tensor) -> torch.Tensor:
        if self.cond_type == "add":
            x = x + self.cond_embed(bucket).unsqueeze(-1)
        elif self.cond_type == "concat":
            cond = self.cond_embed(bucket).unsqueeze(-1).expand(x.shape[0], -1, x.shape[-1])
            x = torch.cat([x, cond], dim=1)
        else:
            x = x * self.scale_embed(bucket).unsqueeze(-1) + self.bias_embed(bucket).unsqueeze(-1)
        return self.out_layer(x)


class Decoder(nn.Module):
    """Latents [B, D, T] -> waveform [B, 1, T * prod(rates)] in [-1, 1], optionally rate-conditioned."""

    def __init__(self, cfg: AudioVAEConfig):
        super().__init__()
        latent, channels = cfg.latent_dim, cfg.decoder_dim
        if cfg.depthwise:
            layers: list[nn.Module] = [
                CausalConv(latent, latent, 7, groups=latent, left_pad=6),
                CausalConv(latent, channels, 1),
            ]
        else:
            layers = [CausalConv(latent, channels, 7, left_pad=6)]
        out_dim = channels
        for i, stride in enumerate(cfg.decoder_rates):
            in_dim, out_dim = channels // 2**i, channels // 2 ** (i + 1)
            groups = out_dim if cfg.depthwise else 1
            layers.append(DecoderBlock(in_dim, out_dim, stride, groups, cfg.use_noise_block))
        layers += [Snake1d(out_dim), CausalConv(out_dim, 1, 7, left_pad=6), nn.Tanh()]
        self.model = nn.ModuleList(layers)

        self.conditioned = cfg.sr_bin_boundaries is not None
        if self.conditioned:
            self.register_buffer("sr_bin_boundaries", torch.tensor(cfg.sr_bin_boundaries, dtype=torch.int32))
            buckets = len(cfg.sr_bin_boundaries) + 1
            # keyed by the index of the block each one precedes, as upstream's checkpoint keys are
            self.sr_cond_model = nn.ModuleDict(
                {
                    str(i): RateCondition(
                        layer.in_dim, buckets, cfg.cond_type, cfg.cond_dim, cfg.cond_out_layer
                    )
                    for i, layer in enumerate(layers)
                    if isinstance(layer, DecoderBlock)
                }
            )

    def forward(self, z: torch.Tensor, sample_rate: torch.Tensor | None) -> torch.Tensor:
        bucket = torch.bucketize(sample_rate, self.sr_bin_boundaries) if self.conditioned else None
        x = z
        for i, layer in enumerate(self.model):
            if bucket is not None and str(i) in self.sr_cond_model:
                x = self.sr_cond_model[str(i)](x, bucket)
            x = layer(x)
        return x


# ---------------------------------------------------------------------------------------------
# The VAE
# ---------------------------------------------------------------------------------------------


class AudioVAE(nn.Module):
    """Frozen audio codec of VoxCPM2: `encode` 16 kHz speech to latents, `decode` latents to 48 kHz."""

    def __init__(self, config: AudioVAEConfig | None = None):
        super().__init__()
        self.config = config = config or AudioVAEConfig()
        if config.decoder_dim % 2 ** len(config.decoder_rates):
            raise ValueError(
                f"decoder_dim {config.decoder_dim} must be divisible by 2^{len(config.decoder_rates)} "
                "(it is halved once per decoder rate)"
            )
        self.encoder = Encoder(config.encoder_dim, config.latent_dim, config.encoder_rates, config.depthwise)
        self.decoder = Decoder(config)

    @property
    def hop_length(self) -> int:
        """Input samples per latent frame (640 at 16 kHz -> 25 Hz)."""
        return math.prod(self.config.encoder_rates)

    @property
    def decode_hop_length(self) -> int:
        """Output samples per latent frame (1920 at 48 kHz)."""
        return math.prod(self.config.decoder_rates)

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def out_sample_rate(self) -> int:
        return self.config.out_sample_rate

    @property
    def latent_dim(self) -> int:
        return self.config.latent_dim

    def pad_to_multiple(self, wav: torch.Tensor, patch_size: int = 1) -> torch.Tensor:
        """Right-pad the last axis with zeros to a multiple of hop_length * patch_size.

        Upstream pads every clip to hop * patch_size (2560 samples) before encoding so the latents
        split into whole LM patches; with a causal encoder the padding never changes earlier frames.
        """
        multiple = self.hop_length * patch_size
        return F.pad(wav, (0, -wav.shape[-1] % multiple))

    def encode(self, wav: torch.Tensor, sample_rate: int | None = None) -> torch.Tensor:
        """[B, 1, N] float waveform at `self.sample_rate` -> posterior mean [B, latent_dim, ceil(N / hop)]."""
        if sample_rate is not None and sample_rate != self.sample_rate:
            raise ValueError(
                f"AudioVAE encodes {self.sample_rate} Hz audio, got {sample_rate} Hz; resample first "
                "(feeding the wrong rate trains the model on garbage latents)"
            )
        if wav.ndim != 3 or wav.shape[1] != 1:
            raise ValueError(f"expected a waveform batch shaped [B, 1, N], got {tuple(wav.shape)}")
        return self.encoder(self.pad_to_multiple(wav))

    def decode(self, z: torch.Tensor, out_sample_rate: int | torch.Tensor | None = None) -> torch.Tensor:
        """Latents [B, latent_dim, T] -> waveform [B, 1, T * decode_hop_length].

        `out_sample_rate` (default: config.out_sample_rate) picks the rate-conditioning bucket; a
        tensor of shape [B] conditions each item separately.
        """
        rate = None
        if self.decoder.conditioned:
            rate = self.out_sample_rate if out_sample_rate is None else out_sample_rate
            rate = torch.as_tensor(rate, dtype=torch.int32, device=z.device).reshape(-1)
        return self.decoder(z, rate)


# ---------------------------------------------------------------------------------------------
# Checkpoint I/O (upstream layout: old-style weight_norm keys, int32 `decoder.sr_bin_boundaries`)
# ---------------------------------------------------------------------------------------------

AUDIOVAE_FILES = ("audiovae.safetensors", "audiovae.pth")

# torch.nn.utils.parametrizations.weight_norm names the same two tensors differently
_PARAMETRIZED_SUFFIXES = {
    ".parametrizations.weight.original0": ".weight_g",
    ".parametrizations.weight.original1": ".weight_v",
}


def _to_upstream_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state.items():
        for new_style, old_style in _PARAMETRIZED_SUFFIXES.items():
            if key.endswith(new_style):
                key = key[: -len(new_style)] + old_style
                break
        out[key] = value
    return out


def load_audiovae_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read audiovae.safetensors / audiovae.pth (a file, or a checkpoint dir holding one) on CPU.

    .pth goes through torch.load(weights_only=True) and may nest the tensors under "state_dict".
    Keys saved with torch's parametrization-style weight norm are mapped to the weight_g/weight_v form.
    """
    path = Path(path)
    if path.is_dir():
        found = [path / name for name in AUDIOVAE_FILES if (path / name).is_file()]
        if not found:
            raise FileNotFoundError(
                f"{path}: no AudioVAE weights (expected one of {', '.join(AUDIOVAE_FILES)})"
            )
        path = found[0]
    return _to_upstream_keys(read_state_dict(path, "the AudioVAE weights"))


def load_audiovae_weights(vae: AudioVAE, state: dict[str, torch.Tensor], source: str = "state dict") -> None:
    """Strictly load `state` into `vae`; on mismatch raise listing missing, unexpected and misshaped keys."""
    problems = mismatches(vae.state_dict(), state)
    if problems:
        raise ValueError("\n".join([f"{source}: AudioVAE weights do not match the config", *problems]))
    vae.load_state_dict(state, strict=True)


def audiovae_state_dict_for_save(vae: AudioVAE) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors under upstream's key names, ready for safetensors or torch.save."""
    return {k: v.detach().to("cpu").contiguous() for k, v in vae.state_dict().items()}

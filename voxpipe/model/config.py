"""Typed VoxCPM2 configuration that reads and writes upstream's config.json unchanged.

Key names and defaults follow upstream voxcpm 2.0.3 so a checkpoint directory moves between
upstream and voxpipe in both directions. Upstream ignores unknown keys; we keep them (so they
round-trip) but warn, so a typo in a hand-written config does not pass silently. `device` and
`dtype` are carried only for round-tripping: voxpipe never casts or places tensors from them.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from voxpipe.errors import StepError
from voxpipe.files import read_json_object
from voxpipe.model.audiovae import AudioVAEConfig

ARCHITECTURE = "voxcpm2"

# Token ids upstream hard-codes around the audio segments (they must exist in every vocabulary).
AUDIO_START_ID = 101
AUDIO_END_ID = 102
REF_AUDIO_START_ID = 103
REF_AUDIO_END_ID = 104


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict that upstream parses back to the same values.

        Upstream types `kv_channels` as `int = None`: an explicit null fails its validation, so an
        unset head dim is written by leaving the key out.
        """
        data = self.model_dump(mode="json")
        _drop_null_kv_channels(data)
        return data

    def unknown_keys(self, prefix: str = "") -> list[str]:
        """Dotted paths of keys upstream would ignore, for the load-time warning."""
        found = [f"{prefix}{k}" for k in (self.model_extra or {})]
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, _Section):
                found += value.unknown_keys(f"{prefix}{name}.")
        return found


def _drop_null_kv_channels(data: dict[str, Any]) -> None:
    if "kv_channels" in data and data["kv_channels"] is None:
        del data["kv_channels"]
    for value in data.values():
        if isinstance(value, dict):
            _drop_null_kv_channels(value)


class RopeScalingConfig(_Section):
    """LongRoPE factors; upstream applies longrope whatever `type` says."""

    type: str
    long_factor: list[float]
    short_factor: list[float]
    original_max_position_embeddings: int


class MiniCPM4Config(_Section):
    """One MiniCPM-4 decoder stack (base LM; residual LM, encoder and DiT are derived from it)."""

    bos_token_id: int
    eos_token_id: int
    hidden_size: int
    intermediate_size: int
    max_position_embeddings: int
    num_attention_heads: int
    num_hidden_layers: int
    num_key_value_heads: int
    rms_norm_eps: float
    rope_scaling: RopeScalingConfig
    vocab_size: int
    use_mup: bool = True
    scale_emb: float
    dim_model_base: int
    scale_depth: float
    rope_theta: float
    kv_channels: int | None = None
    no_rope: bool = False

    @property
    def head_dim(self) -> int:
        return self.kv_channels if self.kv_channels else self.hidden_size // self.num_attention_heads

    @model_validator(mode="after")
    def _shapes_fit(self) -> MiniCPM4Config:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head dim {self.head_dim} must be even for rotary embeddings")
        if not self.no_rope:
            half = self.head_dim // 2
            for name in ("long_factor", "short_factor"):
                got = len(getattr(self.rope_scaling, name))
                if got != half:
                    raise ValueError(
                        f"rope_scaling.{name} has {got} entries, head dim {self.head_dim} needs {half}"
                    )
        return self

    def derive(self, **changes: Any) -> MiniCPM4Config:
        """A validated copy with some fields replaced (how upstream builds its other stacks)."""
        return MiniCPM4Config.model_validate({**self.model_dump(), **changes})


class CfmConfig(_Section):
    sigma_min: float = 1e-6
    solver: str = "euler"
    t_scheduler: str = "log-norm"
    training_cfg_rate: float = 0.1
    inference_cfg_rate: float = 1.0
    reg_loss_type: str = "l1"
    ratio_r_neq_t_range: tuple[float, float] = (0.25, 0.75)
    noise_cond_prob_range: tuple[float, float] = (0.0, 0.0)
    noise_cond_scale: float = 0.0


class LocalTransformerConfig(_Section):
    """Width of the local encoder (upstream `encoder_config`); other settings come from lm_config."""

    hidden_dim: int = 1024
    ffn_dim: int = 4096
    num_heads: int = 16
    num_layers: int = 4
    kv_channels: int | None = None


class LocalDiTConfig(LocalTransformerConfig):
    """Upstream `dit_config`: the local DiT width plus its flow-matching settings."""

    dit_mean_mode: bool = False
    cfm_config: CfmConfig


class VoxCPM2Config(_Section):
    architecture: str = "voxcpm"  # upstream's default when the key is missing; only voxcpm2 is accepted
    lm_config: MiniCPM4Config
    patch_size: int = 4
    feat_dim: int = 64
    residual_lm_num_layers: int = 8
    residual_lm_no_rope: bool = False
    scalar_quantization_latent_dim: int = 512
    scalar_quantization_scale: int = 9
    encoder_config: LocalTransformerConfig
    dit_config: LocalDiTConfig
    audio_vae_config: AudioVAEConfig | None = None
    max_length: int = 8192
    device: str = "cuda"
    dtype: str = "bfloat16"

    @model_validator(mode="after")
    def _consistent(self) -> VoxCPM2Config:
        if self.architecture.lower() != ARCHITECTURE:
            how = (
                ""
                if "architecture" in self.model_fields_set
                else " (upstream's default when the key is missing)"
            )
            raise ValueError(
                f"architecture is {self.architecture!r}{how}; voxpipe supports only {ARCHITECTURE!r}"
            )
        # build the derived stacks once so a shape problem is reported at load time, not mid-training
        self.residual_lm_config()
        self.encoder_lm_config()
        self.dit_lm_config()
        vocab = self.lm_config.vocab_size
        if vocab <= REF_AUDIO_END_ID:
            raise ValueError(
                f"lm_config.vocab_size {vocab} must exceed the audio marker id {REF_AUDIO_END_ID}"
            )
        if self.audio_vae_config is not None and self.audio_vae_config.latent_dim != self.feat_dim:
            raise ValueError(
                f"audio_vae_config.latent_dim {self.audio_vae_config.latent_dim} != feat_dim {self.feat_dim}"
            )
        return self

    # -- the stacks upstream derives from lm_config -------------------------------------------
    def residual_lm_config(self) -> MiniCPM4Config:
        return self.lm_config.derive(
            num_hidden_layers=self.residual_lm_num_layers, vocab_size=0, no_rope=self.residual_lm_no_rope
        )

    def _local_config(self, local: LocalTransformerConfig) -> MiniCPM4Config:
        return self.lm_config.derive(
            hidden_size=local.hidden_dim,
            intermediate_size=local.ffn_dim,
            num_attention_heads=local.num_heads,
            num_hidden_layers=local.num_layers,
            kv_channels=local.kv_channels,
            vocab_size=0,
        )

    def encoder_lm_config(self) -> MiniCPM4Config:
        return self._local_config(self.encoder_config)

    def dit_lm_config(self) -> MiniCPM4Config:
        return self._local_config(self.dit_config)

    # -- JSON ---------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> VoxCPM2Config:
        try:
            config = cls.model_validate(data)
        except ValidationError as e:
            raise StepError(f"{source}: not a valid VoxCPM2 config:\n{e}") from e
        unknown = config.unknown_keys()
        if unknown:
            warnings.warn(f"{source}: keys unknown to VoxCPM2 kept as-is: {', '.join(unknown)}", stacklevel=2)
        return config

    @classmethod
    def from_file(cls, path: str | Path) -> VoxCPM2Config:
        return cls.from_dict(read_json_object(Path(path), "model config"), source=str(path))

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "architecture": ARCHITECTURE}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n"


# -- presets --------------------------------------------------------------------------------------
def longrope_factors(n: int, top: float = 50.0) -> list[float]:
    """A MiniCPM-4-like factor curve: ~1 for high frequencies rising smoothly to `top` for low ones."""
    return [round(1.0 + (top - 1.0) / (1.0 + math.exp(-(i - 0.45 * n) / (0.09 * n))), 6) for i in range(n)]


def _lm(
    hidden: int, ffn: int, layers: int, heads: int, kv_heads: int, head_dim: int, vocab: int
) -> MiniCPM4Config:
    factors = longrope_factors(head_dim // 2)
    return MiniCPM4Config(
        bos_token_id=1,
        eos_token_id=2,
        hidden_size=hidden,
        intermediate_size=ffn,
        max_position_embeddings=32768,
        num_attention_heads=heads,
        num_hidden_layers=layers,
        num_key_value_heads=kv_heads,
        rms_norm_eps=1e-5,
        rope_scaling=RopeScalingConfig(
            type="longrope", long_factor=factors, short_factor=factors, original_max_position_embeddings=32768
        ),
        vocab_size=vocab,
        use_mup=False,
        scale_emb=12,
        dim_model_base=256,
        scale_depth=1.4,
        rope_theta=10000.0,
        kv_channels=head_dim,
    )


def _cfm() -> CfmConfig:
    return CfmConfig(inference_cfg_rate=2.0)


PresetName = Literal["tiny", "small", "voxcpm2"]


def preset(name: PresetName) -> VoxCPM2Config:
    """tiny: tests and demo (seconds per step on CPU); small: CPU benchmarks; voxcpm2: the real shape."""
    if name == "voxcpm2":
        return VoxCPM2Config(
            architecture=ARCHITECTURE,
            lm_config=_lm(2048, 6144, 28, 16, 2, 128, 73448),
            residual_lm_num_layers=8,
            residual_lm_no_rope=True,
            encoder_config=LocalTransformerConfig(
                hidden_dim=1024, ffn_dim=4096, num_heads=16, num_layers=12, kv_channels=128
            ),
            dit_config=LocalDiTConfig(
                hidden_dim=1024, ffn_dim=4096, num_heads=16, num_layers=12, kv_channels=128, cfm_config=_cfm()
            ),
            audio_vae_config=AudioVAEConfig(),
        )
    if name == "small":
        return VoxCPM2Config(
            architecture=ARCHITECTURE,
            lm_config=_lm(512, 1536, 6, 8, 2, 64, 2048),
            residual_lm_num_layers=2,
            residual_lm_no_rope=True,
            scalar_quantization_latent_dim=128,
            encoder_config=LocalTransformerConfig(
                hidden_dim=256, ffn_dim=1024, num_heads=4, num_layers=4, kv_channels=64
            ),
            dit_config=LocalDiTConfig(
                hidden_dim=256, ffn_dim=1024, num_heads=4, num_layers=4, kv_channels=64, cfm_config=_cfm()
            ),
            audio_vae_config=AudioVAEConfig(encoder_dim=32, decoder_dim=256, cond_dim=64),
            max_length=2048,
        )
    if name == "tiny":
        return VoxCPM2Config(
            architecture=ARCHITECTURE,
            lm_config=_lm(128, 384, 2, 4, 2, 32, 2048),
            residual_lm_num_layers=1,
            residual_lm_no_rope=True,
            scalar_quantization_latent_dim=32,
            encoder_config=LocalTransformerConfig(
                hidden_dim=64, ffn_dim=128, num_heads=2, num_layers=1, kv_channels=32
            ),
            dit_config=LocalDiTConfig(
                hidden_dim=64, ffn_dim=128, num_heads=2, num_layers=2, kv_channels=32, cfm_config=_cfm()
            ),
            audio_vae_config=AudioVAEConfig(encoder_dim=8, decoder_dim=64, cond_dim=32),
            max_length=1024,
        )
    raise StepError(f"unknown model preset {name!r}; choose tiny, small or voxcpm2")

"""Our calculator against a published VoxCPM2 figure, and the counting convention behind it.

A VoxCPM2 FSDP2 port reported, on one Ascend 910C die: L = 830 LM tokens, micro-batch 4,
0.987 s/step, 87.1 TFLOP/s, 24.6 % MFU, i.e. ~86.0 TFLOP per step. Comparing conventions at
that exact shape shows which one they used, so the two MFU figures can be compared fairly.
"""

from __future__ import annotations

from dataclasses import dataclass

from voxpipe.mfu.flops import BACKWARD_FACTOR, stack_flops, training_flops
from voxpipe.mfu.peak import lookup_peak
from voxpipe.model.config import VoxCPM2Config, preset
from voxpipe.model.memory import on_meta
from voxpipe.model.voxcpm2 import VoxCPM2


@dataclass(frozen=True)
class Published:
    device: str = "Ascend910_9391"
    batch_size: int = 4
    seq_len: int = 830
    step_time_s: float = 0.987
    tflops: float = 87.1
    mfu: float = 0.246

    @property
    def flops_per_step(self) -> float:
        return self.tflops * 1e12 * self.step_time_s


PUBLISHED = Published()


def parameter_count(config: VoxCPM2Config) -> int:
    """Trainable parameters (incl. the text embedding), counted on a meta-device build (`on_meta`: no
    initialiser runs, so torch does not import torch._dynamo for them, a second of every `voxpipe mfu`)."""
    with on_meta():
        model = VoxCPM2(config)
    return sum(p.numel() for p in model.parameters())


def frames_only_flops(config: VoxCPM2Config, batch_size: int, seq_len: int) -> float:
    """The convention that reproduces the published figure: the four transformer stacks only,
    full attention square, with the local stacks counted over audio frames alone (encoder P
    frames per patch without its special token; DiT previous + noisy patch, 2P, without the two
    condition tokens and the time token); no projections, FSQ or stop head."""
    rows = batch_size * seq_len
    p = config.patch_size
    forward = (
        stack_flops(config.lm_config, batch_size, seq_len)
        + stack_flops(config.residual_lm_config(), batch_size, seq_len)
        + stack_flops(config.encoder_lm_config(), rows, p)
        + stack_flops(config.dit_lm_config(), rows, 2 * p)
    )
    return float((1 + BACKWARD_FACTOR) * forward)


def published_check(published: Published = PUBLISHED) -> dict:
    """FLOPs per step of the published configuration under each convention, and what MFU each implies."""
    config = preset("voxcpm2")
    b, length = published.batch_size, published.seq_len
    peak, peak_source = lookup_peak(published.device)
    params = parameter_count(config)
    conventions = {
        "voxpipe (full attention square)": training_flops(config, b, length),
        "voxpipe, causal half of LM attention": training_flops(config, b, length, causal_half=True),
        "6 * params * LM tokens": 6.0 * params * b * length,
        "stacks only, local towers over audio frames (P, 2P)": frames_only_flops(config, b, length),
    }
    rows = {
        name: {
            "flops_per_step": flops,
            "tflops_per_device": flops / published.step_time_s / 1e12,
            "mfu": flops / published.step_time_s / peak,
            "vs_published": flops / published.flops_per_step - 1,
        }
        for name, flops in conventions.items()
    }
    return {
        "published": {
            "device": published.device,
            "batch_size": b,
            "seq_len": length,
            "step_time_s": published.step_time_s,
            "tflops_per_device": published.tflops,
            "mfu": published.mfu,
            "flops_per_step": published.flops_per_step,
        },
        "peak_flops": peak,
        "peak_source": peak_source,
        "parameters": params,
        "conventions": rows,
    }

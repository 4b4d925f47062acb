"""LoRA adapters for VoxCPM2: inject, train only the adapters, export in upstream's format, merge.

The wrapper keeps the wrapped layer's `weight`/`bias` as its own parameters, so every base key in
the state dict is unchanged (base checkpoints and FSDP2 full-state loading still match key for
key) and the adapters appear next to them as `<layer>.lora_A` / `<layer>.lora_B`, the names
upstream's `VoxCPM2Model.load_lora_weights` looks up. Adapter shapes, init (A kaiming-uniform,
B zero) and scaling alpha/r follow upstream; dropout acts on the adapter input, as in the LoRA
paper (upstream drops the adapter output instead; identical when dropout is 0 or in eval).

FSDP2 order in the trainer: build on meta -> `apply_lora` -> `fully_shard` -> `to_empty` ->
load base weights -> `reset_lora_parameters(model, seed)`. Exports gather DTensors, so call
`lora_state_dict` on every rank and write from one.
"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from voxpipe.errors import StepError
from voxpipe.files import atomic_write, atomic_write_text
from voxpipe.steps.train import LoraParams

LORA_WEIGHTS = "lora_weights.safetensors"
LORA_CONFIG = "lora_config.json"

# Name segments that torch wrappers insert (activation checkpointing, torch.compile, FSDP1).
_WRAPPER_PARTS = frozenset({"_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module"})
_ADAPTER_SUFFIXES = (".lora_A", ".lora_B")


class LoraLinear(nn.Module):
    """y = x W^T + b + scaling * dropout(x) A^T B^T, with W and b taken over from an nn.Linear."""

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float):
        super().__init__()
        if r <= 0:
            raise ValueError(f"LoRA rank must be positive, got {r}")
        self.in_features = base.in_features
        self.out_features = base.out_features
        self.r = r
        self.scaling = alpha / r  # a plain float: nothing for to_empty or FSDP to leave uninitialised
        self.weight = base.weight
        self.bias = base.bias
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Parameter(torch.empty(r, self.in_features, **factory))
        self.lora_B = nn.Parameter(torch.empty(self.out_features, r, **factory))
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.reset_lora_parameters()

    def reset_lora_parameters(self, generator: torch.Generator | None = None) -> None:
        """A kaiming-uniform (as nn.Linear), B zero: the layer starts out equal to the base layer."""
        with torch.no_grad():
            a = _kaiming(tuple(self.lora_A.shape), generator)
            for param, full in ((self.lora_A, a), (self.lora_B, torch.zeros(self.lora_B.shape))):
                if param.device.type == "meta":
                    continue
                full = full.to(device=param.device, dtype=param.dtype)
                if isinstance(param, DTensor):
                    full = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
                param.copy_(full)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = F.linear(x, self.weight, self.bias)
        return base + F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B) * self.scaling

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, r={self.r}"


def _kaiming(shape: tuple[int, ...], generator: torch.Generator | None) -> torch.Tensor:
    """nn.Linear's weight init, drawn in fp32 on CPU so a seed gives the same values everywhere."""
    out = torch.empty(shape, dtype=torch.float32)
    return nn.init.kaiming_uniform_(out, a=math.sqrt(5), generator=generator)


def clean_name(name: str) -> str:
    """A parameter/module name without wrapper segments: the name upstream's model uses."""
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_PARTS)


def is_adapter(name: str) -> bool:
    return name.endswith(_ADAPTER_SUFFIXES)


def _targets(model: nn.Module, params: LoraParams) -> list[tuple[nn.Module, str]]:
    """(parent module, attribute) of every nn.Linear to wrap, picked as upstream's LoRAConfig picks them:
    by attribute name inside the enabled stacks. A configured name that matches no layer is an error
    (a typo would otherwise train fewer adapters than asked for, silently)."""
    groups = []
    if params.target_lm:
        groups.append(("target_modules_lm", [model.base_lm, model.residual_lm], params.target_modules_lm))
    if params.target_dit:
        groups.append(("target_modules_dit", [model.feat_decoder.estimator], params.target_modules_dit))
    found = []
    for key, stacks, names in groups:
        hits = set()
        for stack in stacks:
            for parent in stack.modules():
                for attr, child in parent.named_children():
                    if attr in names and isinstance(child, nn.Linear):
                        found.append((parent, attr))
                        hits.add(attr)
        _check_names(key, names, hits)
    if params.target_proj:
        hits = {a for a in params.target_proj_modules if isinstance(getattr(model, a, None), nn.Linear)}
        _check_names("target_proj_modules", params.target_proj_modules, hits)
        found += [(model, a) for a in params.target_proj_modules]
    return found


def _check_names(key: str, names: list[str], hits: set[str]) -> None:
    missing = [n for n in names if n not in hits]
    if missing:
        raise StepError(f"train.lora.{key}: {', '.join(missing)} name no nn.Linear layer of VoxCPM2 there "
                        "(upstream's defaults: q_proj, v_proj, k_proj, o_proj; the MLPs: gate_proj, "
                        "up_proj, down_proj)")


def apply_lora(model: nn.Module, params: LoraParams) -> list[str]:
    """Wrap the targeted layers in place, freeze everything else; returns the adapter parameter names.

    `params.enabled` is the caller's switch; this always applies. Works on a meta-device model
    (adapters stay on meta until `to_empty`). Call before `fully_shard` so the adapters are
    sharded with their layer like any other parameter.
    """
    if any(isinstance(m, LoraLinear) for m in model.modules()):
        raise ValueError("LoRA is already applied to this model")
    targets = _targets(model, params)
    if not targets:
        raise StepError("train.lora selects no layers: target_lm, target_dit and target_proj are all off")
    for parent, attr in targets:
        setattr(parent, attr, LoraLinear(getattr(parent, attr), params.r, params.alpha, params.dropout))
    names = []
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter(name))
        if param.requires_grad:
            names.append(name)
    return names


def reset_lora_parameters(model: nn.Module, seed: int = 0) -> None:
    """Re-initialise every adapter from `seed` and its layer name: the same values for any world size,
    wrapping or sharding (needed after `to_empty`, which leaves the meta-built adapters uninitialised)."""
    for name, module in model.named_modules():
        if isinstance(module, LoraLinear):
            gen = torch.Generator().manual_seed(
                (seed * 1_000_003 + zlib.crc32(clean_name(name).encode())) % 2**63
            )
            module.reset_lora_parameters(gen)


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Adapter tensors on CPU under upstream's names (`base_lm.layers.0.self_attn.q_proj.lora_A`, ...).

    Sharded (DTensor) adapters are gathered: under FSDP2 every rank must call this.
    """
    out = {}
    for name, param in model.named_parameters():
        if is_adapter(name):
            full = param.full_tensor() if isinstance(param, DTensor) else param
            out[clean_name(name)] = full.detach().to("cpu", copy=True).contiguous()
    if not out:
        raise ValueError("the model has no LoRA adapters (apply_lora was not called)")
    return out


def upstream_lora_config(params: LoraParams) -> dict:
    """The fields of upstream's LoRAConfig (`LoRAConfig(**this)` rebuilds the same adapters)."""
    return {
        "enable_lm": params.target_lm,
        "enable_dit": params.target_dit,
        "enable_proj": params.target_proj,
        "r": params.r,
        "alpha": params.alpha,
        "dropout": params.dropout,
        "target_modules_lm": list(params.target_modules_lm),
        "target_modules_dit": list(params.target_modules_dit),
        "target_proj_modules": list(params.target_proj_modules),
    }


def save_lora(
    state: dict[str, torch.Tensor], params: LoraParams, out_dir: str | Path, base_model: str | None = None
) -> Path:
    """Write lora_weights.safetensors + lora_config.json the way upstream's training script does."""
    out = Path(out_dir)
    atomic_write(out / LORA_WEIGHTS, lambda tmp: save_file(state, tmp, metadata={"format": "pt"}))
    config = {"base_model": base_model, "lora_config": upstream_lora_config(params)}
    atomic_write_text(out / LORA_CONFIG, json.dumps(config, indent=2) + "\n")
    return out


def export_lora(
    model: nn.Module, params: LoraParams, out_dir: str | Path, base_model: str | None = None
) -> Path:
    """`save_lora(lora_state_dict(model), ...)` for an unsharded model."""
    return save_lora(lora_state_dict(model), params, out_dir, base_model)


def _fold(weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float) -> torch.Tensor:
    """W + scaling * B @ A, computed in fp32 and returned in W's dtype."""
    delta = (lora_b.float() @ lora_a.float()) * scaling
    return (weight.float() + delta.to(weight.device)).to(weight.dtype)


def merge_lora(model: nn.Module) -> int:
    """Fold every adapter into its base weight and put plain nn.Linear layers back, in place.

    The model's state dict then has exactly the base keys, so `save_pretrained` writes an ordinary
    checkpoint. For unsharded models; a sharded run merges its gathered state dict with
    `merge_lora_state_dict`. Returns the number of merged layers.
    """
    merged = 0
    for parent in list(model.modules()):
        for attr, child in list(parent.named_children()):
            if not isinstance(child, LoraLinear):
                continue
            with torch.no_grad():
                child.weight.copy_(_fold(child.weight, child.lora_A, child.lora_B, child.scaling))
            plain = nn.Linear(
                child.in_features, child.out_features, bias=child.bias is not None, device="meta"
            )
            plain.weight = child.weight
            plain.bias = child.bias
            setattr(parent, attr, plain)
            merged += 1
    return merged


def merge_lora_state_dict(state: dict[str, torch.Tensor], params: LoraParams) -> dict[str, torch.Tensor]:
    """A full state dict with adapters -> the plain checkpoint state dict (adapters folded, keys dropped).

    Consumes `state` and returns it: each base weight is replaced by its folded copy as the merge
    goes, so a merge of the real model holds one extra tensor at a time, not a second model.
    """
    prefixes = {
        suffix: {k[: -len(suffix)] for k in state if k.endswith(suffix)} for suffix in _ADAPTER_SUFFIXES
    }
    unpaired = prefixes[".lora_A"] ^ prefixes[".lora_B"]
    if unpaired:
        raise ValueError(f"adapters without their lora_A/lora_B partner: {sorted(unpaired)[:5]}")
    missing = sorted(p for p in prefixes[".lora_A"] if f"{p}.weight" not in state)
    if missing:
        raise ValueError(f"{missing[0]}: adapter without its base weight in the state dict")
    for prefix in sorted(prefixes[".lora_A"]):
        key = f"{prefix}.weight"
        lora_a, lora_b = state.pop(f"{prefix}.lora_A"), state.pop(f"{prefix}.lora_B")
        state[key] = _fold(state.pop(key), lora_a, lora_b, params.alpha / params.r)
    return state

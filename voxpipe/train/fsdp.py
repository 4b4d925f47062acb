"""Build the trained VoxCPM2 the FSDP2 way: meta device, per-layer sharding, one broadcast load.

Order (torchtitan's recipe): build on meta -> (LoRA adapters) -> model kernels (voxpipe.model.npu)
-> (activation checkpointing) -> (torch.compile per block) -> `fully_shard` every decoder layer of
the base LM, residual LM, local encoder and local DiT, then the root -> `to_empty` on the device
-> rank 0 reads model.safetensors once and `set_model_state_dict(..., broadcast_from_rank0=True)`
sends each rank only its shards. No rank ever materialises a random init or a second full copy.
The AudioVAE is not part of this model.

No custom gradient divide factor is set anywhere: HCCL lacks the PREMUL_SUM reduce op that a
custom factor needs, and FSDP2's default averaging is what we want.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable import checkpoint
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from voxpipe.errors import StepError
from voxpipe.model.checksums import verify_checksums
from voxpipe.model.config import VoxCPM2Config
from voxpipe.model.io import read_model_state
from voxpipe.model.memory import ensure_fits
from voxpipe.model.npu import OFF, NpuKernels, use_npu_kernels
from voxpipe.model.strict_load import mismatches
from voxpipe.model.voxcpm2 import VoxCPM2
from voxpipe.params import LoraParams
from voxpipe.train import lora
from voxpipe.train.device import Runtime

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def compute_dtype(choice: str, device: torch.device) -> torch.dtype:
    """auto: bf16 on accelerators (their matmul units), fp32 on CPU (exact, and faster there)."""
    if choice == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return DTYPES[choice]


def _check_keys(model: nn.Module, state: dict[str, torch.Tensor], source: Path) -> str | None:
    """Every base key present with the right shape, nothing extra; adapters are not in a base checkpoint."""
    own = {lora.clean_name(k): v for k, v in model.state_dict().items() if not lora.is_adapter(k)}
    problems = mismatches(own, state)
    if not problems:
        return None
    return "\n".join([f"{source}: base weights do not match the model built from config.json", *problems])


def load_base_weights(model: nn.Module, base_dir: Path, rt: Runtime) -> None:
    """Rank 0 reads the checkpoint; every rank receives just its shards (collective)."""
    state: dict[str, torch.Tensor] = {}
    error: str | None = None
    if rt.is_main:
        try:
            verify_checksums(base_dir)  # a base that ships SHA256SUMS (the demo's) is the one that was made
            state = read_model_state(base_dir)
            error = _check_keys(model, state, base_dir / "model.safetensors")
        except StepError as e:
            error = str(e)
    verdict = [error]
    dist.broadcast_object_list(verdict, src=0)  # all ranks fail together instead of hanging
    if verdict[0] is not None:
        raise StepError(verdict[0])
    has_adapters = any(lora.is_adapter(k) for k in model.state_dict())
    result = set_model_state_dict(
        model,
        state,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=not has_adapters),
    )
    not_loaded = [k for k in result.missing_keys if not lora.is_adapter(k)]
    if not_loaded or result.unexpected_keys:
        raise StepError(f"{base_dir}: keys not loaded: {not_loaded}, unexpected: {result.unexpected_keys}")


def shard_model(
    model: VoxCPM2,
    rt: Runtime,
    dtype: torch.dtype,
    activation_checkpointing: bool,
    compile_blocks: bool = False,
) -> None:
    """`fully_shard` every decoder layer, then the root: params in `dtype`, gradients reduced in fp32.

    compile_blocks: torch.compile each decoder layer in place (`Module.compile` keeps parameter
    names); the blocks of a stack share one compiled graph, so each stack compiles once.
    """
    layers = model.layers_to_shard()
    for layer in layers:
        if activation_checkpointing:
            checkpoint(layer)  # composable: keeps parameter names, so checkpoints stay portable
        if compile_blocks:
            layer.compile()
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, mesh=rt.mesh, mp_policy=policy)
    fully_shard(model, mesh=rt.mesh, mp_policy=policy)


def build_model(
    config: VoxCPM2Config,
    base_dir: Path,
    rt: Runtime,
    *,
    dtype: torch.dtype,
    lora_params: LoraParams,
    activation_checkpointing: bool,
    seed: int,
    kernels: NpuKernels = OFF,
    compile_blocks: bool = False,
) -> VoxCPM2:
    """The sharded, loaded model ready for training (only adapters trainable when LoRA is on)."""
    with torch.device("meta"):
        model = VoxCPM2(config)
    if lora_params.enabled:
        lora.apply_lora(model, lora_params)
    use_npu_kernels(model, kernels)
    shard_model(model, rt, dtype, activation_checkpointing, compile_blocks)
    needed = sum(p.numel() for p in model.parameters()) * 4 // rt.world_size  # fp32 masters, sharded
    ensure_fits(needed, rt.device, "the model", base_dir / "config.json")
    model.to_empty(device=rt.device)
    # Buffers would be garbage after to_empty; ours computes RoPE per call and registers none.
    buffers = [name for name, _ in model.named_buffers()]
    if buffers:
        raise StepError(f"the model has buffers that to_empty leaves uninitialised: {buffers}")
    load_base_weights(model, base_dir, rt)
    if lora_params.enabled:
        lora.reset_lora_parameters(model, seed)
    return model

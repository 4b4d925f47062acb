"""Build the trained VoxCPM2 the FSDP2 way: meta device, per-layer sharding, one broadcast load.

Order (torchtitan's recipe): build on meta -> (LoRA adapters) -> model kernels (voxpipe.model.npu)
-> (activation checkpointing) -> (torch.compile per block) -> `fully_shard` every decoder layer of
the base LM, residual LM, local encoder and local DiT, then the root -> `to_empty` on the device
-> rank 0 streams model.safetensors one tensor at a time and scatters each to its shards
(`distribute_tensor(..., src_data_rank=0)`). No rank ever materialises a random init, and the host
never holds the full state dict beside the model: the load adds one tensor (the largest, the
token embedding) to rank 0's memory, not a second copy of the model. The AudioVAE is not part of
this model.

With LoRA the frozen base is kept in the compute dtype (bf16 when train.dtype is bfloat16): it is
never updated, so fp32 masters of it would only double its memory; FSDP2's mixed precision casts
to that dtype for compute anyway, so the forward sees the same values. Only the adapters (and
their gradients and AdamW state) are fp32.

No custom gradient divide factor is set anywhere: HCCL lacks the PREMUL_SUM reduce op that a
custom factor needs, and FSDP2's default averaging is what we want.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open
from torch import nn
from torch.distributed._composable import checkpoint
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from voxpipe.errors import StepError
from voxpipe.model.checksums import verify_checksums
from voxpipe.model.config import VoxCPM2Config
from voxpipe.model.io import MODEL_FILES, read_model_state
from voxpipe.model.memory import ensure_fits, on_meta
from voxpipe.model.npu import OFF, NpuKernels, use_npu_kernels
from voxpipe.model.strict_load import mismatches
from voxpipe.model.voxcpm2 import VoxCPM2
from voxpipe.steps.train import LoraParams
from voxpipe.train import lora
from voxpipe.train.device import Runtime

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def compute_dtype(choice: str, device: torch.device) -> torch.dtype:
    """auto: bf16 on accelerators (their matmul units), fp32 on CPU (exact, and faster there)."""
    if choice == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return DTYPES[choice]


def _check_keys(model: nn.Module, shapes: dict[str, tuple[int, ...]], source: Path) -> str | None:
    """Every base key present with the right shape, nothing extra; adapters are not in a base checkpoint."""
    own = {lora.clean_name(k): v for k, v in model.state_dict().items() if not lora.is_adapter(k)}
    problems = mismatches(own, {k: torch.empty(shape, device="meta") for k, shape in shapes.items()})
    if not problems:
        return None
    return "\n".join([f"{source}: base weights do not match the model built from config.json", *problems])


class _Weights:
    """Rank 0's view of the base checkpoint: model.safetensors read one tensor at a time (its header
    gives the shapes without reading a weight); a pytorch_model.bin can only be read whole."""

    def __init__(self, base_dir: Path):
        path = base_dir / MODEL_FILES[0]
        self.source = path if path.is_file() else base_dir / MODEL_FILES[1]
        self._file = None
        self._state: dict[str, torch.Tensor] = {}
        if path.is_file():
            try:
                self._file = safe_open(str(path), framework="pt", device="cpu")
                self.shapes = {k: tuple(self._file.get_slice(k).get_shape()) for k in self._file.keys()}
            except Exception as e:
                raise StepError(f"{path}: cannot read model weights: {e}") from e
        else:
            self._state = read_model_state(base_dir)
            self.shapes = {k: tuple(v.shape) for k, v in self._state.items()}

    def get(self, key: str) -> torch.Tensor:
        return self._file.get_tensor(key) if self._file is not None else self._state.pop(key)


def load_base_weights(model: nn.Module, base_dir: Path, rt: Runtime) -> None:
    """Rank 0 streams the checkpoint; every rank receives just its shards (collective).

    Tensor by tensor: rank 0 reads one weight, casts it to the parameter's dtype and scatters it
    (`distribute_tensor` from rank 0); the other ranks pass a placeholder of the same shape. The
    host's extra memory is one full tensor, not the whole state dict.
    """
    weights: _Weights | None = None
    error: str | None = None
    if rt.is_main:
        try:
            verify_checksums(base_dir)  # a base that ships SHA256SUMS (the demo's) is the one that was made
            weights = _Weights(base_dir)
            error = _check_keys(model, weights.shapes, weights.source)
        except StepError as e:
            error = str(e)
    verdict = [error]
    dist.broadcast_object_list(verdict, src=0)  # all ranks fail together instead of hanging
    if verdict[0] is not None:
        raise StepError(verdict[0], every_rank=True)
    with torch.no_grad():
        for name, param in model.state_dict().items():
            key = lora.clean_name(name)
            if lora.is_adapter(key):
                continue  # initialised by reset_lora_parameters
            full = weights.get(key) if weights is not None else None
            if not isinstance(param, DTensor):
                raise StepError(f"{key}: expected a sharded parameter (call shard_model before loading)")
            if full is None:
                full = torch.empty(param.shape, dtype=param.dtype)
            full = full.to(device=rt.device, dtype=param.dtype)
            param.copy_(distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=0))
            del full


def prepare_model(
    config: VoxCPM2Config, dtype: torch.dtype, lora_params: LoraParams, kernels: NpuKernels = OFF
) -> VoxCPM2:
    """The model on the meta device as train shards it: LoRA adapters (their frozen base in `dtype`),
    the device's kernels. Shared by train and `voxpipe plan`, so the plan models what train runs."""
    with on_meta():
        model = VoxCPM2(config)
    if lora_params.enabled:
        lora.apply_lora(model, lora_params)
        for param in model.parameters():
            if not param.requires_grad:
                param.data = param.data.to(dtype)
    use_npu_kernels(model, kernels)
    return model


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
    """The sharded, loaded model ready for training (only adapters trainable when LoRA is on).

    On the CPU the parameters' bytes are checked against the host's free RAM first; on an
    accelerator train has already checked the whole plan (voxpipe.train.plan) against the device.
    """
    model = prepare_model(config, dtype, lora_params, kernels)
    shard_model(model, rt, dtype, activation_checkpointing, compile_blocks)
    if rt.device.type == "cpu":
        needed = sum(p.numel() * p.element_size() for p in model.parameters()) // rt.world_size
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

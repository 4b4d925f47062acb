"""Consolidate the trained shards into a checkpoint folder in upstream's layout.

`export/` is always a plain, complete checkpoint (config.json, model.safetensors, audiovae,
tokenizer files) that our `from_pretrained` and upstream's `VoxCPM2Model.from_local` load; with
LoRA its weights are the adapters merged into the base, and `export/lora/` holds the adapters
alone (lora_weights.safetensors + lora_config.json) for upstream's `load_lora_weights`; the merge
folds them into the base checkpoint's own tensors (training keeps the frozen base in bf16).
Non-finite weights are never exported: a model of NaNs would otherwise be evaluated and registered.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from voxpipe.errors import StepError
from voxpipe.model.audiovae import AudioVAE, load_audiovae_state_dict, load_audiovae_weights
from voxpipe.model.config import VoxCPM2Config
from voxpipe.model.encoder import TOKENIZER_FILES
from voxpipe.model.io import load_weights_strict, read_model_state, save_pretrained
from voxpipe.model.memory import on_meta
from voxpipe.model.tokenizer import VoxTokenizer
from voxpipe.model.voxcpm2 import VoxCPM2
from voxpipe.steps.train import LoraParams
from voxpipe.train import lora
from voxpipe.train.device import Runtime

LORA_SUBDIR = "lora"


def export_checkpoint(
    model: nn.Module,
    config: VoxCPM2Config,
    base_dir: Path,
    out_dir: Path,
    rt: Runtime,
    *,
    lora_params: LoraParams,
    dtype: torch.dtype,
    step: int,
) -> Path | None:
    """Collective gather; rank 0 writes `out_dir` (returned there, None elsewhere).

    With LoRA only the adapters are gathered: the frozen base is read from the base checkpoint.
    Rank 0's host holds the exported checkpoint once, in `dtype` (its file size), plus one tensor
    in flight: what `voxpipe plan` reports as the export's host memory.
    """
    gathered = lora.lora_state_dict(model) if lora_params.enabled else gathered_state(model, dtype, rt)
    verdict = [_nonfinite(gathered) if rt.is_main else None]  # only rank 0 holds the full state
    dist.broadcast_object_list(verdict, src=0)
    if verdict[0]:
        bad, total = verdict[0]
        listed = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise StepError(
            f"step {step}: {len(bad)} of {total} trained tensors hold NaN or inf values ({listed}); "
            f"not exporting to {out_dir}. Lower train.lr (or check the encoded data), and start fresh "
            "with --no-resume, as the checkpoints of this run hold the same weights"
        )
    if not rt.is_main:
        rt.barrier()
        return None
    full = gathered
    if lora_params.enabled:
        lora.save_lora(gathered, lora_params, out_dir / LORA_SUBDIR, base_model=str(base_dir))
        # the frozen base as the checkpoint has it: training kept it in the compute dtype (bf16), so
        # an fp32 base would otherwise come back rounded; it never changed, so this is the same model.
        # Cast one tensor at a time and merge in place: one dict, never a second copy of the model.
        full = read_model_state(base_dir)
        for key, value in full.items():
            full[key] = value.to(dtype) if value.is_floating_point() else value
        full.update(gathered)
        full = lora.merge_lora_state_dict(full, lora_params)
    with on_meta():
        plain = VoxCPM2(config)
    load_weights_strict(plain, full, "trained weights", dtype)  # in the saved dtype: no second copy
    # built on the host, its init draws from torch's CPU generator: forked, so an export between a
    # checkpoint and the next step leaves the training streams as the checkpoint saved them (a resume
    # from that checkpoint then repeats the steps exactly)
    with torch.random.fork_rng(devices=[]):
        vae = AudioVAE(config.audio_vae_config)
    load_audiovae_weights(vae, load_audiovae_state_dict(base_dir), source=str(base_dir))
    save_pretrained(plain, vae, VoxTokenizer.from_dir(base_dir), out_dir, dtype=dtype)
    # the base's own tokenizer files, byte for byte (the tokenizer is not trained)
    for name in TOKENIZER_FILES:
        if (base_dir / name).is_file():
            shutil.copyfile(base_dir / name, out_dir / name)
    rt.barrier()
    return out_dir


def gathered_state(model: nn.Module, dtype: torch.dtype, rt: Runtime) -> dict[str, torch.Tensor]:
    """The full state dict on rank 0's CPU in `dtype` (empty elsewhere; collective).

    One parameter at a time: each sharded tensor is gathered, cast and moved to the host before
    the next, so rank 0 never holds the fp32 masters whole beside their cast copy.
    """
    out = {}
    for name, value in model.state_dict().items():
        full = value.full_tensor() if isinstance(value, DTensor) else value
        if rt.is_main:
            full = full.detach().to("cpu", dtype if full.is_floating_point() else full.dtype)
            out[lora.clean_name(name)] = full.contiguous()
        del full
    return out


def _nonfinite(state: dict[str, torch.Tensor]) -> tuple[list[str], int] | None:
    """(names of the floating tensors with a NaN/inf, how many tensors there are), or None if all finite."""
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    return (bad, len(state)) if bad else None

"""Checkpoint directories in upstream's layout.

Layout: config.json, model.safetensors (everything but the VAE; upstream ships bf16),
audiovae.safetensors (fp32, old-style weight_norm keys), tokenizer.json, tokenizer_config.json,
special_tokens_map.json. Reading also accepts pytorch_model.bin and audiovae.pth. Loading is
strict: any missing, unexpected or misshaped key is an error that lists them all (upstream's
strict=False would silently keep random weights).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from voxpipe.errors import StepError
from voxpipe.files import atomic_write_text, read_state_dict
from voxpipe.model.audiovae import (
    AudioVAE,
    audiovae_state_dict_for_save,
    load_audiovae_state_dict,
    load_audiovae_weights,
)
from voxpipe.model.checksums import verify_checksums
from voxpipe.model.config import VoxCPM2Config
from voxpipe.model.memory import ensure_fits, on_meta, parameter_bytes
from voxpipe.model.npu import KernelsChoice, resolve_kernels, use_npu_kernels
from voxpipe.model.strict_load import mismatches
from voxpipe.model.tokenizer import VoxTokenizer
from voxpipe.model.voxcpm2 import VoxCPM2
from voxpipe.voxcpm2_format import checkpoint_config

MODEL_FILES = ("model.safetensors", "pytorch_model.bin")
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def read_model_state(directory: Path) -> dict[str, torch.Tensor]:
    """model.safetensors, else pytorch_model.bin through torch.load(weights_only=True)."""
    for name in MODEL_FILES:
        if (directory / name).is_file():
            return read_state_dict(directory / name, "the model weights")
    raise StepError(f"{directory}: no model weights (expected one of {', '.join(MODEL_FILES)})")


def load_weights_strict(
    model: VoxCPM2, state: dict[str, torch.Tensor], source: str, dtype: torch.dtype
) -> None:
    """Load `state` into `model` (built on any device, also meta), failing with every mismatch listed."""
    problems = mismatches(model.state_dict(), state)
    if problems:
        header = f"{source}: weights do not match the model built from config.json"
        raise StepError("\n".join([header, *problems]))
    cast = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    model.load_state_dict(cast, strict=True, assign=True)


def from_pretrained(
    directory: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    kernels: KernelsChoice = "auto",
) -> VoxCPM2:
    """The model (parameters in `dtype`, fp32 masters by default) with its VAE (fp32) and tokenizer attached.

    kernels: `model.kernels` (voxpipe.model.npu): auto = the fused NPU kernels on an NPU, eager elsewhere.

    The model is built on the meta device and takes the checkpoint's tensors directly, so even
    the 2.29 B shape loads without a throw-away random initialisation.
    """
    directory = Path(directory)
    config_path = checkpoint_config(directory)
    verify_checksums(directory)  # a folder that ships SHA256SUMS (the demo base) is the one that was made
    config = VoxCPM2Config.from_file(config_path)
    with on_meta():
        model = VoxCPM2(config)
    vae_bytes = parameter_bytes(lambda: AudioVAE(config.audio_vae_config))
    needed = sum(p.numel() for p in model.parameters()) * torch.empty((), dtype=dtype).element_size()
    ensure_fits(needed + vae_bytes, torch.device(device), "the model and its AudioVAE", config_path)
    load_weights_strict(model, read_model_state(directory), str(directory), dtype)
    model.to(device)
    use_npu_kernels(model, resolve_kernels(kernels, torch.device(device)))

    vae = AudioVAE(config.audio_vae_config)
    try:
        load_audiovae_weights(vae, load_audiovae_state_dict(directory), source=str(directory))
        tokenizer = VoxTokenizer.from_dir(directory)
    except (FileNotFoundError, ValueError) as e:
        raise StepError(str(e)) from e
    vae.requires_grad_(False)
    return model.attach(vae.to(device).eval(), tokenizer)


def save_pretrained(
    model: VoxCPM2,
    vae: AudioVAE,
    tokenizer: VoxTokenizer,
    directory: str | Path,
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """Write the upstream layout; model weights in `dtype` (bf16 like upstream), the VAE in fp32.

    config.json records `dtype` so upstream runs the weights in the precision they were saved in,
    and the VAE's config so the directory describes exactly the files next to it.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = model.config.model_copy(
        deep=True, update={"dtype": DTYPE_NAMES[dtype], "audio_vae_config": vae.config}
    )
    state = {
        k: (v.detach().to("cpu", dtype) if v.is_floating_point() else v.detach().cpu()).contiguous()
        for k, v in model.state_dict().items()
    }
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    vae_state = audiovae_state_dict_for_save(vae)
    save_file(vae_state, str(directory / "audiovae.safetensors"), metadata={"format": "pt"})
    tokenizer.save(directory)
    atomic_write_text(directory / "config.json", config.to_json())
    return directory

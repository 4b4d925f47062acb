"""The base checkpoint's AudioVAE and tokenizer, with content hashes: what turns clips and text into
model inputs. `encode` runs it over a data set once; train and export read the same checkpoint files.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from voxpipe.errors import StepError
from voxpipe.model.audiovae import AudioVAE, load_audiovae_state_dict, load_audiovae_weights
from voxpipe.model.checksums import verify_checksums
from voxpipe.model.config import VoxCPM2Config
from voxpipe.model.memory import ensure_fits, parameter_bytes
from voxpipe.model.tokenizer import VoxTokenizer
from voxpipe.voxcpm2_format import checkpoint_config

# Bump when the latent recipe changes (padding, cropping) so older latents are never reused.
RECIPE = "pad-right-to-hop-x-patch/v1"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass
class Encoder:
    vae: AudioVAE
    tokenizer: VoxTokenizer
    patch_size: int
    vae_hash: str
    tokenizer_hash: str

    @property
    def multiple(self) -> int:
        """Samples each clip is right-padded to a multiple of (hop × patch, 2560 for VoxCPM2)."""
        return self.vae.hop_length * self.patch_size


def _digest_tensors(state: dict[str, torch.Tensor], extra: str) -> str:
    h = hashlib.sha256(extra.encode())
    for key in sorted(state):
        t = state[key].detach().cpu().contiguous()
        h.update(f"{key}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def load_encoder(model_dir: str | Path) -> Encoder:
    """AudioVAE (fp32, eval, frozen) + tokenizer from a checkpoint dir, with their content hashes.

    The VAE hash covers the weights, the VAE config, the patch size and RECIPE: anything that
    changes a latent changes the key, so stale latents are never picked up.
    """
    model_dir = Path(model_dir)
    config_path = checkpoint_config(model_dir, way_out="run `voxpipe init-model`")
    verify_checksums(model_dir)
    config = VoxCPM2Config.from_file(config_path)
    needed = parameter_bytes(lambda: AudioVAE(config.audio_vae_config))
    ensure_fits(needed, torch.device("cpu"), "the AudioVAE", config_path)
    vae = AudioVAE(config.audio_vae_config)
    try:
        state = load_audiovae_state_dict(model_dir)
        load_audiovae_weights(vae, state, source=str(model_dir))
        tokenizer = VoxTokenizer.from_dir(model_dir)
    except (FileNotFoundError, ValueError) as e:
        raise StepError(str(e)) from e
    vae.float().eval().requires_grad_(False)
    vae_hash = _digest_tensors(
        state, json.dumps([vae.config.model_dump(mode="json"), config.patch_size, RECIPE], sort_keys=True)
    )
    tok = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = model_dir / name
        tok.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"") + b"\0")
    return Encoder(vae, tokenizer, config.patch_size, vae_hash, tok.hexdigest())


def encode_batch(
    vae: AudioVAE, wavs: list[np.ndarray], multiple: int, device: torch.device | str = "cpu"
) -> list[torch.Tensor]:
    """Latents [frames, D] (fp32, CPU) of each 1-D waveform, encoded together in one VAE call.

    Each clip is right-padded to a multiple of `multiple` samples (as upstream's packer does),
    then to the longest clip; its frames are cropped back to its own padded length.
    """
    padded = [math.ceil(len(w) / multiple) * multiple for w in wavs]
    batch = torch.zeros(len(wavs), 1, max(padded), dtype=torch.float32)
    for i, w in enumerate(wavs):
        batch[i, 0, : len(w)] = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
    with torch.inference_mode():
        z = vae.encode(batch.to(device))
    return [z[i, :, : n // vae.hop_length].T.float().cpu().contiguous() for i, n in enumerate(padded)]


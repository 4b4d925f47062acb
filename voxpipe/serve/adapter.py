"""A LoRA run served as its base checkpoint plus the adapter, without a merge, and the identity it serves.

A LoRA run's export (train/export.py) is the merged checkpoint with `lora/` beside it in upstream
VoxCPM's native layout (`lora_config.json` + `lora_weights.safetensors`); `register` logs the whole
folder as the model version's "checkpoint" artifact, so the registered version carries the adapter
too. Serving the merged weights needs nothing but the folder; serving base + adapter (one base in
memory for many voices, the way vLLM-Omni loads an adapter at startup) needs the base named, since
the path the trainer recorded in `lora_config.json` is the training machine's.

`ServedModel.identity()` is what a server stamps on every response and metric: the model version
(the pinned `models:/NAME/N` or the folder), how the adapter is applied, and the sha256 of
`lora_weights.safetensors`, the bytes that make this voice.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import ValidationError

from voxpipe.errors import StepError
from voxpipe.steps.train import LoraParams
from voxpipe.train.export import LORA_SUBDIR
from voxpipe.train.lora import LORA_CONFIG, LORA_WEIGHTS, apply_lora
from voxpipe.voxcpm2_format import checkpoint_config

if TYPE_CHECKING:
    import torch

    from voxpipe.model.voxcpm2 import VoxCPM2

AdapterMode = Literal["none", "merged", "unmerged"]


@dataclass(frozen=True)
class ServedModel:
    model: VoxCPM2
    version: str  # "models:/NAME/N" for a registered version, else the checkpoint folder
    adapter: AdapterMode  # none: a full fine-tune or the base; merged: folded in; unmerged: base + adapter
    adapter_sha256: str | None  # of lora_weights.safetensors; None without an adapter

    def identity(self) -> dict[str, str]:
        """Response headers (and metric labels, lower-cased without the prefix) naming what answered."""
        return {
            "X-Voxpipe-Model-Version": self.version,
            "X-Voxpipe-Adapter": self.adapter,
            "X-Voxpipe-Adapter-Sha256": self.adapter_sha256 or "none",
        }


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def adapter_folder(checkpoint: Path) -> Path | None:
    """The checkpoint's `lora/` when it holds both of upstream's files; a half one is an error."""
    folder = checkpoint / LORA_SUBDIR
    if not folder.exists():
        return None
    missing = [n for n in (LORA_CONFIG, LORA_WEIGHTS) if not (folder / n).is_file()]
    if missing:
        raise StepError(f"{folder}: a LoRA adapter folder without {' and '.join(missing)}; it holds "
                        f"upstream VoxCPM's {LORA_CONFIG} + {LORA_WEIGHTS} (train/export.py). Re-export the "
                        "run, or serve the merged weights alone after removing the folder")
    return folder


def adapter_sha256(checkpoint: Path) -> str | None:
    """The sha256 of the checkpoint's adapter weights (None without lora/): what headers and metrics name."""
    folder = adapter_folder(checkpoint)
    return file_sha256(folder / LORA_WEIGHTS) if folder else None


def adapter_params(folder: Path) -> LoraParams:
    """The LoraParams that rebuild the adapters in `lora_config.json` (upstream LoRAConfig's fields)."""
    path = folder / LORA_CONFIG
    try:
        upstream = json.loads(path.read_text())["lora_config"]
        return LoraParams(
            enabled=True, r=upstream["r"], alpha=upstream["alpha"], dropout=upstream.get("dropout", 0.0),
            target_lm=upstream["enable_lm"], target_dit=upstream["enable_dit"],
            target_proj=upstream.get("enable_proj", False),
            target_modules_lm=upstream["target_modules_lm"],
            target_modules_dit=upstream["target_modules_dit"],
            target_proj_modules=upstream.get("target_proj_modules") or LoraParams().target_proj_modules,
        )
    except (ValueError, KeyError, TypeError, ValidationError) as e:
        why = f"missing key {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]
        raise StepError(f"{path}: not upstream VoxCPM's LoRA config ({why}); it needs a \"lora_config\" "
                        "with r, alpha, enable_lm, enable_dit, target_modules_lm and target_modules_dit"
                        ) from None


def load_served(
    checkpoint: str | Path,
    *,
    base: str | Path | None = None,
    version: str | None = None,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    kernels: str = "auto",
) -> ServedModel:
    """The model to serve from a checkpoint folder (a registered version's downloaded "checkpoint").

    With `base` named and a `lora/` in the folder: the base checkpoint with the adapter applied,
    unmerged (its config must be the one the run was trained from). Otherwise the folder's own
    (merged) weights. `version` is the registry's pinned name for the folder, when it came from there.
    Weights come from safetensors only (the adapter) or through the checkpoint loader.
    """
    import torch
    from safetensors.torch import load_file

    from voxpipe.model.io import from_pretrained

    checkpoint = Path(checkpoint)
    dtype = dtype or torch.float32
    folder = adapter_folder(checkpoint)
    digest = adapter_sha256(checkpoint)
    identity = version or str(checkpoint)
    if base is None or folder is None:
        if base is not None:
            raise StepError(f"serve --base {base}: {checkpoint} has no {LORA_SUBDIR}/ adapter to apply to it "
                            "(a full fine-tune's export is complete by itself); leave --base out")
        model = from_pretrained(checkpoint, device=device, dtype=dtype, kernels=kernels).eval()
        return ServedModel(model, identity, "merged" if folder else "none", digest)

    base = Path(base)
    _check_same_shape(checkpoint, base)
    model = from_pretrained(base, device=device, dtype=dtype, kernels=kernels)
    names = set(apply_lora(model, adapter_params(folder)))
    state = load_file(str(folder / LORA_WEIGHTS), device="cpu")
    if set(state) != names:
        extra, missing = sorted(set(state) - names), sorted(names - set(state))
        raise StepError(f"{folder / LORA_WEIGHTS}: the adapter does not fit the layers its {LORA_CONFIG} "
                        f"names (unexpected: {extra[:3]}, missing: {missing[:3]}); re-export the run")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in state.items():
            params[name].copy_(tensor.to(params[name].dtype))
    return ServedModel(model.eval(), identity, "unmerged", digest)


def _check_same_shape(checkpoint: Path, base: Path) -> None:
    """The adapter was trained on a base of this config: another shape would load nothing or garbage."""
    checkpoint_config(base, where=f"serve --base {base}", way_out="name the base folder the run was trained "
                      f"from ({LORA_CONFIG}'s base_model records where it was)")
    mine, theirs = (json.loads((p / "config.json").read_text()) for p in (checkpoint, base))
    if mine != theirs:
        differ = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        raise StepError(f"serve --base {base}: its config.json differs from {checkpoint}'s in "
                        f"{', '.join(differ[:5])}; the adapter needs the base the run was trained from")


def registered_checkpoint(model_uri: str, dst: str | Path) -> Path:
    """The "checkpoint" artifact of a registered version (`models:/NAME/N`, pinned), downloaded into `dst`:
    the folder `load_served` takes, `lora/` included. Call inside `tracking.session`."""
    import mlflow
    import yaml

    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=str(dst)))
    flavor = yaml.safe_load((local / "MLmodel").read_text())["flavors"]["python_function"]
    return local / flavor["artifacts"]["checkpoint"]["path"]

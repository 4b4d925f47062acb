"""Resumable training checkpoints: DCP for the sharded model + optimizer, JSON for the rest.

Layout of `checkpoints/step-N/`:
  .metadata, __*.distcp   torch.distributed.checkpoint (each rank writes its own shards)
  rank-R.json             per rank: RNG states (torch CPU, device, python, numpy) and data sampler state
  trainer.json            step, counters, world size (rank 0)
  voxpipe-done.json       written last; a folder without it (or without .metadata) is ignored

Every rank writes into `.tmp-step-N/`; rank 0 renames it to `step-N/` only after all ranks have
finished, so a crash mid-save never leaves a folder that looks complete. The checkpoint folder
must be on storage every rank sees (the shared workspace volume on a cluster).
"""

from __future__ import annotations

import base64
import json
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from voxpipe.errors import StepError
from voxpipe.report import write_json
from voxpipe.train.device import Runtime

DONE_MARKER = "voxpipe-done.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class Resumed:
    trainer: dict[str, Any]  # what rank 0 saved in trainer.json
    sampler: dict[str, Any]  # this rank's sampler state


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint under root, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and (child / ".metadata").is_file() and (child / DONE_MARKER).is_file():
            found.append((int(m.group(1)), child))
    return sorted(found)


def latest_checkpoint(root: Path) -> Path | None:
    done = complete_checkpoints(root)
    return done[-1][1] if done else None


# -- RNG states as JSON (no pickle) ---------------------------------------------------------------
def _tensor_b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode()


def _b64_tensor(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)


def _device_rng(device: torch.device) -> Any:
    return getattr(torch, device.type) if device.type in ("cuda", "npu") else None


def rng_state(device: torch.device) -> dict[str, Any]:
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "torch": _tensor_b64(torch.get_rng_state()),
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
    }
    backend = _device_rng(device)
    if backend is not None:
        state["device"] = _tensor_b64(backend.get_rng_state(device))
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(_b64_tensor(state["torch"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    backend = _device_rng(device)
    if backend is not None and "device" in state:
        backend.set_rng_state(_b64_tensor(state["device"]), device)


# -- save / load ----------------------------------------------------------------------------------
def save_checkpoint(
    root: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer: dict[str, Any],
    sampler: dict[str, Any],
    rt: Runtime,
    keep: int,
) -> Path:
    """Collective: every rank calls it. Returns the final folder; prunes all but the newest `keep`."""
    tmp = root / f".tmp-step-{step}"
    final = root / f"step-{step}"
    if rt.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    rt.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp)
    write_json(tmp / f"rank-{rt.rank}.json", {"rng": rng_state(rt.device), "sampler": sampler})
    rt.barrier()
    if rt.is_main:
        write_json(tmp / "trainer.json", {**trainer, "step": step, "world_size": rt.world_size})
        write_json(tmp / DONE_MARKER, {"step": step})
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        for _, old in complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in root.glob(".tmp-step-*"):  # left by a run killed mid-save
            shutil.rmtree(stale, ignore_errors=True)
    rt.barrier()
    return final


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rt: Runtime
) -> Resumed:
    """Collective: restore model + optimizer shards, this rank's RNG, and return the rest."""
    trainer = json.loads((path / "trainer.json").read_text())
    if trainer["world_size"] != rt.world_size:
        raise StepError(
            f"{path}: saved with {trainer['world_size']} processes, now running with {rt.world_size}; "
            "the data order and RNG streams are per rank, so resume with the same world size "
            "(or start a new run from an export)"
        )
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    per_rank = json.loads((path / f"rank-{rt.rank}.json").read_text())
    set_rng_state(per_rank["rng"], rt.device)
    return Resumed(trainer, per_rank["sampler"])

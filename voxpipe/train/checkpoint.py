"""Resumable training checkpoints: DCP for the sharded model + optimizer, JSON for the rest.

Layout of `checkpoints/step-N/`:
  .metadata, __*.distcp   torch.distributed.checkpoint (each rank writes its own shards): the model, the
                          optimizer and, with train.ema_decay, the EMA shards (voxpipe/train/ema.py)
  rank-R.json             per rank: RNG states (torch CPU, device, python, numpy) and data sampler state
  trainer.json            step, counters, world size, the params the result depends on (rank 0)
  voxpipe-manifest.json   written last: size + sha256 of every file, HMAC-signed (voxpipe.integrity)

Every rank writes into `.tmp-step-N/`; rank 0 renames it to `step-N/` only after all ranks have
finished and the manifest is written, so a crash mid-save never leaves a folder that looks complete.
The checkpoint folder must be on storage every rank sees (the shared workspace volume on a cluster).

Resume trusts nothing it has not verified: DCP's reader unpickles `.metadata`, so rank 0 checks the
manifest's signature and every file's size and hash before any rank opens a file. A checkpoint that
fails is renamed `step-N.rejected-<reason>` (kept for inspection, never deleted) and the next older
one is tried. The signing key is env VOXPIPE_CHECKPOINT_KEY (a Kubernetes Secret on a cluster:
launch-train refuses a Job without it), else the user's own key file outside every output folder
(voxpipe/integrity.py), so write access to the checkpoints is not enough to forge a signature.
"""

from __future__ import annotations

import base64
import errno
import json
import logging
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from voxpipe.errors import StepError
from voxpipe.files import atomic_write_text, step_folders
from voxpipe.integrity import (
    KEY_ENV,
    MANIFEST,
    IntegrityError,
    hash_files,
    listed_files,
    read_manifest,
    signing_key,
    user_key_path,
    verify_manifest,
    write_manifest,
)
from voxpipe.report import write_json
from voxpipe.train.device import Runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resumed:
    trainer: dict[str, Any]  # what rank 0 saved in trainer.json
    sampler: dict[str, Any]  # this rank's sampler state
    ema_restored: bool = False  # the EMA shards came from the checkpoint (False: it holds none)


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every checkpoint under root that has a manifest, oldest first (not verified)."""
    return [(step, folder) for step, folder in step_folders(root) if (folder / MANIFEST).is_file()]


def latest_checkpoint(root: Path) -> Path | None:
    done = complete_checkpoints(root)
    return done[-1][1] if done else None


def set_aside(folder: Path, why: str) -> Path:
    """Rename `folder` to `<name>.<why>` (numbered if taken): out of the way, never deleted."""
    target = folder.with_name(f"{folder.name}.{why}")
    n = 1
    while target.exists():
        n += 1
        target = folder.with_name(f"{folder.name}.{why}-{n}")
    folder.rename(target)
    return target


def _verify(folder: Path, step: int, key: bytes) -> None:
    manifest = verify_manifest(folder, key)
    if manifest.get("step") != step:
        raise IntegrityError("wrong-step", f"{folder}: its manifest is for step {manifest.get('step')}")


def newest_verified(root: Path) -> Path | None:
    """Rank 0: the newest checkpoint whose signed manifest and files verify; failures are set aside.

    When every checkpoint fails on its signature alone, the key is the likely culprit (a different
    VOXPIPE_CHECKPOINT_KEY than the one that wrote them): nothing is set aside and the run stops.
    """
    candidates = step_folders(root)[::-1]
    if not candidates:
        return None
    key = signing_key(root)
    other_failures = 0  # checkpoints that do not fail on the signature (they may fail on other checks)
    for _, folder in candidates:
        try:
            read_manifest(folder, key)
            other_failures += 1
        except IntegrityError as e:
            other_failures += e.reason != "bad-signature"
    if not other_failures:
        raise StepError(
            f"{root}: no checkpoint's manifest verifies with this signing key ({len(candidates)} tried, "
            f"newest {candidates[0][1].name}). Run with the key that wrote them ({KEY_ENV}, or the "
            f"key file {user_key_path()}), or start fresh with --no-resume (they are then moved aside)"
        )
    for step, folder in candidates:
        try:
            _verify(folder, step, key)
            return folder
        except IntegrityError as e:
            kept = set_aside(folder, f"rejected-{e.reason}")
            log.warning("checkpoint %s failed verification (%s); set aside as %s, trying the previous one",
                        folder.name, e, kept.name)
    log.warning("no checkpoint under %s verified; training starts from the base model", root)
    return None


def pick_checkpoint(root: Path, rt: Runtime) -> Path | None:
    """Collective: rank 0 verifies, every rank gets its answer (no rank opens an unverified file)."""
    box: list[Any] = [None]
    if rt.is_main:
        try:
            found = newest_verified(root)
            box[0] = str(found) if found else None
        except StepError as e:
            box[0] = e
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], StepError):
        raise StepError(str(box[0]), every_rank=True)
    return Path(box[0]) if box[0] else None


def set_aside_all(roots: list[Path], reason: str) -> list[Path]:
    """A fresh start moves the old checkpoints (and exports) aside so they are never mixed with new ones;
    one log line says why and where they went."""
    stamp = time.strftime("replaced-%Y%m%dT%H%M%SZ", time.gmtime())
    kept = [set_aside(root, stamp) for root in roots if root.is_dir() and any(root.iterdir())]
    if kept:
        log.warning("starting fresh (%s): the previous %s moved to %s", reason,
                    " and ".join(root.name for root in roots), ", ".join(map(str, kept)))
    return kept


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
    ema: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Collective: every rank calls it. Returns the final folder; prunes all but the newest `keep`.
    `ema`: the EMA shards by parameter name, saved beside the model's (trainer.json says so).

    A full or read-only disk stops the run with one paragraph naming the folder; the partial folder is
    removed and every complete checkpoint kept, so a rerun resumes from the newest one."""
    tmp = root / f".tmp-step-{step}"
    final = root / f"step-{step}"
    try:
        if rt.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        rt.barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd, **({"ema": ema} if ema is not None else {})},
                 checkpoint_id=tmp)
        # machine state, not a report: written as it is, since the report writer's secret scrub rewrites
        # random-looking runs, and random bytes in base64 are just that (a scrubbed RNG state cannot load)
        atomic_write_text(tmp / f"rank-{rt.rank}.json",
                          json.dumps({"rng": rng_state(rt.device), "sampler": sampler}))
        if rt.is_main:
            write_json(tmp / "trainer.json", {**trainer, "step": step, "world_size": rt.world_size,
                                              "ema": ema is not None})
    except BaseException as e:  # torch's CheckpointException (a disk full in DCP's writer) is no Exception
        if (failed := _save_failed(e, root, step, tmp)) is e:
            raise
        raise failed from e
    rt.barrier()
    # every rank hashes its share of the files; rank 0 signs the whole list
    names = listed_files(tmp)
    shares: list[Any] = [None] * rt.world_size
    dist.all_gather_object(shares, hash_files(tmp, names[rt.rank :: rt.world_size]))
    if rt.is_main:
        files = {name: entry for share in shares for name, entry in share.items()}
        try:
            write_manifest(tmp, signing_key(root), files, extra={"step": step})
        except OSError as e:
            raise _save_failed(e, root, step, tmp) from e  # an OSError: always the paragraph
        if final.exists():  # a leftover that never verified (no manifest): kept, out of the way
            set_aside(final, "replaced")
        tmp.rename(final)
        for _, old in complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in root.glob(".tmp-step-*"):  # left by a run killed mid-save
            shutil.rmtree(stale, ignore_errors=True)
    rt.barrier()
    return final


def rank_checkpoint_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer, extra: int = 0) -> int:
    """The bytes of this rank's share of a checkpoint: its local shards of the parameters and of the
    optimizer state, plus `extra` (the EMA shards' bytes): what `voxpipe plan` estimates as
    checkpoint_gib_per_rank."""
    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    tensors = [local(p) for p in model.parameters()]
    tensors += [local(v) for state in optimizer.state.values() for v in state.values()
                if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors) + extra


def _save_failed(e: Exception, root: Path, step: int, tmp: Path) -> Exception:
    """A disk error while saving as one paragraph (the partial folder removed); anything else as it was."""
    error = _os_error(e, tmp)
    if error is None:
        return e
    shutil.rmtree(tmp, ignore_errors=True)
    kept = [f.name for _, f in complete_checkpoints(root)]
    free = shutil.disk_usage(root).free / 2**20
    return StepError(
        f"writing checkpoint step-{step} into {root} failed ({error.strerror or error}); {free:.0f} MiB are "
        "free there now. The partial folder was removed; the complete checkpoints are kept "
        f"({', '.join(kept) or 'none yet'}). Free space on that volume (or make it writable, or lower "
        "train.keep_checkpoints) and rerun train: it resumes from the newest complete checkpoint")


FULL_BELOW = 16 * 2**20  # bytes free on the checkpoint volume below which a failed write is a full disk


def _os_error(e: BaseException, tmp: Path) -> OSError | None:
    """The OSError behind a failed save: raised directly, or collected by DCP from some rank. torch.save's
    stream writer reports a short write as a RuntimeError without the errno ("file write failed",
    "unexpected pos ..."): one with the volume (nearly) full, or fuller than the partial checkpoint is
    big, is taken for ENOSPC."""
    if isinstance(e, OSError):
        return e
    if isinstance(e, RuntimeError) and _volume_full(tmp):
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}; torch's writer: {first[:120]}")
    failures = getattr(e, "failures", None)  # torch.distributed.checkpoint's CheckpointException
    if isinstance(failures, dict):
        for failure in failures.values():
            inner = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(inner, BaseException) and (found := _os_error(inner, tmp)) is not None:
                return found
    cause = e.__cause__ or e.__context__
    return _os_error(cause, tmp) if cause is not None and cause is not e else None


def _volume_full(tmp: Path) -> bool:
    try:
        free = shutil.disk_usage(tmp if tmp.exists() else tmp.parent).free
        partial = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file()) if tmp.exists() else 0
    except OSError:
        return False
    return free < max(FULL_BELOW, partial)


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rt: Runtime,
    ema: dict[str, torch.Tensor] | None = None,
) -> Resumed:
    """Collective: restore model + optimizer shards (and `ema`'s in place, when the checkpoint holds
    them), this rank's RNG, and return the rest.

    Only for a folder `pick_checkpoint` has verified: DCP unpickles `.metadata`.
    """
    trainer = json.loads((path / "trainer.json").read_text())
    if trainer["world_size"] != rt.world_size:
        raise StepError(
            f"{path}: saved with {trainer['world_size']} processes, now running with {rt.world_size}; "
            "the data order and RNG streams are per rank, so resume with the same world size "
            "(or start a new run from an export)"
        )
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    restore_ema = ema is not None and bool(trainer.get("ema"))
    if restore_ema:
        state["ema"] = ema
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    per_rank = json.loads((path / f"rank-{rt.rank}.json").read_text())
    set_rng_state(per_rank["rng"], rt.device)
    return Resumed(trainer, per_rank["sampler"], restore_ema)

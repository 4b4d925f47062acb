"""The plan's checkpoint save time against a real save of the `small` preset on this CPU (issue 47): the
plan's bytes per rank are train's own, and over this disk's measured write bandwidth they predict the
real save within a factor of 2."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import time

import pytest
import torch
import torch.distributed as dist

from voxpipe.model.config import preset
from voxpipe.steps.train import LoraParams
from voxpipe.train import plan as P
from voxpipe.train.checkpoint import rank_checkpoint_bytes, save_checkpoint
from voxpipe.train.device import Runtime
from voxpipe.train.fsdp import DTYPES, prepare_model, shard_model


def disk_write_gbps(folder, nbytes: int) -> float:
    """This host's checkpoint bandwidth as a save meets it, measured without voxpipe: `nbytes` written in
    64 MiB pieces and fsync'd (DCP's writer syncs its files), then read back through SHA-256 (the signed
    manifest hashes every file written)."""
    piece = os.urandom(64 * 2**20)
    path = folder / "bandwidth.bin"
    started = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(max(1, nbytes // len(piece))):
            f.write(piece)
        f.flush()
        os.fsync(f.fileno())
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(len(piece)):
            digest.update(chunk)
    seconds = time.perf_counter() - started
    written = path.stat().st_size
    path.unlink()
    return written / seconds / 1e9


def _save_once(store_path: str, setup: P.Setup, root: str, queue) -> None:
    from pathlib import Path

    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 1), rank=0, world_size=1)
    try:
        rt = Runtime(torch.device("cpu"), 0, 1, init_device_mesh("cpu", (1,)))
        dtype = DTYPES[setup.dtype]
        model = prepare_model(setup.config, dtype, setup.lora)
        shard_model(model, rt, dtype, setup.activation_checkpointing)
        model.to_empty(device=rt.device)
        P._init_real(model)
        optimizer = P.optimizer_for(model)
        P.init_optimizer_state(model, optimizer)
        nbytes = rank_checkpoint_bytes(model, optimizer)
        gbps = disk_write_gbps(Path(root), nbytes)
        started = time.perf_counter()
        save_checkpoint(Path(root) / "checkpoints", 1, model, optimizer, {}, {}, rt, keep=1)
        queue.put((time.perf_counter() - started, nbytes, gbps))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_the_planned_save_time_of_small_is_within_a_factor_of_2_of_a_real_save(tmp_path, monkeypatch):
    monkeypatch.setenv("VOXPIPE_CHECKPOINT_KEY", "test-key")
    setup = P.Setup(preset("small"), 1, LoraParams(), False, "float32", 256)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_save_once, args=(str(tmp_path / "store"), setup, str(tmp_path), queue))
    proc.start()
    seconds, rank_bytes, gbps = queue.get(timeout=900)
    proc.join(timeout=120)
    assert proc.exitcode == 0
    # the bytes are counted, not estimated: the plan's are train's own (AdamW's step counters aside)
    planned_bytes = P.checkpoint_bytes_per_rank(setup)
    assert abs(planned_bytes - rank_bytes) <= 0.01 * rank_bytes, (planned_bytes, rank_bytes)
    planned = P.checkpoint_save_seconds(setup, gbps)
    assert planned / 2 <= seconds <= planned * 2, (planned, seconds, gbps, rank_bytes)


def test_the_plan_reports_each_ranks_checkpoint_bytes_and_save_time():
    """A full fine-tune stores fp32 weights and two fp32 moments; LoRA its frozen base in the compute
    dtype and moments of the adapters only; a bigger world shares the bytes out."""
    config = preset("tiny")
    full = P.Setup(config, 1, LoraParams(), False, "bfloat16", 256)
    n = sum(p.numel() for p in prepare_model(config, torch.bfloat16, LoraParams()).parameters())
    assert P.checkpoint_bytes_per_rank(full) == 3 * 4 * n
    assert P.checkpoint_bytes_per_rank(P.Setup(config, 4, LoraParams(), False, "bfloat16", 256)) == 3 * n
    lora = P.Setup(config, 1, LoraParams(enabled=True), False, "bfloat16", 256)
    # the frozen base in bf16, the adapters and their moments in fp32
    assert 2 * n <= P.checkpoint_bytes_per_rank(lora) < P.checkpoint_bytes_per_rank(full)
    assert P.checkpoint_save_seconds(full, 0.5) == pytest.approx(12 * n / 0.5e9)

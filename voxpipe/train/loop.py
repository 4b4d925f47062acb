"""`voxpipe train`: the training loop around the FSDP2 model.

One optimizer step = `grad_accum` micro-batches (token-budget batches from the encoded shards),
backward, a DTensor-aware clip at `clip_norm`, and AdamW, unless the loss or the gradient norm is
not finite: then the update is skipped and counted, and too many in a row stop the run. Every
`val_every` steps a fixed-seed validation (same batches, same flow-matching t and noise, no
condition dropout) gives the convergence curve that the raw per-step loss cannot show.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from voxpipe.errors import StepError
from voxpipe.files import DISK_ERRORS, as_os_error
from voxpipe.integrity import signing_key
from voxpipe.mfu.peak import device_name
from voxpipe.model.config import VoxCPM2Config
from voxpipe.model.npu import resolve_kernels
from voxpipe.model.rows import host_rows
from voxpipe.params import Params
from voxpipe.progress import StepProgress
from voxpipe.report import write_report
from voxpipe.steps.train import TrainParams
from voxpipe.train.checkpoint import (
    complete_checkpoints,
    load_checkpoint,
    pick_checkpoint,
    rank_checkpoint_bytes,
    save_checkpoint,
    set_aside_all,
)
from voxpipe.train.data import TrainData, check_encoded_by, move_to
from voxpipe.train.device import Runtime, distributed_runtime
from voxpipe.train.ema import EMA
from voxpipe.train.export import export_checkpoint
from voxpipe.train.exports import EXPORTS, due, export_step
from voxpipe.train.fixed_seed_loss import fixed_seed_loss
from voxpipe.train.fsdp import build_model, compute_dtype
from voxpipe.train.identity import foreign_exports, run_identity, sign_report_identity, write_identity
from voxpipe.train.metrics import LiveLogFactory, MetricsLog, finite_or_none
from voxpipe.train.moves import move_check
from voxpipe.train.plan import plan_verdict
from voxpipe.train.resume import Refusal, result_params, why_not_resume
from voxpipe.train.schedule import WarmupCosine
from voxpipe.train.signals import TerminationFlag
from voxpipe.train.throughput import Throughput, peak_memory_per_rank
from voxpipe.train.trainer_status import reporter_from_env
from voxpipe.voxcpm2_format import checkpoint_config

logger = logging.getLogger(__name__)
LOSS_KEYS = ("loss/diff", "loss/stop")


@dataclass
class Counters:
    """Running totals that a resume must continue, saved in trainer.json."""

    tokens: int = 0  # real (unpadded) LM positions, all ranks
    samples: int = 0
    skipped_steps: int = 0
    bad_in_a_row: int = 0
    train_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class TrainResult:
    out: Path
    steps: int
    stopped_early: bool
    report: dict[str, Any] = field(default_factory=dict)
    exit_code: int = 0
    is_main: bool = True  # under torchrun only rank 0 prints the summary

    def summary(self) -> str:
        if not self.is_main:
            return ""
        r = self.report
        head = f"train: {r['steps_run']} steps this run (step {self.steps}/{r['max_steps']})"
        if r["steps_run"] == 0 and r["resumed_from"]:
            head = (f"train: nothing to do, {r['resumed_from']} is already at step {self.steps}/"
                    f"{r['max_steps']} with these params: 0 steps trained, export rewritten from it")
        if self.stopped_early:
            return f"{head}; SIGTERM: checkpoint saved, rerun the same command to resume"
        val = r["val_curve"]
        val_text = f", val/loss {val[0]['val/loss']:.4f} -> {val[-1]['val/loss']:.4f}" if val else ""
        return (
            f"{head}, {r['tokens_per_s']:.0f} tokens/s, {r['skipped_steps']} skipped{val_text}; "
            f"export in {self.out / 'export'}"
        )


def _seed_everything(seed: int, rank: int) -> None:
    """Each rank draws its own flow-matching noise; the streams are reproducible per (seed, rank)."""
    s = seed * 1_000_003 + rank
    torch.manual_seed(s)
    random.seed(s)
    np.random.seed(s % 2**32)


def build_optimizer(model: nn.Module, p: TrainParams, device: torch.device) -> torch.optim.AdamW:
    """AdamW; no weight decay on vectors (norm gains, biases). fused on accelerators, foreach on CPU."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": p.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fast = {"fused": True} if device.type in ("cuda", "npu") else {"foreach": True}
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=p.lr, **fast)


def clip_gradients(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip to `max_norm` over all ranks' shards (DTensor-aware); the norm before clipping, on the device."""
    params = [q for q in model.parameters() if q.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def _all_sum(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


@torch.no_grad()
def measured_save(seconds: float, rank_bytes: int, rt: Runtime) -> dict[str, Any]:
    """One checkpoint save as the grace period sees it: the slowest rank's seconds and the largest share
    (collective: a max over the ranks), and their ratio as the write bandwidth in GB/s (1e9 bytes)."""
    worst = torch.tensor([seconds, float(rank_bytes)], device=rt.device)  # fp32: every backend reduces it
    if rt.world_size > 1:
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    secs, nbytes = worst.tolist()
    return {"seconds": round(secs, 3), "bytes_per_rank": int(nbytes),
            "write_gbps": round(nbytes / secs / 1e9, 4) if secs > 0 else None}


def validate(model: nn.Module, data: TrainData, rt: Runtime, seed: int) -> dict[str, float]:
    """The fixed-seed val loss (the same function `voxpipe evaluate` uses), summed over all ranks."""
    across_ranks = partial(_all_sum, device=rt.device)
    loss = fixed_seed_loss(model, data.val_batches(), rt.device, seed, reduce=across_ranks)
    return {"val/diff": loss.diff, "val/stop": loss.stop, "val/loss": loss.total}


def _check_plan(params: Params, rt: Runtime, dtype: torch.dtype) -> None:
    """On an accelerator, the memory plan against the device's free memory before anything is
    allocated; rank 0 plans, every rank stops with its paragraph (voxpipe.train.plan)."""
    if rt.device.type == "cpu":
        return
    name = str(dtype).removeprefix("torch.")
    verdict = [plan_verdict(params, rt.device, rt.world_size, name) if rt.is_main else None]
    dist.broadcast_object_list(verdict, src=0)
    if verdict[0] is not None:
        raise StepError(verdict[0], every_rank=True)


class Trainer:
    def __init__(self, params: Params, rt: Runtime, stop: TerminationFlag,
                 live: LiveLogFactory | None = None):
        p = params.train
        self.live = live
        self.p, self.tracking, self.rt, self.stop = p, params.tracking, rt, stop
        self.result_params = result_params(params)  # saved with each checkpoint, checked on resume
        # recorded beside every export: evaluate scores only this run's (voxpipe/train/identity.py)
        self.identity = run_identity(self.result_params, Path(p.data)) if rt.is_main else {}
        self.out = Path(p.out)
        self.base = Path(params.model.base)
        self.ckpt_root = self.out / "checkpoints"
        self.config = VoxCPM2Config.from_file(checkpoint_config(self.base))
        self.dtype = compute_dtype(p.dtype, rt.device)
        self.kernels = resolve_kernels(params.model.kernels, rt.device)
        _seed_everything(p.seed, rt.rank)
        self.data = TrainData(Path(p.data), self.config, p, rt)
        check_encoded_by(Path(p.data), self.base, rt)
        _check_plan(params, rt, self.dtype)
        self.model = build_model(
            self.config, self.base, rt, dtype=self.dtype, lora_params=p.lora,
            activation_checkpointing=p.activation_checkpointing, seed=p.seed,
            kernels=self.kernels, compile_blocks=p.compile,
        )
        self.optimizer = build_optimizer(self.model, p, rt.device)
        self.ema = EMA(self.model, p.ema_decay) if p.ema_decay else None  # voxpipe/train/ema.py
        self.schedule = WarmupCosine(p.lr, min(p.min_lr, p.lr), p.warmup_steps, p.max_steps)
        self.counters = Counters()
        self.step = 0
        self.resumed_from: str | None = None
        self.val_curve: list[dict[str, float]] = []
        self.moved: dict[str, Any] | None = None  # moves.move_check at the first validation after step 0
        self.last: dict[str, Any] = {}
        self.meter = Throughput(self.config, self.dtype, rt, p)
        self.stop_agreed = False  # some rank had a SIGTERM by the last step's all-reduce
        self.last_save: dict[str, Any] | None = None  # measured_save of the last checkpoint; None: none saved

    # -- resume ---------------------------------------------------------------------------------
    def _resume(self) -> None:
        """Continue from the newest verified checkpoint of the same run (see voxpipe.train.resume)."""
        if not self.p.resume:
            self._start_fresh("--no-resume")
            return
        path = pick_checkpoint(self.ckpt_root, self.rt)
        if path is None:
            key = signing_key(self.ckpt_root) if self.rt.is_main else b""
            if self.rt.is_main and foreign_exports(self.out / EXPORTS, self.identity, key):
                set_aside_all([self.out / EXPORTS], "exports of another run, no checkpoint of it")
            return
        saved = json.loads((path / "trainer.json").read_text())  # verified by pick_checkpoint
        refusal = self._why_not_resume(saved, path)
        if refusal and not self.p.fresh_on_change:
            raise StepError(refusal.paragraph, every_rank=True)
        if refusal:
            self._start_fresh(f"train.fresh_on_change: {refusal.changed}")
            return
        p = self.p  # the learning-rate plan of the run that wrote the checkpoint
        self.schedule = WarmupCosine(p.lr, min(p.min_lr, p.lr), p.warmup_steps, saved["schedule_steps"])
        state = load_checkpoint(path, self.model, self.optimizer, self.rt,
                                self.ema.state_dict() if self.ema else None)
        if self.ema is not None and not state.ema_restored:
            self.ema.reset_to_live()  # saved before EMA was on: the average starts from the weights now
            if self.rt.is_main:
                logger.info("%s holds no EMA weights (saved with train.ema_decay=0): the EMA starts from its "
                            "weights", path.name)
        self.step = state.trainer["step"]
        self.counters = Counters(**state.trainer["counters"])
        self.val_curve = state.trainer["val_curve"]
        self.data.load_state_dict(state.sampler)
        self.resumed_from = str(path)

    def _why_not_resume(self, saved: dict[str, Any], path: Path) -> Refusal | None:
        """Collective: rank 0 holds the run's identity (its data and base versions) and decides."""
        box = [why_not_resume(saved, self.result_params, self.identity, self.p.max_steps, path)
               if self.rt.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _start_fresh(self, reason: str) -> None:
        """Move old checkpoints aside (never mixed with this run's, never deleted)."""
        self.rt.barrier()  # every rank has finished reading them
        if self.rt.is_main:
            # another run's exports are never scored as this one's
            set_aside_all([self.ckpt_root, self.out / EXPORTS], reason)
        self.rt.barrier()

    def _save(self) -> None:
        trainer = {"counters": self.counters.to_dict(), "val_curve": self.val_curve,
                   "params": self.result_params, "schedule_steps": self.schedule.total_steps,
                   "identity": self.identity}
        started = time.perf_counter()
        save_checkpoint(
            self.ckpt_root, self.step, self.model, self.optimizer, trainer, self.data.state_dict(),
            self.rt, self.p.keep_checkpoints, self.ema.state_dict() if self.ema else None,
        )
        ema_bytes = self.ema.local_bytes() if self.ema else 0
        self.last_save = measured_save(time.perf_counter() - started,
                                       rank_checkpoint_bytes(self.model, self.optimizer, ema_bytes), self.rt)
        if self.rt.is_main:
            logger.info(
                "checkpoint step-%d saved: %.3f GiB per rank in %.1f s (slowest rank) = %.3f GB/s; the next "
                "plan can use it: plan.checkpoint_write_gbps=%.3f", self.step,
                self.last_save["bytes_per_rank"] / 2**30, self.last_save["seconds"],
                self.last_save["write_gbps"], self.last_save["write_gbps"])

    # -- one optimizer step ---------------------------------------------------------------------
    def train_step(self) -> dict[str, Any]:
        """Advance one optimizer step; returns its metrics record.

        The host reads the device once per step (torchtitan's habit): the loss sums, the token
        weight, the gradient norm, the meter's counts and any rank's SIGTERM come back in one
        tensor after the clip, in time to skip a non-finite update. The logged loss and the
        gradient are the same token-weighted mean over all micro-batches and ranks: each
        micro-batch's summed loss is divided by the step's total loss weight, all-reduced on the
        device before the first forward (times the world size: FSDP2 averages over ranks).
        """
        p, rt, meter = self.p, self.rt, self.meter
        self.step += 1
        lr = self.schedule.lr(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        meter.start()
        hosts = [meter.wait_for(self.data.next_train_batch) for _ in range(p.grad_accum)]
        rows = [host_rows(batch) for batch in hosts]  # found on the host: the forward needs no sync
        loss_tokens = [float(batch["loss_mask"].numpy().sum()) for batch in hosts]
        for batch, batch_rows in zip(hosts, rows, strict=True):
            meter.count(batch, batch_rows)
        total_weight = torch.tensor(sum(loss_tokens), dtype=torch.float32, device=rt.device)
        dist.all_reduce(total_weight)
        scale = rt.world_size / total_weight.clamp(min=1.0)
        sums = torch.zeros(len(LOSS_KEYS), dtype=torch.float64, device=rt.device)
        progress = min(1.0, (self.step - 1) / self.schedule.total_steps)
        for batch, batch_rows, tokens in zip(hosts, rows, loss_tokens, strict=True):
            out = self.model(**move_to({**batch, **batch_rows}, rt.device), progress=progress)
            summed = torch.stack([out[k] for k in LOSS_KEYS]) * tokens  # [diff, stop] x loss tokens
            (summed.sum() * scale).backward()
            sums += summed.detach().double()
        grad_norm = clip_gradients(self.model, p.clip_norm)
        votes = float(self.stop.requested)
        local = torch.tensor([*meter.counts(), votes], dtype=torch.float64, device=rt.device)
        reduced = torch.cat((sums, local))
        dist.all_reduce(reduced)
        read = torch.cat((reduced, total_weight.double().reshape(1), grad_norm.double().reshape(1)))
        *values, weight, grad_norm = read.tolist()  # the step's one device-to-host read
        diff, stop, totals, stop_votes = values[0], values[1], values[2:-1], values[-1]
        self.stop_agreed = stop_votes > 0
        weight = max(weight, 1.0)
        finite = math.isfinite(diff) and math.isfinite(stop) and math.isfinite(grad_norm)
        if finite:
            self.optimizer.step()
            if self.ema is not None:
                self.ema.update()
            self.counters.bad_in_a_row = 0
        else:
            self.counters.skipped_steps += 1
            self.counters.bad_in_a_row += 1
        self.optimizer.zero_grad(set_to_none=True)
        stats = meter.finish(totals)
        self.counters.tokens += stats["real_tokens"]
        self.counters.samples += stats["samples"]
        self.counters.train_seconds += stats["step_time_s"]
        record = {
            "step": self.step,
            "loss": (diff + stop) / weight,
            "loss/diff": diff / weight,
            "loss/stop": stop / weight,
            "lr": lr,
            "grad_norm": grad_norm,
            "skipped": not finite,
            **stats,
        }
        return record

    def _check_bad_steps(self, record: dict[str, Any]) -> None:
        if self.counters.bad_in_a_row >= self.p.max_bad_steps:
            raise StepError(
                f"step {self.step}: {self.counters.bad_in_a_row} steps in a row had a non-finite loss or "
                f"gradient norm (loss/diff {record['loss/diff']}, loss/stop {record['loss/stop']}, "
                f"grad_norm {record['grad_norm']}); their updates were skipped. Check the encoded data "
                "for NaN/inf latents, or lower train.lr."
            )

    def _validate(self) -> dict[str, float]:
        figures = validate(self.model, self.data, self.rt, self.p.seed)
        self.val_curve.append({"step": self.step, **figures})
        if len(self.val_curve) == 2 and self.val_curve[0]["step"] == 0:  # the first after the base's
            self.moved = move_check(*self.val_curve, self.schedule.lr(self.step), self.p.lora.enabled)
            if self.moved["warning"] and self.rt.is_main:
                logger.warning("%s", self.moved["warning"])
        return figures

    def _stop_requested(self) -> bool:
        """Any rank's SIGTERM stops all ranks at the same step (they must checkpoint together): the
        votes travel in the step's all-reduce (`train_step`)."""
        return self.stop_agreed

    def _export(self, folder: Path, ema: EMA | None = None) -> None:
        """Collective: every rank gathers, rank 0 writes `folder` (upstream layout); with `ema`, its weights
        are swapped in for the export and out again after it."""
        with ema.swapped_in() if ema is not None else nullcontext():
            export_checkpoint(
                self.model, self.config, self.base, folder, self.rt, lora_params=self.p.lora,
                dtype=torch.float32 if self.p.export_dtype == "float32" else torch.bfloat16, step=self.step,
            )
        if self.rt.is_main:
            write_identity(folder, self.identity, self.step, signing_key(self.ckpt_root),
                           {"kind": "ema", "ema_decay": ema.decay} if ema is not None else None)

    # -- the run --------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        p, rt = self.p, self.rt
        start_wall = time.perf_counter()
        self._resume()
        first_step = self.step
        log = MetricsLog(self.out / "metrics.jsonl", rt.is_main, first_step, p, self.tracking, self.live)
        if not self.val_curve and self.data.has_val:
            self._validate()  # the untrained base: the first point of the convergence curve
        bar = StepProgress(p.max_steps, self.step, rt.is_main, p.log_every, logger)
        status = reporter_from_env(os.environ, first_step) if rt.is_main else None
        stopped = False
        try:
            while self.step < p.max_steps:
                record = self.train_step()
                last = self.step == p.max_steps
                if self.data.has_val and ((p.val_every and self.step % p.val_every == 0) or last):
                    record.update(self._validate())
                log.log(record)
                if status is not None:
                    status.update(self.step, p.max_steps, record, final=last)
                self.last = record
                self._check_bad_steps(record)
                bar.update(record)
                stopped = self._stop_requested()
                if stopped or last or (p.checkpoint_every and self.step % p.checkpoint_every == 0):
                    self._save()
                if not stopped and due(self.step, p.export_every, last):
                    export_step(self._export, self.out, self.step, p.keep_exports, rt,
                                partial(self._export, ema=self.ema) if self.ema else None)
                if stopped:
                    break
        finally:
            failing = sys.exc_info()[1] is not None
            bar.close()
            try:
                log.close()  # rewrites train_curve.csv from metrics.jsonl
            except OSError:
                if not failing:
                    raise
                # a full disk fails the curve too: the error already raised (the checkpoint's) is the one to
                # report; the curve is derived, rewritten by the rerun
        if not stopped:
            self._export(self.out / "export")
        report = self._report(first_step, time.perf_counter() - start_wall, stopped, log.run_id)
        return TrainResult(self.out, self.step, stopped, report, is_main=rt.is_main)

    def _report(self, first_step: int, wall: float, stopped: bool, run_id: str | None) -> dict[str, Any]:
        c = self.counters
        report = {
            "steps": self.step,
            "steps_run": self.step - first_step,
            "max_steps": self.p.max_steps,
            "stopped_by_sigterm": stopped,
            "tokens": c.tokens,
            "samples": c.samples,
            "train_seconds": round(c.train_seconds, 3),
            "wall_seconds": round(wall, 3),
            "tokens_per_s": c.tokens / c.train_seconds if c.train_seconds else 0.0,
            "samples_per_s": c.samples / c.train_seconds if c.train_seconds else 0.0,
            "final": {k: finite_or_none(self.last.get(k)) for k in ("loss", *LOSS_KEYS, "grad_norm")},
            "val_curve": self.val_curve,
            "moved": self.moved,
            **({} if self.moved else {"moved_null_reason": "no validation after step 0's in this run "
                                      "(train.val_every, a val split, or a resumed run that passed it)"}),
            "skipped_steps": c.skipped_steps,
            "rows_too_long": self.data.rows_too_long,
            "world_size": self.rt.world_size,
            "device_type": self.rt.device.type,
            "device_name": device_name(self.rt.device),
            # a CPU "device" is one process with these threads: a peak given for MFU is for that many
            "cpu_threads": torch.get_num_threads() if self.rt.device.type == "cpu" else None,
            "dtype": str(self.dtype).removeprefix("torch."),
            "lora": self.p.lora.enabled,
            "kernels": self.kernels.label,  # what model.kernels resolved to on this device
            "compile": self.p.compile,
            **peak_memory_per_rank(self.rt),
            "resumed_from": self.resumed_from,
            # the last checkpoint's measured save: plan.checkpoint_write_gbps for the next plan
            "checkpoint_save": self.last_save,
            "mlflow_run_id": run_id,  # train.track: the live MLflow run that `register` completes
            "params": self.p.model_dump(),
            "identity": self.identity,
            # signed: evaluate takes the run's identity from report.json only with it (train/identity.py)
            "identity_hmac": sign_report_identity(self.identity, signing_key(self.ckpt_root))
            if self.rt.is_main else None,
        }
        if self.rt.is_main:
            write_report(self.out, report)
        return report


def train(params: Params, live: LiveLogFactory | None = None) -> TrainResult:
    """`train`: the train section on model.base; with `train.track`, each step's metrics also go to
    `live` (`voxpipe train` passes MLflow's, voxpipe/track/live.py)."""
    if params.train.track and live is None:
        raise StepError("train.track is on, but no live logger was given: run `voxpipe train`, or call "
                        "train(params, live=voxpipe.track.live.LiveRun); or set train.track=false")
    with distributed_runtime(params.train.device) as rt, TerminationFlag() as stop:
        try:
            return Trainer(params, rt, stop, live).run()
        except Exception as e:  # an OSError, or safetensors' error around one (the export)
            error = as_os_error(e)
            if not isinstance(error, OSError) or error.errno not in DISK_ERRORS:
                raise
            raise disk_failed(error, Path(params.train.out)) from e


def disk_failed(e: OSError, out: Path) -> StepError:
    """A full (or read-only) volume outside a checkpoint save (the metrics, the curve, the export): one
    paragraph; what is on disk already stays, so the rerun resumes from the newest complete checkpoint."""
    kept = [f.name for _, f in complete_checkpoints(out / "checkpoints")]
    return StepError(
        f"writing into {out} failed ({e.strerror or e}{f': {e.filename}' if e.filename else ''}). Nothing "
        f"written before is lost: the complete checkpoints are kept ({', '.join(kept) or 'none yet'}). Free "
        "space on that volume (or make it writable) and rerun train: it resumes from the newest complete "
        "checkpoint")

"""Training step time, MFU and memory of the real `voxcpm2` shape on one accelerator; prints one JSON.

Everything the GPU/NPU check of docs/accelerators.md asks for, in one process (random weights,
nothing read or written): the trainer's own path (voxpipe.train: FSDP2 world of 1, `fully_shard`
per decoder layer and the root with MixedPrecisionPolicy(bf16, fp32 reduce), `model.kernels`, the
trainer's fused AdamW and DTensor-aware clip at 1.0, the host-found encoder/DiT rows) on
synthetic right-padded batches [B, L] shaped like encoded data (a quarter text + audio_start,
then target patches, then a little padding; see mfu_cpu.py).

1. `runs`: eager vs `train.compile` (torch.compile per block) at --batch x --seq-len: median
   step time, tokens/s, MFU and peak memory. MFU, against the device's bf16 dense peak:
   - `mfu`: voxpipe's convention (`voxpipe mfu`): matmul FLOPs of what the model runs, full
     attention square, the local encoder on audio rows and the DiT on loss rows;
   - `mfu_every_row`: the same with the encoder and DiT on all B x L rows (upstream's model);
   - `mfu_published_convention`: the port's convention behind its 24.6 % on an Ascend 910C die
     at B=4, L=830 (the four stacks only, local towers over audio frames; mfu/published.py).
2. `memory`: peak memory per micro-batch 1..--table-max, full fine-tuning vs LoRA (eager).
3. `largest_micro_batch`: per mode, the largest micro-batch that trained without running out of
   memory (the table, then --search-step increments up to --search-max).

    .venv/bin/python benchmarks/accel_step.py [--device auto] [--preset voxcpm2] [--batch 4] [--seq-len 830]
        [--steps 10] [--warmup 3] [--kernels auto] [--no-compile] [--table-max 8] [--search-max 32]
    benchmarks/gpu_check.sh   # the whole check under a time limit, JSON to stdout
    .venv/bin/python benchmarks/accel_step.py --smoke   # tiny preset on the CPU, 1 x 32, 1 + 1 steps: seconds

A figure that cannot be had here is null, with its `*_null_reason` next to it: MFU on the CPU (no bf16
peak in the table; benchmarks/mfu_cpu.py measures a CPU's own), the whole run for the real shape on
the CPU (no GPU or NPU), `compile_speedup` with --no-compile.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _bench import nulls, parse_args
from mfu_cpu import padded_batch

from voxpipe.mfu.flops import batch_training_flops, training_flops
from voxpipe.mfu.peak import UnknownPeakError, device_name, peak_flops
from voxpipe.mfu.published import frames_only_flops
from voxpipe.model.config import preset
from voxpipe.model.npu import resolve_kernels, use_npu_kernels
from voxpipe.model.rows import host_rows
from voxpipe.model.voxcpm2 import VoxCPM2
from voxpipe.steps.train import LoraParams, TrainParams
from voxpipe.train import lora
from voxpipe.train.device import Runtime, distributed_runtime
from voxpipe.train.fsdp import shard_model
from voxpipe.train.loop import build_optimizer, clip_gradients
from voxpipe.train.throughput import peak_memory

DTYPE = torch.bfloat16


def log(msg: str) -> None:
    print(f"[bench accel_step] {msg}", file=sys.stderr, flush=True)


def synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        getattr(torch, device.type).synchronize(device)


def reset_memory(device: torch.device) -> None:
    gc.collect()
    if device.type != "cpu":
        getattr(torch, device.type).empty_cache()
        getattr(torch, device.type).reset_peak_memory_stats(device)


def out_of_memory(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


class Setup:
    """One model + optimizer as the trainer builds it (random init, built on the device)."""

    def __init__(self, rt: Runtime, config, args: argparse.Namespace, *, use_lora: bool, compile_blocks: bool
                 ) -> None:
        torch.manual_seed(0)
        self.rt = rt
        with torch.device(rt.device):
            self.model = VoxCPM2(config)
        if use_lora:
            lora.apply_lora(self.model, LoraParams(enabled=True))
            lora.reset_lora_parameters(self.model, seed=0)
        use_npu_kernels(self.model, resolve_kernels(args.kernels, rt.device))
        shard_model(self.model, rt, DTYPE, args.activation_checkpointing, compile_blocks)
        self.params = TrainParams()
        self.optimizer = build_optimizer(self.model, self.params, rt.device)

    def step(self, batch: dict[str, torch.Tensor], progress: float) -> tuple[float, float]:
        """(seconds, loss) of one optimizer step, device synchronized at both ends."""
        device = self.rt.device
        synchronize(device)
        begin = time.perf_counter()
        moved = {k: v.to(device, non_blocking=True) for k, v in {**batch, **host_rows(batch)}.items()}
        out = self.model(**moved, progress=progress)
        loss = out["loss/diff"] + out["loss/stop"]
        loss.backward()
        clip_gradients(self.model, self.params.clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        value = float(loss.detach())  # the step's one read, as in the trainer
        synchronize(device)
        return time.perf_counter() - begin, value

    def close(self) -> None:
        del self.model, self.optimizer
        reset_memory(self.rt.device)


def timed_run(
    rt: Runtime, config, args: argparse.Namespace, peak: float | None, peak_source: str, compile_blocks: bool
) -> dict[str, Any]:
    """Step time, MFU in three conventions (null without a peak, with peak_source as the reason) and peak
    memory at --batch x --seq-len."""
    reset_memory(rt.device)
    start = time.perf_counter()
    setup = Setup(rt, config, args, use_lora=False, compile_blocks=compile_blocks)
    batch = padded_batch(config, args.batch, args.seq_len)
    times, losses = [], []
    total = args.warmup + args.steps
    for step in range(total):
        took, loss = setup.step(batch, step / total)
        losses.append(loss)
        note = " (warm-up)" if step < args.warmup else ""
        mode = "compile" if compile_blocks else "eager"
        log(f"{mode} step {step + 1}: {took:.3f} s, loss {loss:.4f}{note}")
        if step >= args.warmup:
            times.append(took)
    memory, memory_kind = peak_memory(rt.device)
    parameters = sum(p.numel() for p in setup.model.parameters())
    setup.close()
    step_time = statistics.median(times)
    flops = {
        "mfu": batch_training_flops(config, batch),
        "mfu_every_row": training_flops(config, args.batch, args.seq_len),
        "mfu_published_convention": frames_only_flops(config, args.batch, args.seq_len),
    }
    return {
        "compile": compile_blocks,
        "parameters": parameters,
        "seconds_to_first_step_done": round(time.perf_counter() - start - sum(times), 2),
        "steps_timed": len(times),
        "step_time_s_median": step_time,
        "step_time_s_min": min(times),
        "tokens_per_s": args.batch * args.seq_len / step_time,
        "tflops_per_step": {k: v / 1e12 for k, v in flops.items()},
        "achieved_tflops": flops["mfu"] / step_time / 1e12,
        **{k: v / step_time / peak for k, v in flops.items() if peak},
        **({} if peak else nulls(flops, peak_source)),
        "peak_memory_gib": memory,
        "peak_memory_kind": memory_kind,
        "loss_first_last": [losses[0], losses[-1]],
    }


def memory_point(rt: Runtime, config, args: argparse.Namespace, batch_size: int, use_lora: bool) -> dict:
    """Peak memory of two optimizer steps at one micro-batch size (None where it ran out of memory)."""
    reset_memory(rt.device)
    setup = None
    try:
        setup = Setup(rt, config, args, use_lora=use_lora, compile_blocks=False)
        batch = padded_batch(config, batch_size, args.seq_len)
        took = min(setup.step(batch, 0.0)[0] for _ in range(2))
        memory, _ = peak_memory(rt.device)
        return {"micro_batch": batch_size, "fits": True, "peak_memory_gib": memory, "step_time_s": took}
    except (torch.OutOfMemoryError, RuntimeError) as e:
        if not out_of_memory(e):
            raise
        return {"micro_batch": batch_size, "fits": False, "peak_memory_gib": None, "step_time_s": None}
    finally:
        if setup is not None:
            setup.close()
        reset_memory(rt.device)


def memory_table(
    rt: Runtime, config, args: argparse.Namespace, result: dict, emit: Callable[[], None]
) -> None:
    """Micro-batch 1..table_max for full fine-tuning and LoRA, then a search for the largest that
    fits; fills result["memory"] and result["largest_micro_batch"], emitting after each point."""
    for mode, use_lora in (("full", False), ("lora", True)):
        rows = result["memory"][mode] = []
        sizes = [*range(1, args.table_max + 1), *range(args.table_max + args.search_step, args.search_max + 1,
                                                        args.search_step)]
        for b in sizes:
            rows.append(memory_point(rt, config, args, b, use_lora))
            log(f"memory {mode} B={b}: {rows[-1]}")
            fitting = [r["micro_batch"] for r in rows if r["fits"]]
            result["largest_micro_batch"][mode] = {
                "micro_batch": max(fitting) if fitting else 0,
                "searched_up_to": b,
                "bounded_by": "out of memory" if not rows[-1]["fits"] else "--search-max",
            }
            emit()
            if not rows[-1]["fits"]:
                break


def measure(rt: Runtime, config, args: argparse.Namespace, peak: float | None, peak_source: str,
            result: dict, emit: Callable[[], None]) -> None:
    """The timed runs (eager, then compiled), then the memory table; emitting after each part."""
    runs = result["runs"]
    for compile_blocks in (False, True)[: 1 if args.no_compile else 2]:
        runs.append(timed_run(rt, config, args, peak, peak_source, compile_blocks))
        if len(runs) == 2:
            result["compile_speedup"] = runs[0]["step_time_s_median"] / runs[1]["step_time_s_median"]
            del result["compile_speedup_null_reason"]
        emit()
    if args.search_max:
        memory_table(rt, config, args, result, emit)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "npu"])
    ap.add_argument("--preset", default="voxcpm2", choices=["tiny", "small", "voxcpm2"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=830)
    ap.add_argument("--steps", type=int, default=10, help="timed optimizer steps per run")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (allocator, compile)")
    ap.add_argument("--kernels", default="auto", choices=["auto", "fused", "eager"], help="model.kernels")
    ap.add_argument("--activation-checkpointing", action="store_true")
    ap.add_argument("--no-compile", action="store_true", help="skip the train.compile run")
    ap.add_argument("--table-max", type=int, default=8, help="memory table: micro-batch 1..N")
    ap.add_argument("--search-step", type=int, default=4)
    ap.add_argument("--search-max", type=int, default=32, help="largest micro-batch tried (0: no table)")
    ap.add_argument("--partial", default="", help="also rewrite this JSON file after each part (a time limit "
                    "that stops the run keeps what was measured)")
    args = parse_args(ap, preset="tiny", device="cpu", batch=1, seq_len=32, steps=1, warmup=1,
                      no_compile=True, table_max=1, search_max=1)

    with distributed_runtime(args.device) as rt:
        config = preset(args.preset)
        if rt.device.type == "cpu":
            peak, peak_source = None, ("a CPU has no dense bf16 peak in the table (benchmarks/mfu_cpu.py "
                                       "measures a CPU's own matmul peak)")
        else:
            try:
                peak, peak_source = peak_flops(rt.device, DTYPE)
            except UnknownPeakError as e:
                peak, peak_source = None, str(e)
        log(f"{args.preset} on {device_name(rt.device)} (torch {torch.__version__}), peak {peak_source}")
        result: dict[str, Any] = {
            "benchmark": "accel_step",
            "device": device_name(rt.device),
            "world_size": rt.world_size,
            "preset": args.preset,
            "param_dtype": "bfloat16",
            "kernels": resolve_kernels(args.kernels, rt.device).label,
            "batch_shape": [args.batch, args.seq_len],
            "activation_checkpointing": args.activation_checkpointing,
            "peak_tflops": peak / 1e12 if peak else None,
            "peak_source": peak_source,
            "goal_mfu": 0.40,
            "reference_mfu_published_convention": 0.246,
            "runs": [],
            "compile_speedup": None,
            "compile_speedup_null_reason": "--no-compile" if args.no_compile else "not measured yet",
            "memory_seq_len": args.seq_len,
            "memory": {},
            "largest_micro_batch": {},
        }

        def emit() -> None:
            if args.partial and rt.is_main:
                Path(args.partial).write_text(json.dumps(result, indent=2))

        if rt.device.type == "cpu" and args.preset == "voxcpm2":
            reason = ("no GPU or NPU here: the real voxcpm2 shape in bf16 takes hours a step on a CPU "
                      "(--smoke, or --preset tiny --device cpu, runs the same path)")
            result |= nulls(("runs", "compile_speedup", "memory", "largest_micro_batch"), reason)
            log(reason)
        else:
            measure(rt, config, args, peak, peak_source, result, emit)
        if rt.is_main:
            print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

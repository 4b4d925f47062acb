"""`voxpipe plan` against the measured peak of the same configuration on this device; prints one JSON.

For each configuration (full and LoRA, bf16, activation checkpointing, FSDP2 world of one, one
micro-batch of --batch x --seq-len): the plan (fake tensors, voxpipe.train.plan) and the real
steady-state step on the device, built the way train builds it (prepare_model, shard_model, the
trainer's AdamW: fused on an accelerator). Measured: on CUDA/NPU `max_memory_allocated` over the
second optimizer step (the first creates AdamW's moments), minus what was allocated before the
model was built; on the CPU, torch's FSDPMemTracker over the real tensors (the CPU validation of
tests/test_plan.py). `within_10_percent` is upstream's own tolerance for the tracker. The real
shape is not measured on the CPU (`measured_gib` null, with its reason): its real tensors are tens
of GiB there; the plan is still made.

    .venv/bin/python benchmarks/plan_check.py [--preset voxcpm2] [--device auto] [--batch 1]
        [--seq-len 830] [--cases lora full]
    .venv/bin/python benchmarks/plan_check.py --smoke   # tiny preset on the CPU, LoRA, 1 x 32: seconds
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from _bench import nulls, parse_args
from accel_step import reset_memory, synchronize

from voxpipe.model.config import preset
from voxpipe.model.rows import host_rows
from voxpipe.steps.train import LoraParams, TrainParams
from voxpipe.train import plan as P
from voxpipe.train.device import Runtime, distributed_runtime
from voxpipe.train.fsdp import DTYPES, prepare_model, shard_model
from voxpipe.train.loop import build_optimizer

GIB = 2**30


def log(msg: str) -> None:
    print(f"[bench plan_check] {msg}", file=sys.stderr, flush=True)


def measured_on_device(setup: P.Setup, rt: Runtime) -> float:
    """GiB the allocator held at the peak of a steady-state step, above what was there before."""
    device = rt.device
    reset_memory(device)
    before = getattr(torch, device.type).memory_allocated(device)
    dtype = DTYPES[setup.dtype]
    rows, length = setup.micro_batch()
    host = P.synthetic_batch(setup.config, rows, length)
    batch = {k: v.to(device) for k, v in {**host, **host_rows(host)}.items()}
    model = prepare_model(setup.config, dtype, setup.lora)
    shard_model(model, rt, dtype, setup.activation_checkpointing)
    model.to_empty(device=device)
    with torch.no_grad():
        for q in model.parameters():
            q.normal_(0.0, 0.02)
    optimizer = build_optimizer(model, TrainParams(lora=setup.lora), device)  # fused on an accelerator
    P.train_step(model, optimizer, batch)
    synchronize(device)
    getattr(torch, device.type).reset_peak_memory_stats(device)
    P.train_step(model, optimizer, batch)
    synchronize(device)
    peak = getattr(torch, device.type).max_memory_allocated(device) - before
    del model, optimizer, batch
    reset_memory(device)
    return peak / GIB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="voxcpm2")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=830)
    parser.add_argument("--cases", nargs="+", choices=["lora", "full"], default=["lora", "full"])
    args = parse_args(parser, preset="tiny", device="cpu", seq_len=32, cases=["lora"])
    config = preset(args.preset)
    cases = []
    for use_lora in (case == "lora" for case in args.cases):
        setup = P.Setup(config, 1, LoraParams(enabled=use_lora), True, "bfloat16", args.batch * args.seq_len)
        if setup.micro_batch() != (1, args.seq_len) and args.batch == 1:
            raise SystemExit(f"--seq-len {args.seq_len} exceeds the preset's max_length")
        log(f"planning {'LoRA' if use_lora else 'full'} ...")
        planned = sum(P.fake_peak(setup).values()) / GIB
        log(f"measuring {'LoRA' if use_lora else 'full'} ...")
        with distributed_runtime(args.device) as rt:
            if rt.device.type == "cpu" and args.preset == "voxcpm2":
                measured, kind = None, "no GPU or NPU here: the real shape's tensors are too large for a CPU"
            elif rt.device.type == "cpu":
                measured, kind = sum(P.tracked_peak(setup, rt, fake=False).values()) / GIB, "tracker (cpu)"
            else:
                measured, kind = measured_on_device(setup, rt), "max_memory_allocated"
        case = {"lora": use_lora, "micro_batch": list(setup.micro_batch()), "planned_gib": round(planned, 3)}
        if measured is None:
            case |= nulls(("measured_gib", "ratio", "within_10_percent"), kind)
        else:
            case |= {"measured_gib": round(measured, 3), "measured_by": kind,
                     "ratio": round(planned / measured, 3) if measured else None,
                     "within_10_percent": bool(measured) and abs(planned - measured) <= 0.1 * measured}
        cases.append(case)
        log(json.dumps(cases[-1]))
    print(json.dumps({"preset": args.preset, "device": args.device, "cases": cases}))


if __name__ == "__main__":
    main()

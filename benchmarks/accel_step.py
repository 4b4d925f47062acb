"""Training step time and MFU of the real `voxcpm2` shape on an accelerator (random weights); prints JSON.

What runs is the trainer's own path (voxpipe.train): FSDP2 `fully_shard` per decoder layer and
the root with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), the trainer's AdamW
(fused) and DTensor-aware clipping at 1.0, on synthetic right-padded batches [B, L] shaped like
the encoded data (per row a quarter text + audio_start, then target audio patches, then a little
padding; see mfu_cpu.py). Weights are the model's own random init; nothing is read or written.

MFU, each against the device's bf16 dense peak from voxpipe.mfu.peak's table:
- `mfu`: voxpipe's convention, the one `voxpipe mfu` reports: matmul FLOPs of what the model
  runs, full attention square, the local DiT on the loss-weighted patch rows only;
- `mfu_dit_every_row`: the same with the DiT counted on all B x L rows (what upstream's model runs);
- `mfu_published_convention`: the port's convention behind its 24.6 % on an Ascend 910C die at
  B=4, L=830 (the four stacks only, local towers over audio frames; voxpipe/mfu/published.py).

    .venv/bin/python benchmarks/accel_step.py [--device auto] [--preset voxcpm2] [--batch 4] [--seq-len 830]
        [--steps 20] [--warmup 3] [--activation-checkpointing]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from mfu_cpu import padded_batch

from voxpipe.mfu.flops import batch_dit_rows, training_flops
from voxpipe.mfu.peak import device_name, peak_flops
from voxpipe.mfu.published import frames_only_flops
from voxpipe.model.config import preset
from voxpipe.model.voxcpm2 import VoxCPM2
from voxpipe.params import TrainParams
from voxpipe.train.device import distributed_runtime
from voxpipe.train.fsdp import shard_model
from voxpipe.train.loop import build_optimizer, clip_gradients


def log(msg: str) -> None:
    print(f"[bench accel_step] {msg}", file=sys.stderr, flush=True)


def synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        getattr(torch, device.type).synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "npu"])
    ap.add_argument("--preset", default="voxcpm2", choices=["tiny", "small", "voxcpm2"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=830)
    ap.add_argument("--steps", type=int, default=20, help="timed optimizer steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (allocator, kernel choice)")
    ap.add_argument("--activation-checkpointing", action="store_true")
    args = ap.parse_args()

    with distributed_runtime(args.device) as rt:
        config = preset(args.preset)
        dtype = torch.bfloat16
        torch.manual_seed(0)
        start = time.perf_counter()
        with torch.device(rt.device):
            model = VoxCPM2(config)
        shard_model(model, rt, dtype, args.activation_checkpointing)
        params = TrainParams()
        optimizer = build_optimizer(model, params, rt.device)
        parameters = sum(p.numel() for p in model.parameters())
        built = time.perf_counter() - start
        log(f"{args.preset}: {parameters / 1e9:.3f} B parameters on {rt.device}, built in {built:.1f} s")

        batch = {k: v.to(rt.device) for k, v in padded_batch(config, args.batch, args.seq_len).items()}
        times, losses = [], []
        for step in range(args.warmup + args.steps):
            synchronize(rt.device)
            begin = time.perf_counter()
            out = model(**batch, progress=step / (args.warmup + args.steps))
            loss = out["loss/diff"] + out["loss/stop"]
            loss.backward()
            clip_gradients(model, params.clip_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            synchronize(rt.device)
            took = time.perf_counter() - begin
            losses.append(float(loss.detach()))
            note = " (warm-up)" if step < args.warmup else ""
            log(f"step {step + 1}: {took:.3f} s, loss {losses[-1]:.4f}{note}")
            if step >= args.warmup:
                times.append(took)

        step_time = statistics.median(times)
        peak, peak_source = peak_flops(rt.device, dtype)
        dit_rows = batch_dit_rows(batch)
        flops = {
            "mfu": training_flops(config, args.batch, args.seq_len, dit_rows=dit_rows),
            "mfu_dit_every_row": training_flops(config, args.batch, args.seq_len),
            "mfu_published_convention": frames_only_flops(config, args.batch, args.seq_len),
        }
        accelerator = getattr(torch, rt.device.type) if rt.device.type != "cpu" else None
        memory = accelerator.max_memory_allocated(rt.device) if accelerator else None
        result = {
            "benchmark": "accel_step",
            "device": device_name(rt.device),
            "world_size": rt.world_size,
            "preset": args.preset,
            "parameters": parameters,
            "param_dtype": "bfloat16",
            "batch_shape": [args.batch, args.seq_len],
            "dit_rows": dit_rows,
            "activation_checkpointing": args.activation_checkpointing,
            "steps_timed": len(times),
            "step_time_s_median": step_time,
            "step_time_s_min": min(times),
            "tokens_per_s": args.batch * args.seq_len / step_time,
            "peak_tflops": peak / 1e12,
            "peak_source": peak_source,
            "tflops_per_step": {k: v / 1e12 for k, v in flops.items()},
            **{k: v / step_time / peak for k, v in flops.items()},
            "reference_mfu_published_convention": 0.246,
            "max_memory_allocated_gib": memory / 2**30 if memory is not None else None,
            "loss_first_last": [losses[0], losses[-1]],
        }
        if rt.is_main:
            print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

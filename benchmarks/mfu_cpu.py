"""This CPU's GEMM peak (fp32, bf16) and the MFU of the `small` preset training on it; prints JSON.

Times real optimizer steps (forward + backward + AdamW) of voxpipe's VoxCPM2 at a realistic
small padded shape (a right-padded batch: text, audio_start, target patches, padding), and
divides the analytic model FLOPs by the measured GEMM peak of the training dtype.

    .venv/bin/python benchmarks/mfu_cpu.py [--preset small] [--batch 4] [--seq-len 200] [--steps 3]
        [--gemm-size 2048] [--gemm-budget-s 1.5]
    .venv/bin/python benchmarks/mfu_cpu.py --smoke   # tiny preset, 1 x 32, one timed step: seconds
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from _bench import parse_args

from voxpipe.mfu.flops import (
    batch_rows,
    batch_training_flops,
    forward_flops,
    tower_shares,
)
from voxpipe.mfu.peak import CPU_GEMM_BUDGET_S, CPU_GEMM_SIZE, measure_cpu_gemm_peak
from voxpipe.model.config import preset
from voxpipe.model.voxcpm2 import VoxCPM2


def log(msg: str) -> None:
    print(f"[bench mfu_cpu] {msg}", file=sys.stderr, flush=True)


def padded_batch(config, b: int, length: int) -> dict[str, torch.Tensor]:
    """Rows with a quarter text, then target patches, and a different amount of right padding each."""
    p, d = config.patch_size, config.feat_dim
    text_mask = torch.zeros(b, length)
    audio_mask = torch.zeros(b, length)
    labels = torch.zeros(b, length, dtype=torch.long)
    for row in range(b):
        real = length - 7 * row
        text = real // 4
        text_mask[row, : text + 1] = 1  # text ids + audio_start
        audio_mask[row, text + 1 : real] = 1
        labels[row, real - 1] = 1
    tokens = torch.randint(110, config.lm_config.vocab_size, (b, length)) * text_mask.long()
    return {
        "text_tokens": tokens,
        "text_mask": text_mask,
        "audio_feats": torch.randn(b, length, p, d) * audio_mask[..., None, None],
        "audio_mask": audio_mask,
        "loss_mask": audio_mask,
        "position_ids": torch.arange(length).expand(b, length),
        "labels": labels,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", choices=["tiny", "small"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=200)
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    parser.add_argument("--gemm-size", type=int, default=CPU_GEMM_SIZE, help="the peak's square matmul size")
    parser.add_argument("--gemm-budget-s", type=float, default=CPU_GEMM_BUDGET_S,
                        help="seconds of matmuls per dtype (at least two)")
    args = parse_args(parser, preset="tiny", batch=1, seq_len=32, steps=1, gemm_size=256, gemm_budget_s=0)

    torch.manual_seed(0)
    peaks = {name: measure_cpu_gemm_peak(getattr(torch, name), size=args.gemm_size,
                                         budget_s=args.gemm_budget_s) for name in ("float32", "bfloat16")}
    log("gemm peak: " + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in peaks.items()))

    config = preset(args.preset)
    model = VoxCPM2(config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = padded_batch(config, args.batch, args.seq_len)
    times = []
    for step in range(args.steps + 1):
        start = time.perf_counter()
        losses = model(**batch)
        (losses["loss/diff"] + losses["loss/stop"]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        took = time.perf_counter() - start
        log(f"step {step} ({'warm-up' if step == 0 else 'timed'}): {took:.2f} s")
        if step:
            times.append(took)

    rows = batch_rows(batch)
    flops = batch_training_flops(config, batch)
    step_time = sum(times) / len(times)
    achieved = flops / step_time
    print(
        json.dumps(
            {
                "threads": torch.get_num_threads(),
                "cpu_peak_tflops": {k: v / 1e12 for k, v in peaks.items()},
                "preset": args.preset,
                "parameters": sum(p.numel() for p in model.parameters()),
                "dtype": "float32",
                "batch_shape": [args.batch, args.seq_len],
                "flops_per_step": flops,
                "step_times_s": times,
                "step_time_s": step_time,
                "achieved_tflops": achieved / 1e12,
                "mfu": achieved / peaks["float32"],
                "mfu_best_step": flops / min(times) / peaks["float32"],
                "load_avg_1m": os.getloadavg()[0],  # other processes on the cores skew both figures
                "tokens_per_s": args.batch * args.seq_len / step_time,
                "tower_shares": tower_shares(
                    forward_flops(config, args.batch, args.seq_len, **rows)
                ),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

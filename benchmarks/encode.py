"""AudioVAE encoding throughput: length-sorted batches (`voxpipe encode`) vs one clip per call; prints JSON.

One clip per call is upstream's way (its training packer encodes each clip on every step).
Both sides use the same random weights of the chosen preset's VAE config, the same clips (the
shipped sample's speech, decoded to 16 kHz once, outside the timing), the same padding to a
multiple of 2560 samples and the same device; only the grouping differs. Each figure is the best
of `--repeats` timed passes after one warm-up pass.

    .venv/bin/python benchmarks/encode.py [--preset tiny] [--clips 20] [--batch-seconds 8 60] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch

from voxpipe.data.audio import decode
from voxpipe.data.encode import encode_batch, plan_batches
from voxpipe.model.audiovae import AudioVAE
from voxpipe.model.config import preset

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample"


def log(msg: str) -> None:
    print(f"[bench encode] {msg}", file=sys.stderr, flush=True)


def sample_clips(n: int) -> list:
    clips = []
    for f in sorted(SAMPLE.glob("*.parquet")):
        for row in pq.read_table(f, columns=["audio"]).to_pylist():
            clips.append(decode(row["audio"]["bytes"], 16000))
            if len(clips) == n:
                return clips
    return clips


def best_of(fn, repeats: int) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of the fastest of `repeats` passes after a warm-up pass."""
    fn()  # first-call allocations and kernel selection
    runs = []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        runs.append((time.perf_counter() - wall, time.process_time() - cpu))
    return min(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny", choices=["tiny", "small", "voxcpm2"])
    ap.add_argument("--clips", type=int, default=20)
    ap.add_argument("--batch-seconds", type=float, nargs="+", default=[8.0, 60.0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    config = preset(args.preset)
    torch.manual_seed(0)
    vae = AudioVAE(config.audio_vae_config).float().eval().requires_grad_(False).to(args.device)
    multiple = vae.hop_length * config.patch_size
    clips = sorted(sample_clips(args.clips), key=len)  # `encode` sorts pending clips by length too
    padded = [math.ceil(len(c) / multiple) * multiple for c in clips]
    seconds = sum(len(c) for c in clips) / vae.sample_rate
    log(f"{len(clips)} clips, {seconds:.1f} s audio, {args.preset} VAE, {torch.get_num_threads()} threads")

    def run(batches: list[list[int]]) -> list[torch.Tensor]:
        return [z for b in batches for z in encode_batch(vae, [clips[i] for i in b], multiple, args.device)]

    singles = [[i] for i in range(len(clips))]
    reference = run(singles)
    wall, cpu = best_of(lambda: run(singles), args.repeats)
    log(f"one at a time: {wall:.2f} s wall, {cpu:.2f} s CPU")
    result = {
        "benchmark": "encode",
        "vae_config": f"preset {args.preset}: " + json.dumps(vae.config.model_dump(), sort_keys=True),
        "vae_parameters": sum(p.numel() for p in vae.parameters()),
        "device": args.device,
        "torch_threads": torch.get_num_threads(),
        "clips": len(clips),
        "audio_seconds": round(seconds, 2),
        "one_at_a_time": {"clips_per_s": round(len(clips) / wall, 3), "cpu_seconds": round(cpu, 3)},
        "batched": [],
    }
    for batch_seconds in args.batch_seconds:
        batches = plan_batches(padded, int(batch_seconds * vae.sample_rate))
        # same latents either way (the encoder is causal), so the speed-up is not bought with errors
        max_diff = max(float((a - b).abs().max()) for a, b in zip(reference, run(batches), strict=True))
        b_wall, b_cpu = best_of(lambda batches=batches: run(batches), args.repeats)
        log(f"batches of <= {batch_seconds} s: {b_wall:.2f} s wall, {b_cpu:.2f} s CPU")
        padded_samples = sum(len(b) * max(padded[i] for i in b) for b in batches)
        result["batched"].append({
            "batch_seconds": batch_seconds,
            "batches": len(batches),
            "padding_fraction": round(padded_samples / sum(len(c) for c in clips) - 1, 4),
            "clips_per_s": round(len(clips) / b_wall, 3),
            "cpu_seconds": round(b_cpu, 3),
            "speedup": round(wall / b_wall, 3),
            "max_abs_diff": max_diff,
        })
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

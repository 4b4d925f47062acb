"""AudioVAE encoding throughput; prints JSON. Two comparisons:

Batching (default): length-sorted batches (`voxpipe encode`) vs one clip per call, upstream's way
(its training packer encodes each clip on every step). Both sides use the same random weights of
the chosen preset's VAE config, the same clips (the shipped sample's speech, decoded to 16 kHz
once, outside the timing), the same padding to a multiple of 2560 samples and the same device;
only the grouping differs. Each figure is the best of `--repeats` timed passes after one warm-up.

Ranks (`--ranks 1 2`): the real `voxpipe encode` under `torchrun --nproc_per_node=N`, one run per
N on a fresh output folder, on the sample's clips written as FLAC with a manifest, with a
random-init checkpoint of each `--presets`. The rate is the encode phase's (run.json: planning,
decoding, the VAE and the ranks' final exchange; not process start-up or loading the model), and
every row's latents must equal the 1-rank run's bit for bit. On a machine shared with other work the
wall-clock speed-up is whatever CPU the scheduler grants, so each rank's CPU seconds are reported
too: `speedup_cpu_bound` = the 1-rank CPU time over the busiest rank's, the speed-up with a free
core per rank.

    .venv/bin/python benchmarks/encode.py [--preset tiny] [--clips 20] [--batch-seconds 8 60] [--threads 1]
    .venv/bin/python benchmarks/encode.py --ranks 1 2 [--presets tiny small] [--clips 64]
    .venv/bin/python benchmarks/encode.py --smoke [--ranks 1 2]   # tiny VAE, 4 clips, one pass: seconds
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch
from _bench import parse_args

from voxpipe.data.audio import decode
from voxpipe.data.dataset import EncodedDataset
from voxpipe.data.encode.plan import plan_batches
from voxpipe.model.audiovae import AudioVAE
from voxpipe.model.config import preset
from voxpipe.model.encoder import encode_batch
from voxpipe.steps.model import ModelParams
from voxpipe.train.init_model import init_model

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample"


def log(msg: str) -> None:
    print(f"[bench encode] {msg}", file=sys.stderr, flush=True)


def sample_rows(n: int) -> list[dict]:
    rows: list[dict] = []
    for f in sorted(SAMPLE.glob("*.parquet")):
        rows += pq.read_table(f, columns=["audio", "text"]).to_pylist()
    return rows[:n]


def sample_clips(n: int) -> list:
    return [decode(row["audio"]["bytes"], 16000) for row in sample_rows(n)]


def write_manifest(folder: Path, n: int) -> Path:
    """The sample's first n clips as 16 kHz FLAC files plus a manifest pointing at them."""
    import soundfile as sf

    lines = []
    for i, row in enumerate(sample_rows(n)):
        path = folder / "audio" / f"{i:04d}.flac"
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(path, decode(row["audio"]["bytes"], 16000), 16000)
        lines.append(json.dumps({"id": f"{i:04d}", "audio": str(path), "text": row["text"]}) + "\n")
    manifest = folder / "clips.jsonl"
    manifest.write_text("".join(lines))
    return manifest


def run_ranks(nproc: int, manifest: Path, base: Path, out: Path) -> tuple[dict, float]:
    """`voxpipe encode` under torchrun; (run.json, wall seconds of the whole command)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "voxpipe.cli", "encode", "--manifest", str(manifest), "--model-base", str(base),
           "--out", str(out), "--device", "cpu"]
    wall = time.perf_counter()
    # from the manifest's folder, so no params.yaml is read
    done = subprocess.run(cmd, cwd=manifest.parent, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(SAMPLE.parents[1])})
    wall = time.perf_counter() - wall
    if done.returncode:
        sys.exit(f"torchrun --nproc_per_node={nproc} failed:\n{done.stdout}\n{done.stderr}")
    return json.loads((out / "run.json").read_text()), wall


def bit_identical(a: Path, b: Path) -> bool:
    da, db = EncodedDataset(a, "clips"), EncodedDataset(b, "clips")
    return [r["id"] for r in da.rows] == [r["id"] for r in db.rows] and all(
        torch.equal(da[i].latents, db[i].latents) for i in range(len(da))
    )


def ranks(args: argparse.Namespace) -> dict:
    result: dict = {"benchmark": "encode_ranks", "clips": args.clips, "cpu_count": os.cpu_count(),
                    "note": "one run each on a shared 2-core machine loaded by other work", "presets": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        manifest = write_manifest(work / "data", args.clips)
        for name in args.presets:
            base = work / f"base-{name}"
            init_model(ModelParams(preset=name, out=str(base)))
            runs = {}
            for n in args.ranks:
                run, wall = run_ranks(n, manifest, base, work / f"out-{name}-{n}")
                log(f"{name} VAE, {n} rank(s): {run['clips_per_s']} clips/s, {wall:.1f} s wall")
                runs[n] = {"clips_per_s": run["clips_per_s"], "encode_seconds": run["encode_seconds"],
                           "audio_seconds": run["audio_seconds_encoded"],
                           "command_wall_seconds": round(wall, 2),
                           "clips_per_rank": [r["clips_encoded"] for r in run["ranks"]],
                           "cpu_seconds_per_rank": [r["cpu_seconds"] for r in run["ranks"]]}
            first = args.ranks[0]
            for n in args.ranks[1:]:
                runs[n]["speedup"] = round(runs[n]["clips_per_s"] / runs[first]["clips_per_s"], 3)
                # what the split would give with a core per rank: the busiest rank's CPU time bounds it
                runs[n]["speedup_cpu_bound"] = round(
                    sum(runs[first]["cpu_seconds_per_rank"]) / max(runs[n]["cpu_seconds_per_rank"]), 3)
                runs[n][f"latents_bit_identical_to_{first}_rank"] = bit_identical(
                    work / f"out-{name}-{n}", work / f"out-{name}-{first}")
            result["presets"].append({"preset": name, "ranks": runs})
    return result


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
    ap.add_argument("--ranks", type=int, nargs="+", help="compare `voxpipe encode` under torchrun at these N")
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"], choices=["tiny", "small"])
    args = parse_args(ap, preset="tiny", clips=4, batch_seconds=[8.0], repeats=1, presets=["tiny"])
    if args.ranks:
        print(json.dumps(ranks(args), indent=2))
        return
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

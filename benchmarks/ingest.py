"""Ingest throughput (1 worker vs all cores) and peak memory at 1x and 10x input size; prints JSON.

The input is the shipped sample replicated with a different gain per copy, so every row is distinct
audio (nothing is reused or quarantined as a duplicate) and the work per row matches real data.
Each ingest runs as `python -m voxpipe.cli ingest` in a subprocess; its peak memory is the largest
sum of VmRSS over the whole process tree (parent + forkserver + decode workers), sampled every 20 ms,
and its CPU seconds are summed over the same tree. Throughput is the best of `--repeats` runs.

    .venv/bin/python benchmarks/ingest.py [--copies 32] [--scale 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"
ROWS_PER_FILE = 256
ROW_GROUP_ROWS = 32
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[bench ingest] {msg}", file=sys.stderr, flush=True)


def load_sample() -> list[tuple[np.ndarray, int, str, str]]:
    rows = []
    for f in sorted(SAMPLE.glob("*.parquet")):
        for r in pq.read_table(f).to_pylist():
            x, sr = sf.read(io.BytesIO(r["audio"]["bytes"]), dtype="float32")
            rows.append((x, sr, r["text"], r["speaker"]))
    return rows


def build_dataset(folder: Path, sample: list, copies: int, max_copies: int) -> dict:
    """`copies` gain-shifted copies of the sample as HF-style parquet files; returns its size."""
    folder.mkdir(parents=True)
    schema = pa.schema([("audio", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                        ("text", pa.string()), ("speaker", pa.string())])
    batch: list[dict] = []
    n_files = seconds = 0

    def flush() -> None:
        nonlocal n_files, batch
        pq.write_table(pa.Table.from_pylist(batch, schema=schema), folder / f"train-{n_files:05d}.parquet",
                       row_group_size=ROW_GROUP_ROWS)
        n_files += 1
        batch = []

    for k in range(copies):
        gain = 1.0 - 0.5 * k / max_copies
        for i, (x, sr, text, speaker) in enumerate(sample):
            buf = io.BytesIO()
            sf.write(buf, x * gain, sr, format="FLAC", subtype="PCM_16")
            batch.append({"audio": {"bytes": buf.getvalue(), "path": f"c{k}_{i}.flac"}, "text": text,
                          "speaker": speaker})
            seconds += len(x) / sr
            if len(batch) == ROWS_PER_FILE:
                flush()
    if batch:
        flush()
    size = sum(f.stat().st_size for f in folder.glob("*.parquet"))
    return {"rows": copies * len(sample), "audio_hours": round(seconds / 3600, 3),
            "parquet_mb": round(size / 2**20, 1)}


def _tree_sample(pid: int) -> dict[int, tuple[int, float]]:
    """pid → (VmRSS kB, CPU seconds so far) for pid and all its descendants (gone ones are skipped)."""
    found: dict[int, tuple[int, float]] = {}
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text().splitlines()
            rss = next((int(line.split()[1]) for line in status if line.startswith("VmRSS:")), 0)
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            found[p] = (rss, (int(fields[11]) + int(fields[12])) / CLOCK_TICKS)
            for task in Path(f"/proc/{p}/task").iterdir():
                stack += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def run_ingest(data: Path, out: Path, workers: int) -> dict:
    """One ingest in a subprocess: its report's figures plus peak tree RSS and CPU seconds used."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "voxpipe.cli", "ingest", "--params", os.devnull, "--input", str(data),
           "--out", str(out), "--workers", str(workers)]
    peak_kb, cpu = 0, {}
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while proc.poll() is None:
        sample = _tree_sample(proc.pid)
        peak_kb = max(peak_kb, sum(rss for rss, _ in sample.values()))
        cpu.update({p: c for p, (_, c) in sample.items()})
        time.sleep(0.02)
    if proc.returncode != 0:
        raise SystemExit(f"ingest failed with exit code {proc.returncode}: {' '.join(cmd)}")
    report = json.loads((out / "report.json").read_text())
    assert report["rows_kept"] == report["rows_in"], "benchmark rows must all be kept"
    return {
        "rows": report["rows_in"],
        "workers": report["workers"],
        "seconds": report["timings"]["seconds"],
        "rows_per_s": report["timings"]["rows_per_s"],
        "audio_seconds_per_s": report["timings"]["audio_seconds_per_s"],
        "cpu_seconds": round(sum(cpu.values()), 2),
        # well under `workers` means other load on the machine starved the run: compare with care
        "cores_used": round(sum(cpu.values()) / max(report["timings"]["seconds"], 1e-9), 2),
        "peak_rss_tree_mb": round(peak_kb / 1024, 1),
    }


def best_of(repeats: int, data: Path, out: Path, workers: int) -> dict:
    """Fastest of several runs: other load on the machine only ever slows a run down."""
    runs = [run_ingest(data, out, workers) for _ in range(repeats)]
    return min(runs, key=lambda r: r["seconds"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=32, help="sample copies in the 1x data set")
    ap.add_argument("--scale", type=int, default=10, help="size of the large data set, in multiples of 1x")
    ap.add_argument("--repeats", type=int, default=3, help="throughput runs per setting; the fastest counts")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="voxpipe-bench-ingest-"))
    try:
        sample = load_sample()
        max_copies = args.copies * args.scale
        log(f"building 1x ({args.copies} copies) and {args.scale}x data sets in {work}")
        small = build_dataset(work / "x1", sample, args.copies, max_copies)
        large = build_dataset(work / "xN", sample, max_copies, max_copies)
        log(f"ingest 1x with 1 worker, best of {args.repeats}")
        one = best_of(args.repeats, work / "x1", work / "out", 1)
        log(f"ingest 1x with {cores} workers, best of {args.repeats}")
        every = best_of(args.repeats, work / "x1", work / "out", cores)
        log(f"ingest {args.scale}x with {cores} workers")
        big = run_ingest(work / "xN", work / "out", cores)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    speed = ("rows", "seconds", "rows_per_s", "audio_seconds_per_s", "cpu_seconds", "cores_used")
    print(json.dumps({
        "cpu_count": cores,
        "load_average_1min": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
        "dataset_1x": small,
        f"dataset_{args.scale}x": large,
        "throughput_1x": {
            "one_worker": {k: one[k] for k in speed},
            "all_cores": {"workers": every["workers"], **{k: every[k] for k in speed}},
            "speedup": round(every["rows_per_s"] / one["rows_per_s"], 2),
            "goal_speedup": 1.7,
            # CPU seconds of the whole process tree: how much work the pool adds, whatever the load
            "pool_cpu_overhead": round(every["cpu_seconds"] / one["cpu_seconds"] - 1, 3),
        },
        f"throughput_{args.scale}x_all_cores": {k: big[k] for k in speed},
        "peak_rss_mb": {
            "what": "largest sum of VmRSS over the ingest process and its decode workers (all cores)",
            "x1": every["peak_rss_tree_mb"],
            f"x{args.scale}": big["peak_rss_tree_mb"],
            "growth_mb": round(big["peak_rss_tree_mb"] - every["peak_rss_tree_mb"], 1),
            "goal_growth_mb": 50,
        },
    }, indent=2))


if __name__ == "__main__":
    main()

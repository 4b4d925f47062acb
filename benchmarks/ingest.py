"""Sharded ingest: rows/s with 1 vs 2 shards (`voxpipe ingest --shards N`, and the KFP fan-out under
kfp.local), peak memory per shard at 1x and 10x input, and the merge's; prints JSON.

The input is the shipped sample replicated with a different gain per copy, so every row is distinct
audio (nothing is reused or quarantined as a duplicate) and the work per row matches real data.
Each CLI run is a subprocess; its peak memory is the largest sum of VmRSS over the whole process
tree (parent + forkserver + decode workers), sampled every 20 ms, and its CPU seconds are summed
over the same tree. Every run is done once: on a shared machine, read `cores_used` next to a rate
(well under the worker count means other load slowed that run). Every sharded output's raw.jsonl
is checked to equal the 1-shard run's byte for byte.

`--conditioning` measures only what ingest's conditioning costs (issue 24): the sample at 1x and at
`--scale`x, ingested with every new step on, with all but the quality score on, and with all off
(`trim_silence`, `normalize_loudness`, `score_quality`, `normalize_text`), one after another in this
run; it prints the throughput ratios and the peak memory of the largest single process at 1x and at
the scale, which must stay flat as the input grows. Each copy carries its own faint noise floor
(-80 dBFS), so that loudness normalization does not make gain-shifted copies duplicates.

    .venv/bin/python benchmarks/ingest.py [--copies 8] [--scale 10] [--rows 0] [--no-kfp] [--no-large]
        [--no-quality]
    flock /tmp/voxpipe-heavy.lock .venv/bin/python benchmarks/ingest.py --conditioning [--scale 10]
    .venv/bin/python benchmarks/ingest.py --smoke [--conditioning]   # 4 rows, 1 copy: seconds

A part left out by a flag is null in the JSON, with its `*_null_reason`; `--smoke` leaves out
kfp.local, the large set and the quality score (each of them costs seconds of start-up per process).
"""

import argparse
import contextlib
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
from _bench import nulls, parse_args

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"
ROWS_PER_FILE = 256
ROW_GROUP_ROWS = 32
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[bench ingest] {msg}", file=sys.stderr, flush=True)


def load_sample(limit: int) -> list[tuple[np.ndarray, int, str, str]]:
    """The shipped sample's rows decoded, its first `limit` of them (0: all)."""
    rows = []
    for f in sorted(SAMPLE.glob("*.parquet")):
        for r in pq.read_table(f).to_pylist():
            x, sr = sf.read(io.BytesIO(r["audio"]["bytes"]), dtype="float32")
            rows.append((x, sr, r["text"], r["speaker"]))
    return rows[:limit] if limit else rows


def build_dataset(folder: Path, sample: list, copies: int, max_copies: int) -> dict:
    """`copies` gain-shifted copies of the sample as HF-style parquet files, with the sample's voices'
    consent records (voices.yaml: the same speakers); returns its size."""
    folder.mkdir(parents=True)
    shutil.copy(SAMPLE / "voices.yaml", folder)
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
        floor = np.random.default_rng(k).standard_normal(max(len(x) for x, *_ in sample)).astype(np.float32)
        for i, (x, sr, text, speaker) in enumerate(sample):
            buf = io.BytesIO()
            sf.write(buf, x * gain + 1e-4 * floor[: len(x)], sr, format="FLAC", subtype="PCM_16")
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


def measure(cmd: list[str], cwd: Path = REPO) -> dict:
    """One subprocess: wall seconds, peak VmRSS summed over its process tree, CPU seconds of the tree."""
    peak_kb, peak_one_kb, cpu = 0, 0, {}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while proc.poll() is None:
        sample = _tree_sample(proc.pid)
        peak_kb = max(peak_kb, sum(rss for rss, _ in sample.values()))
        peak_one_kb = max([peak_one_kb, *(rss for rss, _ in sample.values())])
        cpu.update({p: c for p, (_, c) in sample.items()})
        time.sleep(0.02)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        err = proc.stderr.read().decode()[-2000:]
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{err}")
    return {"seconds": round(wall, 2), "peak_rss_tree_mb": round(peak_kb / 1024, 1),
            "peak_rss_process_mb": round(peak_one_kb / 1024, 1),
            "cpu_seconds": round(sum(cpu.values()), 2), "cores_used": round(sum(cpu.values()) / wall, 2)}


def voxpipe(step: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "voxpipe.cli", step, "--params", os.devnull, *args]


def cli_shards(data: Path, out: Path, shards: int, rows: int, sets: list[str]) -> dict:
    """`voxpipe ingest --shards N` end to end (plan, shards one after another, merge)."""
    shutil.rmtree(out, ignore_errors=True)
    run = measure(voxpipe("ingest", "--input", str(data), "--out", str(out), "--shards", str(shards), *sets))
    report = json.loads((out / "report.json").read_text())
    assert report["rows_kept"] == report["rows_in"] == rows, "benchmark rows must all be kept"
    return {"rows_per_s": round(rows / run["seconds"], 1), **run}


def per_shard(data: Path, work: Path, shards: int, sets: list[str]) -> dict:
    """plan, each shard and the merge as separate processes: the peak memory of each."""
    shutil.rmtree(work, ignore_errors=True)
    plan = measure(voxpipe("ingest-plan", "--input", str(data), "--out", str(work / "plan"), "--shards",
                           str(shards), *sets))
    plan_file = work / "plan" / "plan.json"
    runs, folders = [], []
    for index in range(len(json.loads(plan_file.read_text())["shards"])):
        folder = work / f"shard-{index}"
        runs.append(measure(voxpipe("ingest-shard", "--plan", str(plan_file), "--shard", str(index), "--out",
                                    str(folder), *sets)))
        runs[-1]["rows"] = json.loads((folder / "report.json").read_text())["rows_in"]
        folders.append(str(folder))
    merge = measure(voxpipe("ingest-merge", "--plan", str(plan_file), "--shard-dirs", *folders, "--out",
                            str(work / "merged"), *sets))
    merge["rows_per_s"] = round(sum(r["rows"] for r in runs) / merge["seconds"], 1)
    return {"plan": plan, "shards": runs, "merge": merge, "raw": (work / "merged" / "raw.jsonl").read_bytes()}


def kfp_local(data: Path, work: Path, shards: int, rows: int) -> dict:
    """The pipeline's ingest fan-out (plan → ParallelFor of shard tasks → merge over Collected) under
    kfp.local's SubprocessRunner: wall time of the whole sub-pipeline, task start-up included."""
    from kfp import dsl, local

    sys.path.insert(0, str(REPO))  # components/ and pipelines/ are not installed
    from pipelines import common as pipeline
    from voxpipe.lineage import dvc_md5

    @dsl.pipeline
    def fanned_out(workspace: str, data_version: str, params: dict) -> dsl.Dataset:
        return pipeline.fan_out_ingest(workspace, data_version, params)[2].outputs["data"]

    shutil.rmtree(work, ignore_errors=True)
    (work / "workspace").mkdir(parents=True)
    os.symlink(data, work / "workspace" / "data")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(work / "kfp"))
    params = {**pipeline.DICT_DEFAULTS["ingest"], "input": ["data"], "shards": shards}
    cwd = os.getcwd()
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # kfp.local streams the tasks' logs: keep stdout JSON
            run = fanned_out(workspace=str(work / "workspace"), data_version=dvc_md5(data), params=params)
    finally:
        os.chdir(cwd)
    wall = time.perf_counter() - start
    out = Path(run.output.metadata["path"])
    raw = (out / "raw.jsonl").read_bytes()
    return {"seconds": round(wall, 2), "rows_per_s": round(rows / wall, 1), "raw": raw}


def vae_encode_gflop_per_audio_second() -> float:
    """FLOPs of AudioVAE v2's encoder (upstream's published config, the real model's) per second of
    16 kHz audio, counted by torch's FlopCounterMode on the meta device."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from voxpipe.model.audiovae import AudioVAE, AudioVAEConfig

    with torch.device("meta"):
        vae = AudioVAE(AudioVAEConfig())
        with FlopCounterMode(display=False) as counter:
            vae.encode(torch.zeros(1, 1, 16000 * 10))
    return round(counter.get_total_flops() / 10 / 1e9, 2)


CONDITIONING = ("trim_silence", "normalize_loudness", "score_quality", "normalize_text")


def conditioning(scale: int, limit: int) -> dict:
    """Ingest of the sample at 1x and `scale`x with the conditioning steps on, on but unscored, and off."""
    work = Path(tempfile.mkdtemp(prefix="voxpipe-bench-conditioning-"))
    try:
        sample = load_sample(limit)
        data = {n: build_dataset(work / f"x{n}", sample, n, scale) for n in (1, scale)}
        variants = {"on": (), "on_without_quality": ("score_quality",), "off": CONDITIONING}
        runs: dict[str, dict] = {}
        for name, off in variants.items():
            sets = [a for key in off for a in ("--set", f"ingest.{key}=false")]
            for n in (1, scale) if name == "on" else (scale,):
                log(f"ingest x{n}, conditioning {name}")
                out = work / f"out-{name}-{n}"
                run = measure(voxpipe("ingest", "--input", str(work / f"x{n}"), "--out", str(out), *sets))
                report = json.loads((out / "report.json").read_text())
                assert report["rows_kept"] == report["rows_in"] == data[n]["rows"], report["reasons"]
                runs[f"{name}_x{n}"] = {"rows_per_s": round(data[n]["rows"] / run["seconds"], 2), **run}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    big = f"x{scale}"
    rate = {k: v["rows_per_s"] for k, v in runs.items()}
    return {
        "dataset": data,
        "runs": runs,
        "throughput_on_vs_off": round(rate[f"on_{big}"] / rate[f"off_{big}"], 3),
        "throughput_on_without_quality_vs_off":
            round(rate[f"on_without_quality_{big}"] / rate[f"off_{big}"], 3),
        "cpu_seconds_per_row": {k: round(v["cpu_seconds"] / data[int(k.rsplit("_x", 1)[1])]["rows"], 4)
                                for k, v in runs.items()},
        "peak_rss_process_mb": {"x1": runs["on_x1"]["peak_rss_process_mb"],
                                big: runs[f"on_{big}"]["peak_rss_process_mb"]},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=8, help="sample copies in the 1x data set")
    ap.add_argument("--scale", type=int, default=10, help="size of the large data set, in multiples of 1x")
    ap.add_argument("--conditioning", action="store_true", help="only the conditioning on/off comparison")
    ap.add_argument("--rows", type=int, default=0, help="the sample's first N rows (0: all 64)")
    ap.add_argument("--no-kfp", action="store_true", help="leave out the kfp.local fan-out")
    ap.add_argument("--no-large", action="store_true", help="leave out the per-step memory on the large set")
    ap.add_argument("--no-quality", action="store_true", help="ingest.score_quality false (no DNSMOS)")
    args = parse_args(ap, copies=1, scale=2, rows=4, no_kfp=True, no_large=True, no_quality=True)
    load_before = os.getloadavg()[0]
    if args.conditioning:
        figures = conditioning(args.scale, args.rows)
        print(json.dumps({"machine": {"cpu_count": os.cpu_count(), "load_average_1min": {
            "before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)}}, **figures}, indent=2))
        return
    sets = ["--set", "ingest.score_quality=false"] if args.no_quality else []
    big = f"x{args.scale}"
    work = Path(tempfile.mkdtemp(prefix="voxpipe-bench-ingest-"))
    try:
        sample = load_sample(args.rows)
        max_copies = args.copies * args.scale
        log(f"building 1x ({args.copies} copies) and {args.scale}x data sets in {work}")
        small = build_dataset(work / "x1", sample, args.copies, max_copies)
        large = None if args.no_large else build_dataset(work / "xN", sample, max_copies, max_copies)
        cli = {}
        for n in (1, 2):
            log(f"voxpipe ingest --shards {n} on 1x")
            cli[n] = cli_shards(work / "x1", work / f"cli{n}", n, small["rows"], sets)
        same_cli = (work / "cli1" / "raw.jsonl").read_bytes() == (work / "cli2" / "raw.jsonl").read_bytes()
        kfp = {}
        for n in () if args.no_kfp else (1, 2):
            log(f"kfp.local fan-out, {n} shard(s), on 1x")
            kfp[n] = kfp_local(work / "x1", work / f"kfp{n}", n, small["rows"])
        memory = {}
        for name, data in (("x1", work / "x1"), *(() if args.no_large else ((big, work / "xN"),))):
            log(f"plan, 2 shards and merge as separate processes on {name}")
            memory[name] = per_shard(data, work / f"mem-{name}", 2, sets)
            raw = memory[name].pop("raw")
            if name == "x1":
                same_memory = raw == (work / "cli1" / "raw.jsonl").read_bytes()
        # (it names the inputs as the workspace sees them)
        same_kfp = kfp[1].pop("raw") == kfp[2].pop("raw") if kfp else None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    no_kfp = nulls(["kfp_2_vs_1"], "--no-kfp") if not kfp else {"kfp_2_vs_1": same_kfp}
    no_large = nulls([big], "--no-large") if args.no_large else {}
    print(json.dumps({
        "machine": {"cpu_count": os.cpu_count(), "load_average_1min": {
            "before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
            "note": "a 2-core box shared with other jobs: each figure is one run"},
        "score_quality": not args.no_quality,
        "dataset_1x": small,
        **(nulls([f"dataset_{big}"], "--no-large") if args.no_large else {f"dataset_{big}": large}),
        "cli_shards_1x": {str(n): cli[n] for n in cli},
        **({"kfp_local_1x": {str(n): kfp[n] for n in kfp}} if kfp else nulls(["kfp_local_1x"], "--no-kfp")),
        "raw_jsonl_identical": {"cli_2_vs_1": same_cli, **no_kfp, "steps_vs_cli_1": same_memory},
        "per_step_2_shards": {**memory, **no_large},
        "peak_rss_per_shard_mb": {**{name: [r["peak_rss_tree_mb"] for r in m["shards"]]
                                     for name, m in memory.items()}, **no_large},
        "vae_encode_gflop_per_audio_second": vae_encode_gflop_per_audio_second(),
    }, indent=2))


if __name__ == "__main__":
    main()

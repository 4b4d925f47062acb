"""The real VoxCPM2 shape (2.29 B parameters) end to end on this CPU, once; prints one JSON object.

Every stage runs through voxpipe's own CLI, each in a process of its own whose peak RSS is taken
from the kernel (wait4) and whose own memory (RssAnon) is sampled, so the figures are the steps'
own, not this script's:

1. `init-model --preset voxcpm2` (random init, bf16 like upstream's checkpoint);
2. `encode` of two clips through the real-shape AudioVAE; each clip is the shipped sample's speech
   joined end to end to ~125 s, so that one row is L ~ 830 LM positions (the accelerator check's
   length: DESIGN section 6);
3. `train`: two LoRA steps (one row each, micro-batch 1 x ~830) with activation checkpointing,
   FSDP2 world of one, in `--dtype` (bf16 by default), then the export; its peak memory against
   `voxpipe plan`'s host figure for the same configuration;
4. a strict load of the export in upstream voxcpm 2.0.3 (every key, no missing, no unexpected);
5. `synthesize` of about one second (7 patches of 160 ms) with the export.

Also this CPU's bf16 and fp32 matmul rates (voxpipe.mfu.peak), its own peak for an MFU, measured
first. Not part of `make test` (about 25 minutes on 2 cores). Needs ~17 GB of RAM (train's peak
RSS; 14.4 GiB of it the process's own memory, the rest the checkpoint's mapped file pages); on a
shared machine run it alone. bf16 wants a CPU with bf16 matmul units (AVX512-BF16 or AMX: `grep
-oE 'avx512_bf16|amx_bf16' /proc/cpuinfo`). The 2-core AMD EPYC development machine has neither:
its bf16 matmul runs at 0.28-0.3 GFLOP/s against 109-122 GFLOP/s in fp32, so one bf16 step (24.6
TFLOP in voxpipe's count) would take about a day there (the first one was still in its backward
after 46 minutes); run it with `--dtype float32` on such a CPU.

    flock /tmp/voxpipe-heavy.lock .venv/bin/python benchmarks/real_shape_cpu.py [--work DIR] [--dtype float32]
        [--preset voxcpm2] [--clip-seconds 125] [--gemm-size 2048]
    .venv/bin/python benchmarks/real_shape_cpu.py --smoke   # = --dry-run: every command checked, none run
    .venv/bin/python benchmarks/real_shape_cpu.py --preset tiny --dtype float32 --clip-seconds 3 \
        --gemm-size 256   # every step run for real, tiny preset

`--dry-run` (and `--smoke`) puts each step's command line through voxpipe's own CLI parser and params
schema, runs nothing and prints the commands, every figure null with the reason: a flag or `--set`
key that rotted fails it. The last command runs every step for real on the tiny preset (about 30 s
idle on the 2-core machine; minutes under load).

bf16 on a CPU without bf16 matmul units is not run: every figure is null, with its reason. Without
upstream voxcpm 2.0.3 the strict load's figures are null, with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "benchmarks")]

from _bench import nulls, parse_args  # noqa: E402
from encode import sample_rows  # noqa: E402  (benchmarks/encode.py: the shipped sample's rows)

from voxpipe.data.audio import decode  # noqa: E402

GIB = 2**30
CLIP_SECONDS = 125.0  # 125 s x 6.25 patches/s = 781 audio positions + text: L ~ 830
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
STAGES = ("init_model", "encode", "train", "upstream_strict_load", "synthesize", "cpu_matmul_gflops")


def log(msg: str) -> None:
    print(f"[bench real_shape_cpu] {msg}", file=sys.stderr, flush=True)


class AnonPeak(threading.Thread):
    """The largest anonymous RSS (RssAnon: the process's own memory) of a process, sampled every 0.2 s.

    ru_maxrss also counts the file pages it has mapped: the safetensors checkpoint being read adds
    its size to it while the load runs, though the kernel can drop those pages at any time. A plan
    is compared with the anonymous figure; both are reported.
    """

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.status, self.peak, self.done = Path(f"/proc/{pid}/status"), 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            try:
                lines = self.status.read_text().splitlines()
            except OSError:  # the process has ended
                return
            anon = [int(line.split()[1]) for line in lines if line.startswith("RssAnon:")]
            self.peak = max(self.peak, *anon, 0)


def run(name: str, args: list[str], cwd: Path) -> dict:
    """One CLI step in its own process: wall seconds, its peak RSS (GiB, from wait4) and peak RssAnon."""
    log(f"{name}: voxpipe {' '.join(args)}")
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "voxpipe", *args], cwd=cwd, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    anon = AnonPeak(proc.pid)
    anon.start()
    _, status, usage = os.wait4(proc.pid, 0)
    anon.done.set()
    anon.join()
    out = proc.stdout.read().decode() if proc.stdout else ""
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{name} failed (exit {os.waitstatus_to_exitcode(status)}): {out}")
    result = {"seconds": round(seconds, 1), "peak_rss_gib": round(usage.ru_maxrss * 1024 / GIB, 2),
              "peak_rss_anon_gib": round(anon.peak * 1024 / GIB, 2)}
    log(f"{name}: {result}")
    return {**result, "stdout": out}


def cpu_model() -> str:
    names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
             if line.startswith("model name")]
    return names[0] if names else "unknown"


def cpu_flags() -> set[str]:
    return {flag for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
            for flag in line.split(":", 1)[1].split()}


def long_clips(folder: Path, seconds: float, n: int = 2) -> Path:
    """n clips of `seconds` each, the sample's speech joined end to end, and their manifest."""
    rows = sample_rows(10_000)
    lines, i = [], 0
    for k in range(n):
        audio, texts = [], []
        while sum(len(a) for a in audio) < seconds * 16000:
            row = rows[i % len(rows)]
            audio.append(decode(row["audio"]["bytes"], 16000))
            texts.append(row["text"])
            i += 1
        wav = np.concatenate(audio)[: int(seconds * 16000)]
        path = folder / "audio" / f"long-{k}.flac"
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(path, wav, 16000)
        # the text of the whole clip is long; the first sentences are enough for a training row
        lines.append(json.dumps({"id": f"long-{k}", "audio": str(path), "text": " ".join(texts[:3])}) + "\n")
    manifest = folder / "manifest" / "train.jsonl"
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text("".join(lines))
    return manifest


def strict_upstream_load(export: Path) -> dict:
    """Upstream's own loader over our export, in a process of its own: keys compared one by one."""
    code = f"""
import json, sys
sys.path[:0] = [{str(REPO / 'tests')!r}]
from upstream import load_upstream
try:
    load_upstream()
except ImportError as e:
    print(json.dumps({{"null_reason": str(e)}}))
    sys.exit()
from safetensors.torch import load_file
from voxcpm.model.voxcpm2 import VoxCPM2Model
model = VoxCPM2Model.from_local({str(export)!r}, training=True, device="cpu")
files = load_file({str(export / 'model.safetensors')!r})
files.update({{"audio_vae." + k: v for k, v in load_file({str(export / 'audiovae.safetensors')!r}).items()}})
own = model.state_dict()
print(json.dumps({{"keys": len(files), "missing": len(own.keys() - files.keys()),
                  "unexpected": len(files.keys() - own.keys())}}))
"""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    out = proc.stdout.read().decode() if proc.stdout else ""
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"upstream load failed: {out}")
    result = json.loads(out.strip().splitlines()[-1])
    if "null_reason" in result:
        return nulls(("keys", "missing", "unexpected"), result["null_reason"])
    return {**result, "seconds": round(time.perf_counter() - start, 1),
            "peak_rss_gib": round(usage.ru_maxrss * 1024 / GIB, 2)}


def commands(work: Path, args: argparse.Namespace) -> dict[str, list[str]]:
    """Each step's voxpipe command line (schema defaults only: no params.yaml is read)."""
    none = ["--params", str(work / "empty.yaml")]
    base, encoded, trained = work / "base", work / "encoded", work / "train"
    train_sets = {"train.data": encoded, "train.out": trained, "train.device": "cpu",
                  "train.dtype": args.dtype, "train.lora.enabled": "true",
                  "train.activation_checkpointing": "true", "train.max_steps": 2, "train.max_tokens": 900,
                  "train.warmup_steps": 0, "train.export_every": 0, "train.checkpoint_every": 0,
                  "train.log_every": 1, "model.base": base}
    sets = [arg for k, v in train_sets.items() for arg in ("--set", f"{k}={v}")]
    plan_sets = [*sets, "--set", "plan.device=cpu", "--set", "local.nproc=1",
                 "--set", "plan.device_memory_gib=24"]
    return {
        "init-model": ["init-model", *none, "--preset", args.preset, "--out", str(base), "--dtype",
                       "bfloat16"],
        "encode": ["encode", *none, "--manifest", str(work / "manifest" / "train.jsonl"), "--model-base",
                   str(base), "--out", str(encoded), "--device", "cpu"],
        "train": ["train", *none, *sets],
        "plan": ["plan", *none, *plan_sets, "--json"],
        "synthesize": ["synthesize", *none, "--model", str(trained / "export"), "--text", "Hello there.",
                       "--max-len", "7", "--out", str(work / "hello.wav"), "--device", "cpu"],
    }


def check(cmd: dict[str, list[str]]) -> None:
    """Every command line through voxpipe's CLI parser and params schema, as `voxpipe` would take it
    (a bad flag exits 2, a bad --set key or value is a one-paragraph error); none is run."""
    from upstream import load_upstream  # noqa: F401  (the strict load's helper imports)

    from voxpipe.cli import STEPS, build_parser, step_params
    from voxpipe.errors import StepError

    for name, argv in cmd.items():
        args = build_parser().parse_args(argv)
        try:
            step_params(next(s for s in STEPS if s.name == args.step), args)
        except StepError as e:
            sys.exit(f"real_shape_cpu: the {name} command does not parse: {e}")
        log(f"{name}: voxpipe {shlex.join(argv)} parses")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=None, help="working folder (default: a temporary one)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                        help="train's compute dtype (float32 on a CPU without bf16 matmul units)")
    parser.add_argument("--preset", choices=("tiny", "small", "voxcpm2"), default="voxcpm2")
    parser.add_argument("--clip-seconds", type=float, default=CLIP_SECONDS, help="each clip's length")
    parser.add_argument("--gemm-size", type=int, default=2048, help="the matmul rates' square matmul size")
    parser.add_argument("--dry-run", action="store_true", help="check every step's command line, run none")
    args = parse_args(parser, dry_run=True)
    machine = {"cpu": cpu_model(), "load_average_1min": {"start": round(os.getloadavg()[0], 2)}}
    tmp = tempfile.TemporaryDirectory(prefix="voxpipe-real-shape-") if args.work is None else None
    work = Path(args.work or tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    (work / "empty.yaml").write_text("")
    cmd = commands(work, args)
    reason = None
    if args.dry_run:
        check(cmd)
        reason = "--dry-run: every command line was checked, none was run"
    elif args.dtype == "bfloat16" and not cpu_flags() & set(BF16_FLAGS):
        reason = (f"this CPU has no bf16 matmul units ({' or '.join(BF16_FLAGS)} in /proc/cpuinfo): one bf16 "
                  "step of the real shape takes about a day; run with --dtype float32")
    if reason is not None:
        log(reason)
        print(json.dumps({"preset": args.preset, "machine": machine,
                          "commands": {name: shlex.join(["voxpipe", *argv]) for name, argv in cmd.items()},
                          **nulls(STAGES, reason)}))
        if tmp is not None:
            tmp.cleanup()
        return

    import torch

    from voxpipe.mfu.peak import measure_cpu_gemm_peak

    log("measuring this CPU's matmul rates")
    gflops = {dtype: round(measure_cpu_gemm_peak(getattr(torch, dtype), size=args.gemm_size) / 1e9, 2)
              for dtype in ("bfloat16", "float32")}
    log(f"matmul GFLOP/s: {gflops}")
    # with --work, a rerun reuses a finished init and encode (each writes report.json last)
    base, encoded, trained = work / "base", work / "encoded", work / "train"
    long_clips(work, args.clip_seconds)
    init = ({"reused": True} if (base / "report.json").is_file() else
            run("init-model", cmd["init-model"], work))
    enc = {"reused": True} if (encoded / "report.json").is_file() else run("encode", cmd["encode"], work)
    shutil.rmtree(trained, ignore_errors=True)  # train is what is measured: it always starts fresh
    train = run("train", cmd["train"], work)
    planned = json.loads(run("plan", cmd["plan"], work)["stdout"].strip())
    steps = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "step_time_s" in s]
    upstream = strict_upstream_load(trained / "export")
    synth = run("synthesize", cmd["synthesize"], work)
    seconds_of_audio = sf.info(str(work / "hello.wav")).duration

    result = {
        "preset": args.preset,
        "machine": {**machine, "cpu_threads": torch.get_num_threads(), "load_average_1min": {
            **machine["load_average_1min"], "end": round(os.getloadavg()[0], 2)}},
        "init_model": {k: v for k, v in init.items() if k != "stdout"},
        "encode": {**{k: v for k, v in enc.items() if k != "stdout"}, "clips": 2,
                   "audio_seconds": 2 * args.clip_seconds},
        "train": {
            "dtype": args.dtype,
            "seconds_per_step": [round(s["step_time_s"], 1) for s in steps],
            "shapes": [s["shapes"] for s in steps],
            "model_flops_per_step": [s["flops"] for s in steps],
            "tokens_per_s": [round(s["tokens_per_s"], 2) for s in steps],
            # voxpipe's convention (docs/accelerators.md), against this CPU's own matmul rate in the dtype
            "mfu_vs_measured_matmul": [round(s["flops"] / s["step_time_s"] / (gflops[args.dtype] * 1e9), 3)
                                       for s in steps],
            "loss": [s["loss"] for s in steps],
            "process_seconds": train["seconds"],
            "peak_rss_gib": train["peak_rss_gib"],
            "peak_rss_anon_gib": train["peak_rss_anon_gib"],
            "planned_host_peak_gib": planned["host_peak_gib"],
            "planned_device_peak_gib": planned["peak_gib"],
            "planned_by_category_gib": planned["by_category_gib"],
        },
        "upstream_strict_load": upstream,
        "synthesize": {**{k: v for k, v in synth.items() if k != "stdout"},
                       "audio_seconds": round(seconds_of_audio, 2)},
        "cpu_matmul_gflops": gflops,
    }
    print(json.dumps(result))
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()

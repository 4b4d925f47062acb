"""The real VoxCPM2 shape (2.29 B parameters) end to end on this CPU, once; prints one JSON object.

Every stage runs through voxpipe's own CLI, each in a process of its own whose peak RSS is taken
from the kernel (wait4), so the figures are the steps' own, not this script's:

1. `init-model --preset voxcpm2` (random init, bf16 like upstream's checkpoint);
2. `encode` of two clips through the real-shape AudioVAE; each clip is the shipped sample's speech
   joined end to end to ~125 s, so that one row is L ~ 830 LM positions (the accelerator check's
   length: DESIGN section 6);
3. `train`: two LoRA steps (one row each, micro-batch 1 x ~830) in bf16 with activation
   checkpointing, FSDP2 world of one, then the export; its peak RSS against `voxpipe plan`'s host
   figure for the same configuration;
4. a strict load of the export in upstream voxcpm 2.0.3 (every key, no missing, no unexpected);
5. `synthesize` of about one second (7 patches of 160 ms) with the export.

Also this CPU's bf16 and fp32 matmul rates (voxpipe.mfu.peak), its own peak for an MFU. Not part
of `make test` (tens of minutes). Needs ~16 GB of RAM; on a shared machine run it alone. It wants a
CPU with bf16 matmul units (AVX512-BF16 or AMX: `grep -oE 'avx512_bf16|amx_bf16' /proc/cpuinfo`):
on the 2-core AMD EPYC development machine, which has neither, the first bf16 training step was
still in its backward after 46 minutes (peak RSS 9.0 GiB by then), and the run was stopped.

    flock /tmp/voxpipe-heavy.lock .venv/bin/python benchmarks/real_shape_cpu.py [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "benchmarks")]

from encode import sample_rows  # noqa: E402  (benchmarks/encode.py: the shipped sample's rows)

from voxpipe.data.audio import decode  # noqa: E402

GIB = 2**30
CLIP_SECONDS = 125.0  # 125 s x 6.25 patches/s = 781 audio positions + text: L ~ 830


def log(msg: str) -> None:
    print(f"[bench real_shape_cpu] {msg}", file=sys.stderr, flush=True)


def run(name: str, args: list[str], cwd: Path) -> dict:
    """One CLI step in its own process: wall seconds and its peak RSS (GiB, from wait4)."""
    log(f"{name}: voxpipe {' '.join(args)}")
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "voxpipe", *args], cwd=cwd, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    _, status, usage = os.wait4(proc.pid, 0)
    out = proc.stdout.read().decode() if proc.stdout else ""
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{name} failed (exit {os.waitstatus_to_exitcode(status)}): {out}")
    log(f"{name}: {seconds:.1f} s, peak RSS {usage.ru_maxrss / 2**20:.2f} GiB")
    return {"seconds": round(seconds, 1), "peak_rss_gib": round(usage.ru_maxrss * 1024 / GIB, 2),
            "stdout": out}


def long_clips(folder: Path, n: int = 2) -> Path:
    """n clips of CLIP_SECONDS each, the sample's speech joined end to end, and their manifest."""
    rows = sample_rows(10_000)
    lines, i = [], 0
    for k in range(n):
        audio, texts = [], []
        while sum(len(a) for a in audio) < CLIP_SECONDS * 16000:
            row = rows[i % len(rows)]
            audio.append(decode(row["audio"]["bytes"], 16000))
            texts.append(row["text"])
            i += 1
        wav = np.concatenate(audio)[: int(CLIP_SECONDS * 16000)]
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
from upstream import import_upstream
import_upstream()
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
    return {**result, "seconds": round(time.perf_counter() - start, 1),
            "peak_rss_gib": round(usage.ru_maxrss * 1024 / GIB, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=None, help="working folder (default: a temporary one)")
    args = parser.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="voxpipe-real-shape-") if args.work is None else None
    work = Path(args.work or tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    base, encoded, trained = work / "base", work / "encoded", work / "train"
    (work / "empty.yaml").write_text("")
    none = ["--params", str(work / "empty.yaml")]  # schema defaults only; no params.yaml is read

    # with --work, a rerun reuses a finished init and encode (each writes report.json last)
    init = ({"seconds": None, "peak_rss_gib": None, "reused": True} if (base / "report.json").is_file() else
            run("init-model", ["init-model", *none, "--preset", "voxcpm2", "--out", str(base), "--dtype",
                               "bfloat16"], work))
    manifest = long_clips(work)
    enc = ({"seconds": None, "peak_rss_gib": None, "reused": True} if (encoded / "report.json").is_file() else
           run("encode", ["encode", *none, "--manifest", str(manifest), "--model-base", str(base), "--out",
                          str(encoded), "--device", "cpu"], work))
    train_sets = {"train.data": encoded, "train.out": trained, "train.device": "cpu",
                  "train.dtype": "bfloat16", "train.lora.enabled": "true",
                  "train.activation_checkpointing": "true", "train.max_steps": 2, "train.max_tokens": 900,
                  "train.warmup_steps": 0, "train.export_every": 0, "train.checkpoint_every": 0,
                  "train.log_every": 1, "model.base": base}
    sets = [arg for k, v in train_sets.items() for arg in ("--set", f"{k}={v}")]
    train = run("train", ["train", *none, *sets], work)
    plan_sets = [*sets, "--set", "plan.device=cpu", "--set", "local.nproc=1",
                 "--set", "plan.device_memory_gib=24"]
    planned = json.loads(run("plan", ["plan", *none, *plan_sets, "--json"], work)["stdout"].strip())
    steps = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "step_time_s" in s]
    upstream = strict_upstream_load(trained / "export")
    synth = run("synthesize", ["synthesize", *none, "--model", str(trained / "export"), "--text",
                               "Hello there.", "--max-len", "7", "--out", str(work / "hello.wav"),
                               "--device", "cpu"], work)
    seconds_of_audio = sf.info(str(work / "hello.wav")).duration

    import torch

    from voxpipe.mfu.peak import measure_cpu_gemm_peak

    result = {
        "machine": {"cpu_threads": torch.get_num_threads(), "note": "shared machine, loaded by other work"},
        "init_model": {k: v for k, v in init.items() if k != "stdout"},
        "encode": {**{k: v for k, v in enc.items() if k != "stdout"}, "clips": 2,
                   "audio_seconds": 2 * CLIP_SECONDS},
        "train": {
            "seconds_per_step": [round(s["step_time_s"], 1) for s in steps],
            "shapes": [s["shapes"] for s in steps],
            "model_flops_per_step": [s["flops"] for s in steps],
            "tokens_per_s": [round(s["tokens_per_s"], 2) for s in steps],
            "loss": [s["loss"] for s in steps],
            "process_seconds": train["seconds"],
            "peak_rss_gib": train["peak_rss_gib"],
            "planned_host_peak_gib": planned["host_peak_gib"],
            "planned_device_peak_gib": planned["peak_gib"],
            "planned_by_category_gib": planned["by_category_gib"],
        },
        "upstream_strict_load": upstream,
        "synthesize": {**{k: v for k, v in synth.items() if k != "stdout"},
                       "audio_seconds": round(seconds_of_audio, 2)},
        "cpu_matmul_gflops": {"bfloat16": round(measure_cpu_gemm_peak(torch.bfloat16) / 1e9, 1),
                              "float32": round(measure_cpu_gemm_peak(torch.float32) / 1e9, 1)},
    }
    print(json.dumps(result))
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()

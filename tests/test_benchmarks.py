"""Every script in benchmarks/ runs its `--smoke` path (benchmarks/_bench.py) as a subprocess: it exits 0 and
prints one JSON object on stdout with the keys the docs quote from it (`make record` keeps a run's object in
benchmarks/results/, which docs/measurements.md shows). A key may be null only with its `<key>_null_reason`
next to it.

The scripts are found by listing benchmarks/, so a new one runs here without being named; QUOTED is the one
place that says which keys the docs read from each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"

ACCEL_STEP = (
    "runs.0.step_time_s_median", "runs.0.tokens_per_s", "runs.0.mfu", "runs.0.mfu_every_row",
    "runs.0.mfu_published_convention", "runs.0.peak_memory_gib", "compile_speedup", "memory.full",
    "memory.lora", "largest_micro_batch.full.micro_batch", "largest_micro_batch.lora.micro_batch",
)
PLAN_CHECK = ("cases.0.planned_gib", "cases.0.measured_gib", "cases.0.ratio", "cases.0.within_10_percent")

# script -> the key paths ("a.b", "runs.0.mfu") of its JSON that the docs quote
QUOTED: dict[str, tuple[str, ...]] = {
    "train_step.py": ("end_to_end.samples_per_s_ratio", "pre_encoded.tokens_per_s_ratio",
                      "end_to_end.ours.samples_per_s", "end_to_end.upstream_vae_per_step.samples_per_s",
                      "pre_encoded.upstream_same_batches.tokens_per_s", "one_time_encode_s",
                      "padding_waste.token_budget", "padding_waste.fixed_size"),
    "model_step.py": ("ours_s", "upstream_s", "ratio_ours_over_upstream", "max_rel_loss_diff",
                      "median_pair_ratio_planned_over_upstream_rows"),
    "gpu_check.sh": ACCEL_STEP,
    "accel_step.py": ACCEL_STEP,
    "plan_check.py": PLAN_CHECK,
    "encode.py": ("one_at_a_time.clips_per_s", "batched.0.speedup", "batched.0.max_abs_diff"),
    "ingest.py": ("cli_shards_1x.1.seconds", "cli_shards_1x.1.rows_per_s", "cli_shards_1x.1.cpu_seconds",
                  "cli_shards_1x.2.seconds", "cli_shards_1x.2.rows_per_s", "cli_shards_1x.2.cpu_seconds",
                  "kfp_local_1x", "raw_jsonl_identical.cli_2_vs_1", "raw_jsonl_identical.kfp_2_vs_1",
                  "per_step_2_shards.x1.plan.peak_rss_tree_mb", "per_step_2_shards.x1.merge.peak_rss_tree_mb",
                  "per_step_2_shards.x1.merge.cpu_seconds", "peak_rss_per_shard_mb.x1",
                  "vae_encode_gflop_per_audio_second"),
    "mfu_cpu.py": ("cpu_peak_tflops.float32", "cpu_peak_tflops.bfloat16", "mfu", "tokens_per_s"),
    "demo_base_stops.py": ("results.0.clips", "results.0.premature", "results.0.runaway",
                           "results.0.ratio_median", "results.0.ratio_min", "results.0.ratio_max"),
    "serve.py": ("levels.1.requests_per_s", "levels.1.audio_s_per_wall_s", "levels.1.ttfb_p50_s",
                 "levels.1.ttfb_p95_s", "levels.1.rtf_p50", "levels.1.peak_rss_mb", "upstream.requests_per_s",
                 "upstream.rtf_p50", "upstream.ttfb_p50_s", "threads.intra_op_threads",
                 "throughput_8_over_1", "ttfb_p50_8_over_1"),
    "real_shape_cpu.py": ("commands.train", "init_model", "encode", "train", "upstream_strict_load",
                          "synthesize", "cpu_matmul_gflops"),
    "marks.py": ("detection_rate_wav", "detection_rate_mp3", "detection_rate_16k",
                 "false_positive_rate_sample", "false_positive_rate_holdout", "dnsmos_ovrl_delta",
                 "dnsmos_ovrl_delta_ci95",
                 "speaker_similarity_marked_to_unmarked_mean", "mark_ms_per_audio_s"),
    "raw_recordings.py": ("boundaries.edge_error_ms.median", "boundaries.edge_error_ms.p95",
                          "boundaries.pauses_cut", "speaker_filter.precision", "speaker_filter.recall",
                          "speaker_filter.main_voice_lost", "asr.wer", "seconds_per_audio_hour.vad",
                          "seconds_per_audio_hour.embedding", "seconds_per_audio_hour.asr"),
    "text_norm.py": ("en.ours.accuracy", "en.ours.per_kind", "en.ours.s_per_1000_chars",
                     "en.ours.peak_rss_mb",
                     "en.ours.cold_start_s", "en.nemo", "zh.ours.accuracy", "zh.nemo"),
}


# gpu_check.sh runs accel_step.py and plan_check.py (both --smoke) and leaves their JSON in $OUT, so those two
# are checked through it rather than run a second time
WRITES = {"gpu_check.sh": {"accel_step.json": "accel_step.py", "plan_check.json": "plan_check.py"}}
COVERED = {script for files in WRITES.values() for script in files.values()}


def found() -> set[str]:
    """The benchmarks: every .py and .sh in benchmarks/ but the helpers (named `_*`)."""
    return {p.name for p in BENCHMARKS.iterdir() if p.suffix in (".py", ".sh") and not p.name.startswith("_")}


# smokes that load scoring models, spawn ranks or ingest (5 s and more each): `make test` runs them; test-fast
# keeps the rest (serve.py's among them: the server's batching is the inner loop's to guard)
SLOW_SMOKES = {"marks.py", "ingest.py", "gpu_check.sh", "train_step.py", "demo_base_stops.py",
               "raw_recordings.py"}


def scripts() -> list:
    return [pytest.param(s, marks=pytest.mark.slow) if s in SLOW_SMOKES else s
            for s in sorted(found() - COVERED)]


def value_at(data, path: str) -> tuple[object, object, str]:
    """(the value at a dotted path, its parent, its last key); a missing key fails the test."""
    parent, key = None, ""
    for key in path.split("."):
        parent = data
        if isinstance(data, list):
            assert key.isdigit() and int(key) < len(data), f"{path}: no item {key}"
            data = data[int(key)]
        else:
            assert isinstance(data, dict) and key in data, f"{path}: no key {key!r} in {data!r:.300}"
            data = data[key]
    return data, parent, key


def check_keys(data: dict, keys: tuple[str, ...], where: str) -> None:
    for path in keys:
        value, parent, key = value_at(data, path)
        if value is None:
            reason = parent.get(f"{key}_null_reason") if isinstance(parent, dict) else None
            assert isinstance(reason, str) and reason, f"{where}: {path} is null without a {key}_null_reason"


def smoke(command: list[str], env: dict[str, str] | None = None) -> dict:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-4000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    data = json.loads(done.stdout)  # one JSON document, nothing else on stdout
    assert isinstance(data, dict)
    return data


def test_every_benchmark_has_its_quoted_keys_named():
    assert COVERED <= found() and SLOW_SMOKES <= found()
    assert set(QUOTED) == found(), "QUOTED names the quoted keys of every benchmark, and no gone one"


@pytest.mark.parametrize("script", scripts())
def test_smoke(script, tmp_path):
    path = BENCHMARKS / script
    runner = "bash" if path.suffix == ".sh" else sys.executable
    data = smoke([runner, str(path), "--smoke"], {"OUT": str(tmp_path)})
    check_keys(data, QUOTED.get(script, ()), script)
    for name, source in WRITES.get(script, {}).items():
        check_keys(json.loads((tmp_path / name).read_text()), QUOTED[source], f"{script}: {name}")


def test_a_benchmark_without_upstream_voxcpm_says_why(tmp_path):
    """model_step.py with `voxcpm` failing to import: exit 0, upstream's figures null with the reason."""
    (tmp_path / "voxcpm.py").write_text('raise ImportError("hidden by the test")\n')
    command = [sys.executable, str(BENCHMARKS / "model_step.py"), "--smoke"]
    data = smoke(command, {"PYTHONPATH": str(tmp_path)})
    assert data["ours_s"] > 0
    assert data["ratio_ours_over_upstream"] is None
    assert "hidden by the test" in data["ratio_ours_over_upstream_null_reason"]
    check_keys(data, QUOTED["model_step.py"], "model_step.py without upstream")

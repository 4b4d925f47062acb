"""Logs a pod can show: off a terminal, training logs one line every `train.log_every` steps (step, loss,
lr, tokens/s, MFU, peak memory) from rank 0 only, and no progress bar redraws with `\\r`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from voxpipe.progress import step_line

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"voxpipe\.train\.loop: step (\d+)/(\d+) loss \S+ lr \S+ tokens/s \d+ mfu (n/a|\S+ %) "
                  r"peak_mem \S+ GiB$")


@pytest.mark.slow
def test_training_under_torchrun_logs_every_n_steps_from_rank_0_only(encoded_sample, tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "voxpipe.cli", "train", "--params", str(tmp_path / "none.yaml"),
           "--data", str(encoded_sample.encoded), "--model-base", str(encoded_sample.base_model),
           "--out", str(tmp_path / "run"), "--device", "cpu", "--max-steps", "5", "--log-every", "2",
           "--val-every", "0", "--max-tokens", "512", "--set", "train.export_dtype=float32"]
    (tmp_path / "none.yaml").write_text("{}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert "\r" not in output  # no bar redrawn in place
    steps = [int(m[1]) for m in (LINE.search(line) for line in done.stderr.splitlines()) if m]
    assert steps == [2, 4, 5], done.stderr[-3000:]  # every 2nd step and the last, once: rank 0 only
    assert "it/s]" not in output and "step/s]" not in output  # no tqdm bar at all


def test_step_line_names_every_figure():
    line = step_line({"step": 3, "loss": 1.23456, "lr": 2e-4, "tokens_per_s": 1234.5, "mfu": 0.1234,
                      "memory/peak_gib": 12.345}, 10)
    assert line == "step 3/10 loss 1.2346 lr 0.0002 tokens/s 1234 mfu 12.34 % peak_mem 12.35 GiB"
    assert "mfu n/a" in step_line({"step": 1, "loss": 1.0, "lr": 1e-5, "tokens_per_s": 1.0, "mfu": None}, 2)

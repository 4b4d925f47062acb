"""dvc.yaml: a real `dvc repro` of every stage in a scratch git repo, then the caching it promises.

The scratch repo holds the project's dvc.yaml, .dvcignore and code folders (hashed as the stages'
deps), a few rows per speaker of the shipped sample, and params.yaml with few training steps and a
small evaluation. The commands are the real `voxpipe` and `torchrun` from this venv.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from small_sample import write_small_sample

from voxpipe.params import Params, load_params

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STAGES = ["ingest", "manifest", "init-model", "encode", "train", "evaluate", "mfu", "register"]
TEST_SETTINGS = {
    "ingest": {"workers": 1},
    "train": {"max_steps": 3, "warmup_steps": 1, "val_every": 0, "checkpoint_every": 0},
    "evaluate": {"seeds": [0], "texts_per_speaker": 1, "max_len": 8, "inference_timesteps": 2, "asr": False},
}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(PATH=f"{BIN}{os.pathsep}{env['PATH']}", DVC_NO_ANALYTICS="1", GIT_AUTHOR_NAME="t",
               GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com")
    return env


def run(repo: Path, *args: str) -> str:
    """A command in the scratch repo; its output (stdout + stderr), or the test fails showing it."""
    proc = subprocess.run(args, cwd=repo, env=_env(), capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{out[-6000:]}"
    return out


def dvc(repo: Path, *args: str) -> str:
    return run(repo, str(BIN / "dvc"), *args)


def ran(output: str) -> list[str]:
    return re.findall(r"Running stage '([\w-]+)'", output)


def write_params(repo: Path, **changes: dict) -> None:
    params = Params().model_dump(by_alias=True)
    for section, values in {**TEST_SETTINGS, **changes}.items():
        params[section] = {**params[section], **values}
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("dvc_repo")
    for name in ("dvc.yaml", ".dvcignore", ".gitignore"):
        shutil.copy(ROOT / name, repo / name)
    shutil.copytree(ROOT / "voxpipe", repo / "voxpipe", ignore=shutil.ignore_patterns("__pycache__"))
    write_small_sample(repo / "data" / "sample", per_speaker=6)
    write_params(repo)
    run(repo, "git", "init", "-q")
    dvc(repo, "init", "-q")
    return repo


@pytest.fixture(scope="module")
def first_repro(repo) -> str:
    out = dvc(repo, "repro")
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "baseline")
    return out


def test_repro_runs_every_stage_and_registers_a_model(repo, first_repro):
    assert ran(first_repro) == STAGES
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    assert sorted(lock) == sorted(STAGES)
    plots = json.loads(dvc(repo, "plots", "show", "--json"))
    assert not plots.get("errors"), plots["errors"]
    assert {"val_loss", "train_loss"} <= set(plots["data"]), sorted(plots["data"])
    metrics = json.loads(dvc(repo, "metrics", "show", "--json"))
    figures = next(iter(metrics.values()))["data"]
    assert "loss_model" in figures["work/eval/eval.json"]["data"]
    assert "mfu" in figures["work/mfu/mfu.json"]["data"]
    registered = json.loads((repo / "work/register/registered.json").read_text())
    client = MlflowClient(f"sqlite:///{repo / 'work/mlflow.db'}")
    candidate = client.get_model_version_by_alias(registered["name"], "candidate")
    assert int(candidate.version) == registered["version"]


def test_second_repro_does_nothing(repo, first_repro):
    out = dvc(repo, "repro")
    assert ran(out) == []
    assert "up to date" in dvc(repo, "status")


def test_train_param_change_reruns_train_and_what_follows(repo, first_repro):
    write_params(repo, train={**TEST_SETTINGS["train"], "lr": 3e-5})
    assert re.findall(r"^([\w-]+):", dvc(repo, "status"), re.M) == ["train"]
    write_params(repo)  # back to the committed params: `dvc exp run -S` changes them itself
    out = dvc(repo, "exp", "run", "-S", "train.lr=3e-5")
    assert ran(out) == ["train", "evaluate", "mfu", "register"]
    diff = json.loads(dvc(repo, "metrics", "diff", "--json"))
    assert "loss_model" in diff["work/eval/eval.json"]
    assert "mfu" in diff["work/mfu/mfu.json"]
    assert load_params(repo / "params.yaml").train.lr == 3e-5  # DVC's `3e-05` reads as a float

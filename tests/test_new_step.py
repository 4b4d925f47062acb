"""A new step costs its function, its descriptor, its test and a docs paragraph (docs/pipeline.md, "How to
add a step"): this test writes the first two into a copy of the package and sees the step come out of
them as a subcommand with its flags, a params section, a stage that `dvc repro` runs and reruns when its
setting changes, and a KFP task (tests/test_kfp.py's generic component)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

DESCRIPTOR = '''"""`toy`: a step added by tests/test_new_step.py."""

from __future__ import annotations

from pydantic import Field

from voxpipe.section import Section
from voxpipe.steps import Out, Stage, Step


class ToyParams(Section):
    """`toy`: says hello into a file."""

    greeting: str = Field("hello", description="what it writes")
    out: str = Field("work/toy", description="output folder", json_schema_extra={"result": False})


ORDER = 25
SECTIONS = {"toy": ToyParams}
STEPS = (Step("toy", "write the greeting into out/greeting.txt", target="voxpipe.data.toy:toy",
              reads=("toy",), section="toy",
              stage=Stage(deps=("${manifest.out}",), outs=(Out("${toy.out}"),))),)
'''

FUNCTION = '''"""`voxpipe toy`: the function of tests/test_new_step.py's step."""

from pathlib import Path


def toy(params) -> None:
    out = Path(params.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "greeting.txt").write_text(params.greeting + "\\n", encoding="utf-8")
'''


def _env(repo: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AWS_"))}
    path = f"{BIN}{os.pathsep}{env['PATH']}"
    return {**env, "PYTHONPATH": str(repo), "DVC_NO_ANALYTICS": "1", "PATH": path}


def run(repo: Path, *args: str) -> str:
    proc = subprocess.run(args, cwd=repo, env=_env(repo), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
    return proc.stdout + proc.stderr


def voxpipe(repo: Path, *args: str) -> str:
    return run(repo, sys.executable, "-m", "voxpipe.cli", *args)


@pytest.fixture
def repo(tmp_path) -> Path:
    """A copy of the package with the toy step's two files, and the manifest its stage reads."""
    shutil.copytree(ROOT / "voxpipe", tmp_path / "voxpipe", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "voxpipe/steps/toy.py").write_text(DESCRIPTOR)
    (tmp_path / "voxpipe/data/toy.py").write_text(FUNCTION)
    manifest = tmp_path / "work/manifest"
    manifest.mkdir(parents=True)
    (manifest / "train.jsonl").write_text("{}\n")
    return tmp_path


def test_a_new_step_is_a_subcommand_a_section_and_a_stage_from_its_two_files(repo):
    assert "--greeting" in voxpipe(repo, "toy", "--help")
    voxpipe(repo, "toy", "--greeting", "hi")
    assert (repo / "work/toy/greeting.txt").read_text() == "hi\n"
    assert "greeting: hello" in voxpipe(repo, "params")

    voxpipe(repo, "params", "--write", "params.yaml")
    voxpipe(repo, "dvc-yaml")
    stage = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]["toy"]
    assert stage["cmd"] == "voxpipe toy" and stage["params"] == ["toy.greeting"]
    assert {"voxpipe/data/toy.py", "voxpipe/steps/toy.py"} <= set(stage["deps"])
    assert "voxpipe/steps/serve.py" not in stage["deps"]

    run(repo, "git", "init", "-q")
    run(repo, "dvc", "init", "-q")
    shutil.rmtree(repo / "work/toy")
    assert "Running stage 'toy'" in run(repo, "dvc", "repro", "--single-item", "toy")
    assert (repo / "work/toy/greeting.txt").read_text() == "hello\n"
    assert "up to date" in run(repo, "dvc", "status", "toy")
    voxpipe(repo, "params", "--set", "toy.greeting=hey", "--write", "params.yaml")
    assert "toy.greeting" in run(repo, "dvc", "status", "toy")

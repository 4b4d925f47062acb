"""dvc.yaml: its dependencies checked against the code, then a real `dvc repro` in one scratch git repo.

The static checks run `voxpipe dvc-yaml --check` (voxpipe/dvcgen.py): each stage's code deps are the
import closure of its `voxpipe <step>` (computed with ast, not a hand-kept list), and its params are the
keys it reads that change its result, tracked per key.

The scratch repo holds the project's dvc.yaml, .dvcignore and voxpipe/ (hashed as the stages' deps),
a few rows per speaker of the shipped sample, and params.yaml with few training steps and a small
evaluation. The commands are the real `voxpipe`, `torchrun` and `dvc` from this venv; the remote is
moto's S3 server on 127.0.0.1. Each test that uses the repo starts from its last commit (`at_commit`),
and a state a test needs (the run trained with a kill in between) is a fixture: any order, any subset.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import yaml
from mlflow import MlflowClient
from servers import NO_JOBS, free_port, migrated_store, serving
from small_sample import write_small_sample

from voxpipe import dvcgen, paramspec
from voxpipe.cli import STEPS
from voxpipe.lineage import DVC_IGNORED, dvc_md5
from voxpipe.params import Params, load_params
from voxpipe.train.checkpoint import latest_checkpoint

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STAGES = ["ingest", "manifest", "validate", "init-model", "encode", "train", "evaluate", "mfu", "register"]
TEST_SETTINGS = {
    "ingest": {"workers": 1},
    "train": {"max_steps": 4, "warmup_steps": 1, "val_every": 0, "checkpoint_every": 1},
    "evaluate": {"seeds": [0], "texts_per_speaker": 1, "max_len": 8, "inference_timesteps": 2, "asr": False},
}


def dvc_yaml() -> dict:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())


# -- dvc.yaml: written whole by `voxpipe dvc-yaml` (voxpipe/dvcgen.py) from the steps' descriptors ----
def step_closure(step: str) -> set[str]:
    return dvcgen.step_closure(next(s for s in STEPS if s.name == step))


def voxpipe_dvc_yaml(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "voxpipe"), "dvc-yaml", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_dvc_yaml_is_what_voxpipe_dvc_yaml_generates():
    """Each stage's code deps are its step's import closure and its params the keys that change its
    result; `make generate` rewrites them when this fails."""
    proc = voxpipe_dvc_yaml("--check")
    assert proc.returncode == 0, f"dvc.yaml is stale: run `make generate`. {proc.stderr}"


def test_the_data_version_leaves_out_the_files_dvcignore_hides():
    """lineage.dvc_md5 must give DVC's md5, so it leaves out the file names .dvcignore hides; a name added
    to one and not the other makes every data version differ from dvc.lock's."""
    lines = [ln.strip() for ln in (ROOT / ".dvcignore").read_text().splitlines()]
    names = {ln for ln in lines if ln and not ln.startswith("#") and not ln.endswith("/")}
    assert names == DVC_IGNORED


def test_check_names_the_stage_and_the_difference_and_the_write_is_what_the_steps_declare(tmp_path,
                                                                                        monkeypatch):
    """dvc.yaml is written whole from the descriptors: a hand edit of a cmd, a dep, a param or an out is
    named by --check and undone by the write, which replaces the file by a rename."""
    text = (ROOT / "dvc.yaml").read_text()
    stale = (text.replace("      - voxpipe/train/loop.py\n", "", 1)
             .replace("      - train.seed\n", "      - train.seed\n      - train.log_every\n", 1)
             .replace("cmd: voxpipe evaluate\n", "cmd: voxpipe evaluate --set evaluate.seeds=[0]\n", 1)
             .replace("      - ${evaluate.out}/eval.png\n", "", 1))
    path = tmp_path / "dvc.yaml"
    path.write_text(stale)
    proc = voxpipe_dvc_yaml("--check", "--file", str(path))
    assert proc.returncode == 1
    for problem in ("stage train: deps lack ['voxpipe/train/loop.py']",
                    "stage train: params lack [], hold ['train.log_every']",
                    "stage evaluate: cmd is 'voxpipe evaluate --set evaluate.seeds=[0]', the step declares "
                    "'voxpipe evaluate'",
                    "stage evaluate: outs lack ['${evaluate.out}/eval.png']"):
        assert problem in proc.stderr, proc.stderr
    assert path.read_text() == stale  # --check writes nothing
    renamed = []
    monkeypatch.setattr(os, "replace", lambda src, dst: renamed.append(dst) or os.rename(src, dst))
    assert dvcgen.dvc_yaml(path, STEPS, check=False)
    assert renamed == [path] and path.read_text() == text


def test_a_missing_dvc_yaml_is_one_paragraph(tmp_path):
    proc = voxpipe_dvc_yaml("--check", "--file", str(tmp_path / "dvc.yaml"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"voxpipe dvc-yaml: error: {tmp_path / 'dvc.yaml'}: no such file" in proc.stderr


def test_import_closure_follows_lazy_imports_and_package_data():
    train = step_closure("train")
    assert "voxpipe/train/fixed_seed_loss.py" in train and "voxpipe/mfu/peak.py" in train
    assert not any(f.startswith(("voxpipe/track/", "voxpipe/launch/", "voxpipe/data/encode/")) for f in train)
    # live MLflow logging: the cli hands it to train (Step.wires), it changes no result
    assert "voxpipe/track/live.py" not in train
    assert "voxpipe/model/tokenizer_corpus.txt" in step_closure("init-model")  # package data it names
    register = step_closure("register")
    assert "voxpipe/serve/pyfunc.py" in register  # named, not imported: it is the registered model's code
    assert "voxpipe/model/io.py" in register  # imported inside a method of the pyfunc model
    assert "voxpipe/device.py" in step_closure("encode")  # a lazy import in the encode step


def test_params_are_tracked_per_key_and_only_keys_that_change_the_result():
    stages = dvc_yaml()["stages"]
    keys = {k.key for k in paramspec.keys()}
    for name, stage in stages.items():
        for key in stage["params"]:
            assert "." in key, f"stage {name} tracks the whole section {key}: track its keys"
            assert key in keys or any(k.startswith(key + ".") for k in keys), f"stage {name}: no key {key}"
    train = set(stages["train"]["params"])
    assert {"train.lr", "train.max_steps", "train.export_dtype", "train.lora", "model.kernels"} <= train
    # checkpoint, logging and tracking keys, and paths (DVC deps and outs already) never retrain
    assert not train & {"train.checkpoint_every", "train.track", "train.val_every", "train.log_every",
                        "train.out", "train.data", "model.base", "tracking.uri"}
    assert train - {"local.nproc", "model.kernels"} == {f"train.{k}" for k in {
        n.split(".")[1] for n, leaves in paramspec.fields("train").items()
        if any(k.changes_result for k in leaves)}}
    assert not set(stages["ingest"]["params"]) & {"ingest.workers", "ingest.shards", "ingest.plan",
                                                   "ingest.input", "ingest.max_bad_fraction"}
    assert {"tracking.uri", "register.model_name"} <= set(stages["register"]["params"])
    assert "train.max_tokens" in stages["evaluate"]["params"]  # the val batches are the trainer's


def test_world_size_is_a_tracked_param():
    stages = dvc_yaml()["stages"]
    assert "vars" not in dvc_yaml()
    for name in ("train", "encode"):
        assert "local.nproc" in stages[name]["params"]
    assert "${local.nproc}" in stages["train"]["cmd"]


# -- the scratch repo ------------------------------------------------------------------------------
def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AWS_"))}
    env.update(PATH=f"{BIN}{os.pathsep}{env['PATH']}", DVC_NO_ANALYTICS="1", GIT_AUTHOR_NAME="t",
               GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com",
               **extra)
    return env


def run(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """A command in the scratch repo; its output (stdout + stderr), or the test fails showing it."""
    proc = subprocess.run(args, cwd=repo, env=env or _env(), capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{out[-6000:]}"
    return out


def dvc(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    return run(repo, str(BIN / "dvc"), *args, env=env)


def ran(output: str) -> list[str]:
    return re.findall(r"Running stage '([\w-]+)'", output)


def commit(repo: Path, message: str) -> None:
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", message)


def write_params(repo: Path, **changes: dict) -> None:
    params = Params().model_dump(by_alias=True)
    for section, values in {**TEST_SETTINGS, **changes}.items():
        params[section] = {**params[section], **values}
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def outs(repo: Path, stage: str) -> list[tuple[str, dict]]:
    """(path, options) of a stage's outs and metrics, `${section.key}` resolved from the repo's params."""
    params = yaml.safe_load((repo / "params.yaml").read_text())

    def resolve(m: re.Match) -> str:
        section, key = m.group(1).split(".")
        return str(params[section][key])

    entries = [o if isinstance(o, dict) else {o: {}} for key in ("outs", "metrics")
               for o in dvc_yaml()["stages"][stage].get(key, [])]
    return [(re.sub(r"\$\{([\w.]+)\}", resolve, path), options or {})
            for entry in entries for path, options in entry.items()]


def cached_outs(repo: Path) -> dict[str, str]:
    """path -> md5 in dvc.lock of every cached output (the run records, `cache: false`, left out)."""
    records = {path for stage in dvc_yaml()["stages"] for path, options in outs(repo, stage)
               if not options.get("cache", True)}
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    return {o["path"]: o["md5"] for stage in lock.values() for o in stage.get("outs", [])
            if o["path"] not in records}


def scratch_repo(repo: Path) -> Path:
    """`repo` made a DVC project of this one's stages: dvc.yaml, .dvcignore, .gitignore, voxpipe/ (the
    stages' code deps) and an empty data/corrections.jsonl (ingest's dep: nothing proofread); the caller
    adds its data and params.yaml, then runs `git_and_dvc_init`."""
    repo.mkdir(parents=True, exist_ok=True)
    for name in ("dvc.yaml", ".dvcignore", ".gitignore"):
        shutil.copy(ROOT / name, repo / name)
    shutil.copytree(ROOT / "voxpipe", repo / "voxpipe", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "data").mkdir(exist_ok=True)
    (repo / "data" / "corrections.jsonl").write_text("")
    return repo


def git_and_dvc_init(repo: Path) -> Path:
    run(repo, "git", "init", "-q")
    dvc(repo, "init", "-q")
    return repo


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = scratch_repo(tmp_path_factory.mktemp("dvc_repo"))
    write_small_sample(repo / "data" / "sample", per_speaker=6)
    write_params(repo)
    return git_and_dvc_init(repo)


@pytest.fixture(scope="module")
def first_repro(repo) -> str:
    out = dvc(repo, "repro")
    commit(repo, "baseline")
    return out


def restore_commit(repo: Path) -> None:
    """Back to the committed run: params, dvc.lock and metrics from git, the cached outputs from DVC."""
    run(repo, "git", "checkout", "--", ".")
    dvc(repo, "checkout")


@pytest.fixture
def at_commit(repo, first_repro) -> Path:
    """The repo as last committed, whatever a test before this one left in it."""
    restore_commit(repo)
    return repo


def test_repro_runs_every_stage_and_registers_a_model(repo, first_repro, at_commit):
    assert ran(first_repro) == STAGES
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    assert sorted(lock) == sorted(STAGES)
    plots = json.loads(dvc(repo, "plots", "show", "--json"))
    assert not plots.get("errors"), plots["errors"]
    assert {"val_loss", "train_loss"} <= set(plots["data"]), sorted(plots["data"])
    metrics = json.loads(dvc(repo, "metrics", "show", "--json"))
    figures = next(iter(metrics.values()))["data"]
    assert "loss_model" in figures["work/eval/eval.json"]["data"]
    # the fine-tune's headline, its paired similarity gain, and the noise floor's file (none measured yet)
    assert {"similarity_gain", "similarity_gain_low"} <= set(figures["work/eval/eval.json"]["data"])
    assert json.loads((repo / "work/eval/noise.json").read_text())["measured"] is False
    # a CPU's MFU is null with its reason (no recorded peak): DVC shows the throughput, the headline there
    assert "tokens_per_s" in figures["work/mfu/mfu.json"]["data"]
    mfu = json.loads((repo / "work/mfu/mfu.json").read_text())
    assert mfu["mfu"] is None and mfu["mfu_null_reason"], mfu.get("mfu_null_reason")
    registered = json.loads((repo / "work/register/registered.json").read_text())
    client = MlflowClient(f"sqlite:///{repo / 'work/mlflow.db'}")
    candidate = client.get_model_version_by_alias(registered["name"], "candidate")
    assert int(candidate.version) == registered["version"]
    # the data version MLflow records is the md5 dvc.lock holds for the ingested folder
    ingest_md5 = next(o["md5"] for o in lock["ingest"]["outs"])
    assert candidate.tags["voxpipe.data_version"] == ingest_md5


def test_second_repro_does_nothing(repo, first_repro, at_commit):
    out = dvc(repo, "repro")
    assert ran(out) == []
    assert "up to date" in dvc(repo, "status")


def test_keys_that_do_not_change_the_result_rerun_nothing(repo, first_repro, at_commit):
    write_params(repo, ingest={"workers": 2}, train={**TEST_SETTINGS["train"], "checkpoint_every": 3,
                                                     "track": True, "val_every": 2})
    assert "up to date" in dvc(repo, "status")
    write_params(repo, train={**TEST_SETTINGS["train"], "lr": 3e-5})
    assert re.findall(r"^([\w-]+):", dvc(repo, "status"), re.M) == ["train"]
    write_params(repo)


def test_an_update_that_adds_a_serve_or_evaluate_setting_leaves_the_data_stages_clean(repo, first_repro,
                                                                                       at_commit):
    """A voxpipe update that only adds a serving (or an evaluation) setting re-ingests and re-encodes
    nothing: a stage's code deps hold the modules of the sections its step reads (voxpipe/dvcgen.py)."""
    for section, rerun in (("serve", set()), ("evaluate", {"evaluate", "register"})):
        module = repo / "voxpipe" / "steps" / f"{section}.py"
        text = module.read_text()
        added = re.sub(r'(class \w+\(Section\):\n    """.*?"""\n)',
                       r'\1    knob: int = Field(1, description="a setting an update adds")\n', text, count=1,
                       flags=re.S)
        assert added != text
        module.write_text(added)
        assert set(re.findall(r"^([\w-]+):", dvc(repo, "status"), re.M)) == rerun, section
        module.write_text(text)


def test_a_stage_run_again_writes_the_same_bytes(repo, first_repro, at_commit):
    """Each data stage run again from nothing (its folder deleted, even the persistent ones) hashes as
    before, so nothing after it reruns."""
    before = cached_outs(repo)
    for stage in ("ingest", "manifest", "validate", "init-model", "encode"):
        for path, _ in outs(repo, stage):
            shutil.rmtree(repo / path)
        assert ran(dvc(repo, "repro", "--force", "--single-item", stage)) == [stage]
        assert cached_outs(repo) == before, f"{stage}: a rerun changed its outputs"
    assert "up to date" in dvc(repo, "status")
    assert (repo / "work/ingest/run.json").is_file()  # the timings are there, hidden from DVC


def _repro_killed_after_a_checkpoint(repo: Path) -> int:
    """`dvc repro` in its own process group, SIGKILLed (all of it) once train has a complete
    checkpoint; the step of the newest one then."""
    proc = subprocess.Popen([str(BIN / "dvc"), "repro"], cwd=repo, env=_env(), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    root = repo / "work/train/checkpoints"
    started, deadline = time.time(), time.monotonic() + 600
    try:  # the old run's checkpoints do not count (the trainer moves them aside first)
        while (newest := latest_checkpoint(root)) is None or newest.stat().st_mtime < started:
            assert proc.poll() is None, f"dvc repro ended before a checkpoint:\n{proc.stdout.read()[-4000:]}"
            assert time.monotonic() < deadline, "no checkpoint within 10 minutes"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    until_no_voxpipe_process_in(repo)  # torchrun's workers die with their launcher (PR_SET_PDEATHSIG)
    return int(newest.name.removeprefix("step-"))


def until_no_voxpipe_process_in(folder: Path, timeout: float = 60) -> None:
    """Wait until no `voxpipe` process (a torchrun worker) runs in `folder` (Linux /proc)."""
    folder, deadline = folder.resolve(), time.monotonic() + timeout
    while True:
        left = []
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                here = Path(os.readlink(proc / "cwd")) == folder
                if here and b"voxpipe" in (proc / "cmdline").read_bytes():
                    left.append(proc.name)
            except OSError:
                pass  # gone, or not ours to read
        if not left:
            return
        assert time.monotonic() < deadline, f"processes {left} still work in {folder}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def killed_run(repo, first_repro) -> tuple[int, str, dict, list[str]]:
    """A new seed: train starts over (train.fresh_on_change moves the old checkpoints aside), is killed
    after a checkpoint, and the next `dvc repro` finishes it; committed. (step killed at, repro output,
    the train report and metrics.jsonl lines then: run records, which no checkout brings back)"""
    restore_commit(repo)
    write_params(repo, train={**TEST_SETTINGS["train"], "seed": 1})
    killed_at = _repro_killed_after_a_checkpoint(repo)
    out = dvc(repo, "repro")
    commit(repo, "seed 1, trained with a kill in between")
    report = json.loads((repo / "work/train/report.json").read_text())
    return killed_at, out, report, (repo / "work/train/metrics.jsonl").read_text().splitlines()


def test_killed_train_resumes_from_its_checkpoint_on_the_next_repro(killed_run):
    killed_at, out, report, lines = killed_run
    assert killed_at < TEST_SETTINGS["train"]["max_steps"]
    assert ran(out)[0] == "train"
    resumed = report["resumed_from"]
    assert resumed and int(Path(resumed).name.removeprefix("step-")) >= killed_at, report
    assert report["steps"] == TEST_SETTINGS["train"]["max_steps"] and report["steps_run"] < report["steps"]
    steps = sorted({json.loads(line)["step"] for line in lines} - {0})
    assert steps == list(range(1, report["steps"] + 1))  # the history before the kill is kept


def test_train_param_change_reruns_train_and_what_follows(repo, first_repro, at_commit):
    """The checkpoints of the committed run are for another lr: train starts fresh (moves them aside)."""
    out = dvc(repo, "exp", "run", "-S", "train.lr=3e-5")
    assert ran(out) == ["train", "evaluate", "mfu", "register"], out[-3000:]
    assert list((repo / "work/train").glob("checkpoints.replaced-*"))
    diff = json.loads(dvc(repo, "metrics", "diff", "--json"))
    assert "loss_model" in diff["work/eval/eval.json"]
    assert "step_time_s" in diff["work/mfu/mfu.json"]  # a CPU's mfu is null in both
    assert load_params(repo / "params.yaml").train.lr == 3e-5  # DVC's `3e-05` reads as a float
    restore_commit(repo)


def test_a_new_voice_trains_fresh_and_registers_as_a_model_of_its_own(repo, first_repro, at_commit):
    """Your own voice right after the demo: a new ingest.input reruns every stage, train moves the demo's
    checkpoints aside instead of refusing to resume them, and register makes version 1 of the voice's own
    model, leaving the demo's model as it was (issue 28)."""
    demo = json.loads((repo / "work/register/registered.json").read_text())
    write_small_sample(repo / "data" / "my-voice", per_speaker=4)
    write_params(repo, ingest={**TEST_SETTINGS["ingest"], "input": ["data/my-voice"]})
    try:
        out = dvc(repo, "repro")
        assert ran(out) == STAGES[:3] + STAGES[4:], out[-3000:]  # the base model is the same one
        # (an earlier test's checkpoints may also differ in params: they are named first)
        fresh = r"starting fresh \(train\.fresh_on_change: [^\n]*train\.data: the encoded data"
        assert re.search(fresh, out), out[-3000:]
        assert "cannot resume" not in out and "Traceback" not in out
        assert list((repo / "work/train").glob("checkpoints.replaced-*"))
        mine = json.loads((repo / "work/register/registered.json").read_text())
        assert (mine["name"], int(mine["version"])) == ("voxpipe-my-voice", 1)
        client = MlflowClient(f"sqlite:///{repo / 'work/mlflow.db'}")
        demo_version = client.get_model_version_by_alias("voxpipe-sample", "candidate").version
        assert int(demo_version) == int(demo["version"])
    finally:
        shutil.rmtree(repo / "data" / "my-voice")
        restore_commit(repo)


SWEEP = [sys.executable, str(ROOT / "tools" / "sweep.py")]


def sweep_record(repo: Path) -> dict:
    return json.loads((repo / "work" / "sweep" / "sweep.json").read_text())


def sweep_names_in_dvc(repo: Path, parent: str) -> tuple[dict[str, str], set[str]]:
    """(name -> state in `dvc queue status`, the experiment names `dvc exp show` lists) of one sweep."""
    prefix = f"sweep-{parent[:8]}-"
    states = {f[1]: f[-1] for f in (ln.split() for ln in dvc(repo, "queue", "status").splitlines())
              if len(f) > 2 and f[1].startswith(prefix)}
    shown = set(re.findall(rf'"name": "({prefix}[^"]*)"', dvc(repo, "exp", "show", "--json")))
    return states, shown


def parent_run(repo: Path, run_id: str):
    return MlflowClient(f"sqlite:///{repo / 'work/mlflow.db'}").get_run(run_id)


def no_process_left(repo: Path, timeout: float = 120) -> None:
    """No tools/sweep.py and no voxpipe step (a point's torchrun, evaluate...) runs in the repo or in one
    of DVC's temporary experiment copies under it (Linux /proc)."""
    folder, deadline = repo.resolve(), time.monotonic() + timeout
    while True:
        left = []
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                cwd = Path(os.readlink(proc / "cwd"))
                cmd = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            ours = (b"bin/voxpipe\x00", b"voxpipe.cli", b"voxpipe.launch", b"sweep.py")
            if (cwd == folder or folder in cwd.parents) and any(m in cmd for m in ours):
                left.append(f"{proc.name}: {cmd[:120]!r}")
        if not left:
            return
        assert time.monotonic() < deadline, f"processes left: {left}"
        time.sleep(0.5)


def test_a_sweep_needs_its_data_in_git_or_dvc_before_it_queues(repo, first_repro, at_commit):
    """README's own-folder path: the folder untracked. The sweep stops before queueing anything or
    opening a parent run, naming `dvc add` and why (issue 41). That what it says to do then makes the
    sweep work is the README path's own run (test_readme_paths: `dvc add data/my-voice`, then `make
    sweep` runs every stage on that folder). (their-voice: test_a_new_voice's my-voice model must stay at
    version 1.)"""
    write_small_sample(repo / "data" / "their-voice", per_speaker=4)
    write_params(repo, ingest={**TEST_SETTINGS["ingest"], "input": ["data/their-voice"]})
    shutil.rmtree(repo / "work" / "sweep", ignore_errors=True)
    try:
        proc = subprocess.run([*SWEEP, "--grid", "train.lr=2e-5,4e-5"], cwd=repo, env=_env(),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "data/their-voice, a dependency of stage ingest" in proc.stderr
        way = "`dvc add data/their-voice && git add data/their-voice.dvc data/.gitignore`"
        assert way in proc.stderr and "Nothing was queued" in proc.stderr
        assert not (repo / "work" / "sweep" / "sweep.json").exists()
        assert "sweep-" not in dvc(repo, "queue", "status")
    finally:
        run(repo, "git", "reset", "-q")
        for path in ("data/their-voice", "data/their-voice.dvc", "data/.gitignore"):
            target = repo / path
            shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        restore_commit(repo)


def test_a_failed_point_closes_the_sweep_and_a_rerun_keeps_the_point_that_succeeded(repo, first_repro,
                                                                                    at_commit):
    """Point 1 (train.device=npu on a machine without one) fails: the sweep ends in one line naming it
    and its saved log, the parent is FAILED (tagged), the failed point is out of the queue and of `dvc exp
    show`; the same command again keeps point 0 (it runs no stage) and tries point 1 again (issue 41)."""
    shutil.rmtree(repo / "work" / "sweep", ignore_errors=True)
    command = [*SWEEP, "--grid", "train.device=cpu,npu", "--grid", "train.lr=2e-5", "--workers", "1"]
    first = subprocess.run(command, cwd=repo, env=_env(), capture_output=True, text=True, timeout=900)
    assert first.returncode == 1 and "Traceback" not in first.stdout + first.stderr, first.stderr[-3000:]
    record = sweep_record(repo)
    parent = record["parent_run"]
    assert re.search(rf"^sweep-{parent[:8]}-0 \(Success\): ran train, evaluate, mfu, register \[1/2 done",
                     first.stdout, re.M), first.stdout
    assert len(first.stderr.strip().splitlines()) == 1, first.stderr
    assert f"point sweep-{parent[:8]}-1 failed" in first.stderr
    assert (repo / "work" / "sweep" / f"sweep-{parent[:8]}-1.log").is_file()
    run_ = parent_run(repo, parent)
    assert run_.info.status == "FAILED" and run_.data.tags["voxpipe.sweep"] == "failed"
    assert "voxpipe.sweep.ended" in run_.data.tags
    states, shown = sweep_names_in_dvc(repo, parent)
    assert states == {f"sweep-{parent[:8]}-0": "Success"}, states
    assert f"sweep-{parent[:8]}-1" not in shown  # no failed row with the baseline's figures
    assert record["state"] == "failed"

    again = subprocess.run(command, cwd=repo, env=_env(), capture_output=True, text=True, timeout=900)
    assert again.returncode == 1 and "Traceback" not in again.stdout + again.stderr, again.stderr[-3000:]
    assert sweep_record(repo)["parent_run"] == parent  # the same sweep, taken up again
    kept = f"sweep-{parent[:8]}-0 (Success): kept from the stopped run of this sweep, ran nothing"
    assert kept in again.stdout
    assert "1 experiments queued" in again.stdout and f"point sweep-{parent[:8]}-1-r1 failed" in again.stderr
    assert parent_run(repo, parent).info.status == "FAILED"
    no_process_left(repo)
    restore_commit(repo)


def test_an_interrupted_sweep_stops_its_points_and_the_same_command_finishes_it(repo, first_repro,
                                                                                at_commit):
    """`make sweep` (tools/sweep.py): one queued `dvc exp run -S` per point, run by `dvc queue start`;
    each reruns only train and after (ingest, manifest, encode come from dvc.lock and the cache); the
    points are children of one MLflow parent and only the best becomes a model version (issue 31).
    Ctrl-C once point 0 finished and point 1 runs: one line, no traceback, point 1 stopped and out of
    the queue, the parent KILLED, no process left; the same command keeps point 0, runs point 1 and
    closes the sweep (issue 41)."""
    shutil.rmtree(repo / "work" / "sweep", ignore_errors=True)
    db = repo / "work" / "mlflow.db"
    before = {v.version for v in MlflowClient(f"sqlite:///{db}").search_model_versions("name='voxpipe-sample'")}
    command = [*SWEEP, "--grid", "train.lr=2e-5,4e-5", "--workers", "1"]
    proc = subprocess.Popen(command, cwd=repo, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "[1/2 done" in line:
            break
    assert "(Success): ran train, evaluate, mfu, register [1/2 done" in "".join(lines), "".join(lines)
    time.sleep(3)  # point 1 has started
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "Traceback" not in out + err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("sweep: stopped by SIGINT:"), err
    parent = sweep_record(repo)["parent_run"]
    run_ = parent_run(repo, parent)
    assert run_.info.status == "KILLED" and run_.data.tags["voxpipe.sweep"] == "killed"
    states, shown = sweep_names_in_dvc(repo, parent)
    assert states == {f"sweep-{parent[:8]}-0": "Success"}, (states, err)
    assert f"sweep-{parent[:8]}-1" not in shown
    no_process_left(repo)

    out = run(repo, *command)
    assert f"sweep-{parent[:8]}-0 (Success): kept from the stopped run of this sweep, ran nothing" in out
    points = re.findall(r"^(sweep-\w+-\d(?:-r\d)?) \((\w+)\): ran (.*?) \[", out, re.M)
    assert [(state, stages) for _, state, stages in points] == [("Success", "train, evaluate, mfu, register")]
    assert "train.lr" in out and "loss_model" in out  # dvc exp show: the swept key and the figures
    sweep = sweep_record(repo)
    assert sweep["parent_run"] == parent and sweep["state"] == "closed"
    client = MlflowClient(f"sqlite:///{db}")
    experiment = client.get_experiment_by_name("voxpipe").experiment_id
    children = client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{parent}'")
    assert sorted(r.data.tags["sweep.train.lr"] for r in children) == ["2e-05", "4e-05"]
    closed = client.get_run(parent)
    assert closed.info.status == "FINISHED" and closed.data.tags["voxpipe.sweep_best"] == sweep["best"]
    new = [v for v in client.search_model_versions("name='voxpipe-sample'") if v.version not in before]
    assert [v.run_id for v in new] == [sweep["best"]]
    restore_commit(repo)


def test_a_killed_make_or_a_sigterm_stops_the_sweep_with_no_orphan(repo, first_repro, at_commit):
    """`make sweep` SIGKILLed while its point runs: tools/sweep.py (make's child: the recipe execs it)
    gets SIGHUP from the kernel (PR_SET_PDEATHSIG), stops the point and closes the parent KILLED; nothing
    of the sweep runs on. Then SIGTERM while the points are being queued: the queued ones are removed."""
    shutil.rmtree(repo / "work" / "sweep", ignore_errors=True)
    (repo / "tools").mkdir(exist_ok=True)
    shutil.copy(ROOT / "tools" / "sweep.py", repo / "tools" / "sweep.py")  # the recipe's relative path
    make = subprocess.Popen(["make", "-s", "-f", str(ROOT / "Makefile"), f"VENV={BIN.parent}", "STAMP=",
                             "sweep", "GRID=train.lr=3e-5"], cwd=repo, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in make.stdout:
        if "experiments queued" in line:
            break
    time.sleep(5)  # the point runs
    make.kill()
    make.wait()
    no_process_left(repo)
    err = make.stderr.read()  # (make's own `sed` over a pyproject.toml the scratch repo lacks, first)
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("sweep: stopped by SIGHUP:"), err
    parent = sweep_record(repo)["parent_run"]
    run_ = parent_run(repo, parent)
    assert run_.info.status == "KILLED" and run_.data.tags["voxpipe.sweep"] == "killed"
    assert sweep_names_in_dvc(repo, parent) == ({}, set())

    shutil.rmtree(repo / "work" / "sweep")
    proc = subprocess.Popen([*SWEEP, "--grid", "train.lr=5e-5,6e-5,7e-5"], cwd=repo, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (repo / "work/sweep/sweep.json").is_file() or not sweep_record(repo).get("experiments"):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.terminate()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 143 and "Traceback" not in out + err, err
    assert len(err.strip().splitlines()) == 1 and "queued or running stopped" in err, err
    parent = sweep_record(repo)["parent_run"]
    assert parent_run(repo, parent).info.status == "KILLED"
    assert sweep_names_in_dvc(repo, parent) == ({}, set())
    no_process_left(repo)
    shutil.rmtree(repo / "tools")
    restore_commit(repo)


# -- a real remote: moto's S3 server on 127.0.0.1 holds DVC's data and MLflow's artifacts ------------
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                  "AWS_DEFAULT_REGION": "us-east-1"}
BUCKET = "voxpipe"


@pytest.fixture(scope="module")
def s3(tmp_path_factory) -> Iterator[str]:
    """The endpoint of an S3-protocol server with an empty bucket."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("s3") / "moto.log"
    with serving([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], f"{endpoint}/moto-api/",
                 log, _env()):
        s3_client(endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint


def s3_client(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                        region_name=S3_CREDENTIALS["AWS_DEFAULT_REGION"])


def test_data_round_trip_through_an_s3_remote_and_a_fresh_clone(repo, killed_run, at_commit, s3, tmp_path):
    """dvc add -> push -> a fresh clone -> pull -> repro, with MLflow's artifact store on the same S3.

    The clone pulls the raw data and every cached output; `dvc repro` there reruns train (its run
    records are not cached) and writes byte-identical outputs: the model trained from scratch in the
    clone equals the one the repo trained with a kill in between, so nothing before train and not
    evaluate reruns."""
    env = _env(**S3_CREDENTIALS)  # credentials by reference (env), never in .dvc/config
    run(repo, "git", "rm", "-r", "-q", "--cached", "data/sample")  # the raw data: versioned by DVC now
    dvc(repo, "add", "data/sample")
    dvc(repo, "remote", "add", "-d", "store", f"s3://{BUCKET}/dvc")
    dvc(repo, "remote", "modify", "store", "endpointurl", s3)
    commit(repo, "the raw data in DVC, an S3 remote")
    dvc(repo, "push", env=env)

    clone = tmp_path / "clone"
    run(tmp_path, "git", "clone", "-q", str(repo), str(clone))
    dvc(clone, "pull", env=env)
    raw = yaml.safe_load((clone / "data/sample.dvc").read_text())["outs"][0]["md5"]
    assert dvc_md5(clone / "data/sample") == raw == dvc_md5(repo / "data/sample")
    expected = cached_outs(repo)
    assert {path: dvc_md5(clone / path) for path in expected} == expected

    port = free_port()
    tracking = f"http://127.0.0.1:{port}"
    server_env = _env(**S3_CREDENTIALS, MLFLOW_S3_ENDPOINT_URL=s3)
    server = [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
              "--backend-store-uri", f"sqlite:///{migrated_store(tmp_path / 'mlflow.db')}",
              "--default-artifact-root", f"s3://{BUCKET}/mlflow", "--no-serve-artifacts"]
    params = yaml.safe_load((clone / "params.yaml").read_text())
    params["tracking"]["uri"] = tracking
    (clone / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    with serving(server, f"{tracking}/health", tmp_path / "mlflow.log", {**server_env, **NO_JOBS}):
        out = dvc(clone, "repro", env=server_env)
        # train's run records are not cached: it trains again, from scratch, into the same bytes, so
        # evaluate (its eval.json is in git) has nothing new to score; mfu times the new run
        assert ran(out) == ["train", "mfu", "register"], out[-3000:]
        assert cached_outs(clone) == expected
        registered = json.loads((clone / "work/register/registered.json").read_text())
        client = MlflowClient(tracking)
        mlflow_run = client.get_run(registered["run_id"])
        version = client.get_model_version(registered["name"], str(registered["version"]))
    assert mlflow_run.info.artifact_uri.startswith(f"s3://{BUCKET}/mlflow/")
    keys = [o["Key"] for o in s3_client(s3).list_objects_v2(Bucket=BUCKET, Prefix="mlflow/")["Contents"]]
    assert any(k.endswith("eval.json") for k in keys), keys
    assert any(k.endswith("model.safetensors") for k in keys), keys
    # the data version MLflow holds is the ingested folder's md5 in dvc.lock: `dvc pull` at that commit
    # brings exactly that data back (docs/data-versions.md)
    lock = yaml.safe_load((clone / "dvc.lock").read_text())["stages"]
    assert version.tags["voxpipe.data_version"] == next(o["md5"] for o in lock["ingest"]["outs"])
    assert next(d["md5"] for d in lock["ingest"]["deps"] if d["path"] == "data/sample") == raw  # .dvc

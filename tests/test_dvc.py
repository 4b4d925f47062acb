"""dvc.yaml: its dependencies checked against the code, then a real `dvc repro` in one scratch git repo.

The static checks read dvc.yaml and voxpipe/ only: each stage's code deps are the import closure of
its `voxpipe <step>` (computed with ast, not a hand-kept list), and params are tracked per key.

The scratch repo holds the project's dvc.yaml, .dvcignore and voxpipe/ (hashed as the stages' deps),
a few rows per speaker of the shipped sample, and params.yaml with few training steps and a small
evaluation. The commands are the real `voxpipe`, `torchrun` and `dvc` from this venv; the remote is
moto's S3 server on 127.0.0.1. The tests run in file order on that one repo (each leaves it committed).
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
from servers import free_port, serving
from small_sample import write_small_sample

from voxpipe.cli import STEPS
from voxpipe.dvcgen import import_closure
from voxpipe.lineage import dvc_md5
from voxpipe.params import Params, load_params
from voxpipe.train.checkpoint import latest_checkpoint
from voxpipe.train.resume import RESUME_FREE

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


# -- code deps: the import closure of each `voxpipe <step>` ------------------------------------------
def step_closure(step: str) -> set[str]:
    target = next(s.target for s in STEPS if s.name == step).split(":")[0]
    return import_closure({"voxpipe.cli", target})


def expand(dep: str) -> set[str]:
    """A code dep as the files DVC hashes (a folder: all of them, as .dvcignore leaves them)."""
    path = ROOT / dep
    if path.is_file():
        return {dep}
    return {f.relative_to(ROOT).as_posix() for f in path.rglob("*")
            if f.is_file() and "__pycache__" not in f.parts}


def compact(files: set[str]) -> list[str]:
    """The closure as dvc.yaml lists it: a folder where every file in it is needed, else the files."""
    out = set(files)
    for folder in {f.rpartition("/")[0] for f in files} - {"voxpipe"}:
        if expand(folder) <= files:
            out = (out - expand(folder)) | {folder}
    return sorted(out, key=lambda d: (d.count("/"), d))


def _step_of(cmd: str) -> str | None:
    m = re.search(r"(?:^voxpipe|-m voxpipe\.cli) ([\w-]+)", cmd)
    return m.group(1) if m else None


def test_code_deps_are_each_steps_import_closure():
    problems = []
    for name, stage in dvc_yaml()["stages"].items():
        step = _step_of(stage["cmd"])
        assert step, f"stage {name}: its cmd {stage['cmd']!r} does not run `voxpipe <step>`"
        code = [d for d in stage.get("deps", []) if d.split("/")[0] == "voxpipe"]
        listed = set().union(*(expand(d) for d in code))
        needed = step_closure(step)
        if listed != needed:
            problems.append(
                f"stage {name}: missing {sorted(needed - listed)}, not imported {sorted(listed - needed)} (a "
                "folder dep must be imported whole). Its code deps:\n" + "".join(
                    f"      - {d}\n" for d in compact(needed))
            )
    assert not problems, "\n".join(problems)


def test_import_closure_follows_lazy_imports_and_package_data():
    train = step_closure("train")
    assert "voxpipe/track/live.py" not in train  # the cli hands it to train (no result changes with it)
    assert "voxpipe/train/fixed_seed_loss.py" in train and "voxpipe/mfu/peak.py" in train
    assert "voxpipe/model/tokenizer_corpus.txt" in step_closure("init-model")
    assert not any(f.startswith(("voxpipe/launch/", "voxpipe/track/compare")) for f in train)


# -- params: per key, and only the keys that change a stage's cached outputs ------------------------
ALL = None
READS = {  # stage -> {section: keys it reads (ALL: the whole section)}
    "ingest": {"ingest": ALL},
    "manifest": {"manifest": ALL},
    "validate": {"validate": ALL, "ingest": {"sample_rate", "min_seconds", "max_seconds"}},
    "init-model": {"model": {"preset", "out", "seed", "dtype"}},
    "encode": {"encode": ALL, "local": ALL, "model": {"base"}},
    "train": {"train": ALL, "local": ALL, "model": {"base", "kernels"}},
    "evaluate": {"evaluate": ALL, "model": {"base", "kernels"}, "train": {"max_tokens"}},
    "mfu": {"mfu": ALL, "model": {"base"}},
    "register": {"register": ALL, "tracking": ALL},
}
# Of those, the keys that must NOT rerun the stage: paths (deps and outs already), worker counts,
# guards that only fail a run, checkpoint and logging keys. train's come from voxpipe/train/resume.py
# (what a checkpoint may resume across), less max_steps and export_dtype: they change the export.
UNTRACKED = {
    "ingest": {f"ingest.{k}" for k in ("input", "out", "workers", "shards", "plan", "shard", "shard_dirs",
                                        "max_bad_fraction")},
    "manifest": {"manifest.input", "manifest.out"},
    "validate": {"validate.manifest", "validate.out"},
    "init-model": {"model.out"},
    "encode": {"encode.manifest", "encode.out", "model.base"},
    "train": {f"train.{k}" for k in RESUME_FREE - {"max_steps", "export_dtype"}}
    | {"train.data", "model.base"},
    "evaluate": {"evaluate.model", "evaluate.data", "evaluate.out", "evaluate.require_improvement",
                 "model.base"},
    "mfu": {"mfu.train_report", "mfu.metrics", "mfu.out", "model.base"},
    "register": {f"register.{k}" for k in ("model", "eval", "mfu", "train", "ingest", "out")},
}


def test_params_are_tracked_per_key_and_only_keys_that_change_the_result():
    schema = Params().model_dump(by_alias=True)
    problems = []
    for name, stage in dvc_yaml()["stages"].items():
        tracked = set(stage.get("params", []))
        reads = {f"{section}.{k}" for section, keys in READS[name].items()
                 for k in (schema[section] if keys is ALL else keys & set(schema[section]))}
        want = reads - UNTRACKED[name]
        if tracked != want:
            problems.append(f"stage {name}: tracks {sorted(tracked - want)} that do not change its result "
                            f"or are whole sections, misses {sorted(want - tracked)}")
    assert not problems, "\n".join(problems)


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
    commit(repo, "baseline")
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
    # the data version MLflow records is the md5 dvc.lock holds for the ingested folder
    ingest_md5 = next(o["md5"] for o in lock["ingest"]["outs"])
    assert candidate.tags["voxpipe.data_version"] == ingest_md5


def test_second_repro_does_nothing(repo, first_repro):
    out = dvc(repo, "repro")
    assert ran(out) == []
    assert "up to date" in dvc(repo, "status")


def test_keys_that_do_not_change_the_result_rerun_nothing(repo, first_repro):
    write_params(repo, ingest={"workers": 2}, train={**TEST_SETTINGS["train"], "checkpoint_every": 3,
                                                     "track": True, "val_every": 2})
    assert "up to date" in dvc(repo, "status")
    write_params(repo, train={**TEST_SETTINGS["train"], "lr": 3e-5})
    assert re.findall(r"^([\w-]+):", dvc(repo, "status"), re.M) == ["train"]
    write_params(repo)


def test_a_stage_run_again_writes_the_same_bytes(repo, first_repro):
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
    time.sleep(1)  # torchrun's workers die with their launcher (PR_SET_PDEATHSIG)
    return int(newest.name.removeprefix("step-"))


def test_killed_train_resumes_from_its_checkpoint_on_the_next_repro(repo, first_repro):
    # a new seed: train starts over (train.fresh_on_change moves the old checkpoints aside), and is killed
    write_params(repo, train={**TEST_SETTINGS["train"], "seed": 1})
    killed_at = _repro_killed_after_a_checkpoint(repo)
    assert killed_at < TEST_SETTINGS["train"]["max_steps"]
    out = dvc(repo, "repro")
    assert ran(out)[0] == "train"
    report = json.loads((repo / "work/train/report.json").read_text())
    resumed = report["resumed_from"]
    assert resumed and int(Path(resumed).name.removeprefix("step-")) >= killed_at, report
    assert report["steps"] == TEST_SETTINGS["train"]["max_steps"] and report["steps_run"] < report["steps"]
    lines = (repo / "work/train/metrics.jsonl").read_text().splitlines()
    steps = sorted({json.loads(line)["step"] for line in lines} - {0})
    assert steps == list(range(1, report["steps"] + 1))  # the history before the kill is kept
    commit(repo, "seed 1, trained with a kill in between")


def test_train_param_change_reruns_train_and_what_follows(repo, first_repro):
    """The checkpoints of the committed run are for another lr: train starts fresh (moves them aside)."""
    out = dvc(repo, "exp", "run", "-S", "train.lr=3e-5")
    assert ran(out) == ["train", "evaluate", "mfu", "register"], out[-3000:]
    assert list((repo / "work/train").glob("checkpoints.replaced-*"))
    diff = json.loads(dvc(repo, "metrics", "diff", "--json"))
    assert "loss_model" in diff["work/eval/eval.json"]
    assert "mfu" in diff["work/mfu/mfu.json"]
    assert load_params(repo / "params.yaml").train.lr == 3e-5  # DVC's `3e-05` reads as a float
    run(repo, "git", "checkout", "--", ".")  # back to the committed run: params, dvc.lock, metrics
    dvc(repo, "checkout")  # and its cached outputs


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


def test_data_round_trip_through_an_s3_remote_and_a_fresh_clone(repo, first_repro, s3, tmp_path):
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
              "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
              "--default-artifact-root", f"s3://{BUCKET}/mlflow", "--no-serve-artifacts"]
    params = yaml.safe_load((clone / "params.yaml").read_text())
    params["tracking"]["uri"] = tracking
    (clone / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    with serving(server, f"{tracking}/health", tmp_path / "mlflow.log", server_env):
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

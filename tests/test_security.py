"""Issue 15 end to end: a real `mlflow server --app-name basic-auth` on 127.0.0.1 refuses anonymous
writes and takes `register` with credentials from the environment; fake secrets planted in every
channel (secret-named env, a variable only `launch.secret_env` names, a URI password in a param, the
run name, a train report) appear nowhere the pipeline writes: its files, the MLflow store (database
and artifacts), the rendered Volcano Job. And `register` records the code version:
$VOXPIPE_GIT_COMMIT (images), else `git rev-parse`.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from servers import mlflow_server
from test_track import write_eval, write_mfu, write_training

from voxpipe.errors import StepError
from voxpipe.launch.pod import job_yaml
from voxpipe.launch.volcano import render_job
from voxpipe.lineage import git_commit
from voxpipe.params import Params
from voxpipe.report import write_report
from voxpipe.secrets import REDACTED, scrub
from voxpipe.steps.model import ModelParams
from voxpipe.track.register import register
from voxpipe.train.init_model import init_model

ADMIN, ADMIN_PASSWORD = "admin", "adm-Pw7731-never-logged"
DECLARED = "vv-Lm44-only-declared"  # env VOICE_VAULT: a name that says nothing; launch.secret_env names it
URI_PASSWORD = "uriPw-K9k5-never-logged"  # in a param's URI
API_KEY = "wk-Tt02-never-logged"  # env WANDB_API_KEY
PARAMS_ONLY = "hf-Jq90-only-in-launch-env"  # launch.env.HF_TOKEN: refused by launch-train, logged by register
# service tokens under neutral names (issue 41): known by their values only (detect-secrets, prefixes)
NEUTRAL = {"MY_SETTING": "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5",
           "OTHER_SETTING": "sk-proj-" + "Ab1xCd2yEf3zGh4wIj5vKl6uMn7tOp8sQr9rSt0q",
           "A_KEY_ID": "AKIA" + "IOSFODNN7EXAMPLE",
           "NOTIFY": "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOp",
           "REPO": "glpat-" + "x1Y2z3W4v5U6t7S8r9Q0", "HUB": "hf_" + "ZqWmXnYbVcUdTeSfRgQhPiOjNkMlA1"}
SECRETS = (ADMIN_PASSWORD, DECLARED, URI_PASSWORD, API_KEY, PARAMS_ONLY, *NEUTRAL.values())
COMMIT = "0123456789abcdef0123456789abcdef01234567"
MODEL = "voxpipe-secure"
AUTH_CONFIG = Path(__file__).resolve().parents[1] / "manifests" / "namespaced" / "mlflow-auth-config.yaml"
MANIFEST_AUTH_DB = "sqlite:////mlflow/basic_auth.db"


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    """MLflow's basic-auth app as manifests/ runs it: the ConfigMap's settings (MLFLOW_AUTH_CONFIG_PATH; the
    user database moved off /mlflow), the admin account and the CSRF key from the environment (there: the
    Secret voxpipe-mlflow)."""
    root = tmp_path_factory.mktemp("mlflow_auth")
    ini = root / "basic_auth.ini"
    shipped = yaml.safe_load(AUTH_CONFIG.read_text())["data"]["basic_auth.ini"]
    assert MANIFEST_AUTH_DB in shipped
    ini.write_text(shipped.replace(MANIFEST_AUTH_DB, f"sqlite:///{root / 'basic_auth.db'}"))
    env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(ini), "MLFLOW_AUTH_ADMIN_USERNAME": ADMIN,
           "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN_PASSWORD, "MLFLOW_FLASK_SERVER_SECRET_KEY": "csrf-test-key"}
    with mlflow_server(root, "--app-name", "basic-auth", env=env) as uri:
        yield uri, root


def _create_experiment(uri: str, auth: tuple[str, str] | None) -> int:
    request = urllib.request.Request(f"{uri}/api/2.0/mlflow/experiments/create", method="POST",
                                     data=json.dumps({"name": f"probe-{time.time_ns()}"}).encode(),
                                     headers={"Content-Type": "application/json"})
    if auth:
        import base64

        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_basic_auth_server_refuses_anonymous_and_wrong_credentials(auth_server):
    uri, _ = auth_server
    assert _create_experiment(uri, None) == 401
    assert _create_experiment(uri, (ADMIN, "not-the-password")) == 401
    assert _create_experiment(uri, (ADMIN, ADMIN_PASSWORD)) == 200


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """A pipeline run's outputs as register reads them; the trainer's report records a param that holds a
    secret value (as one typed into train.out would be)."""
    root = tmp_path_factory.mktemp("secure_run")
    init_model(ModelParams(preset="tiny", out=str(root / "export")))
    train = write_training(root / "train", 1e-4, [2.0, 1.9, 1.8])
    report = json.loads((train / "report.json").read_text())
    report["params"]["out"] = f"runs/{DECLARED}"
    (train / "report.json").write_text(json.dumps(report))
    return root, {"model": str(root / "export"), "train": str(train), "ingest": None,
                  "eval": str(write_eval(root / "eval", 1.9, 2.0)), "mfu": str(write_mfu(root / "mfu", 0.01)),
                  "out": str(root / "register")}


def secure_params(files: dict, uri: str | None, work: Path, **launch_env: str) -> Params:
    return Params.model_validate({
        "ingest": {"input": [f"s3://reader:{URI_PASSWORD}@voice-bucket/takes"]},
        "register": {**files, "model_name": MODEL,
                     "run_name": f"ft-{ADMIN_PASSWORD}-{DECLARED}-{URI_PASSWORD}-{API_KEY}"},
        "tracking": {"uri": uri, "work": str(work), "experiment": "secure"},
        "launch": {"secret_env": {"VOICE_VAULT": "voice-vault/value", "WANDB_API_KEY": "wandb/key",
                                  "MLFLOW_TRACKING_USERNAME": "voxpipe-mlflow/username",
                                  "MLFLOW_TRACKING_PASSWORD": "voxpipe-mlflow/password",
                                  "VOXPIPE_CHECKPOINT_KEY": "voxpipe-checkpoint/key"},
                   "env": {"MLFLOW_TRACKING_URI": "http://mlflow:5000", **launch_env}},
    })


@pytest.fixture
def pipeline_env(monkeypatch):
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_TRACKING_TOKEN", "VOXPIPE_REDACT_ENV"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VOICE_VAULT", DECLARED)
    monkeypatch.setenv("WANDB_API_KEY", API_KEY)
    monkeypatch.setenv("VOXPIPE_GIT_COMMIT", COMMIT)
    return monkeypatch


def test_register_without_credentials_is_refused(auth_server, outputs, pipeline_env, tmp_path):
    uri, _ = auth_server
    pipeline_env.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    pipeline_env.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    _, files = outputs
    params = secure_params({**files, "out": str(tmp_path / "out")}, uri, tmp_path / "work")
    with pytest.raises(StepError, match=r"MLflow at http://127\.0\.0\.1:\d+: .*(401|not authenticated)"):
        register(params)


def test_register_with_env_credentials_leaks_no_secret_anywhere(auth_server, outputs, pipeline_env):
    uri, server_root = auth_server
    root, files = outputs
    pipeline_env.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
    pipeline_env.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
    # the password in the tracking URI too (requests sends a URI's user info, ahead of MLflow's env pair)
    pipeline_env.setenv("MLFLOW_TRACKING_URI", uri.replace("//", f"//{ADMIN}:{ADMIN_PASSWORD}@"))
    register(secure_params(files, None, root / "work", HF_TOKEN=PARAMS_ONLY, **NEUTRAL))
    registered = json.loads((root / "register" / "registered.json").read_text())
    assert registered["tracking_uri"] == uri.replace("//", f"//{ADMIN}:{REDACTED}@")

    client = MlflowClient(uri)  # reads with the env credentials
    run = client.get_run(registered["run_id"])
    assert run.info.run_name.startswith(f"ft-{REDACTED}-{REDACTED}")
    assert run.data.params["ingest.input"] == f'["s3://reader:{REDACTED}@voice-bucket/takes"]'
    assert run.data.params["train.out"] == f"runs/{REDACTED}"
    assert run.data.params["launch.env.HF_TOKEN"] == REDACTED
    assert {run.data.params[f"launch.env.{name}"] for name in NEUTRAL} == {REDACTED}
    # ordinary keys keep their values, whatever their names say
    assert run.data.params["train.max_tokens"] == "4096"
    token_ids = {k: v for k, v in run.data.params.items() if k.endswith("_token_id")}
    assert token_ids and REDACTED not in "".join(token_ids.values())
    # the image's commit
    assert run.data.tags["mlflow.source.git.commit"] == COMMIT
    assert run.data.tags["voxpipe.git_dirty"] == "false"

    job = job_yaml(render_job(secure_params(files, uri, Path("work")), "ml"))  # work: on the volume
    assert "secretKeyRef:\n" in job and "name: voice-vault" in job
    written = [f for folder in (root / "register", root / "work") for f in folder.rglob("*") if f.is_file()]
    store = [f for f in server_root.rglob("*") if f.is_file() and f.suffix != ".log"]
    assert any(f.name == "mlflow.db" for f in store) and any("report.json" == f.name for f in store)
    texts = {str(f): f.read_bytes() for f in written + store} | {"Volcano job": job.encode()}
    leaks = {where: s for where, text in texts.items() for s in SECRETS if s.encode() in text}
    assert leaks == {}
    assert f"runs/{DECLARED}".encode() in (root / "train" / "report.json").read_bytes()  # the check can fail


def test_redaction_is_by_value_not_by_key(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_AUTH", "hf-Ab12-secret")
    monkeypatch.setenv("MAX_TOKENS", "4096")  # not a secret name: TOKEN is not a whole word here
    monkeypatch.setenv("SOME_FLAG_TOKEN", "true")  # too short to be a secret: "true" stays everywhere
    monkeypatch.setenv("VOXPIPE_REDACT_ENV", "SPEAKER_DB")
    monkeypatch.setenv("SPEAKER_DB", "db-Cc33-declared")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://u:envuri-pw-55@mlflow.example")
    text = "a hf-Ab12-secret b db-Cc33-declared c envuri-pw-55 d 4096 true postgresql://x:pw@db/e"
    assert scrub(text) == "a *** b *** c *** d 4096 true postgresql://x:***@db/e"
    write_report(tmp_path, {"note": "token hf-Ab12-secret", "max_tokens": 4096})
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["note"] == "token ***" and report["max_tokens"] == 4096


def test_git_commit_from_the_image_env_else_git(tmp_path, monkeypatch):
    monkeypatch.setenv("VOXPIPE_GIT_COMMIT", COMMIT)
    assert git_commit(tmp_path) == (COMMIT, False)
    monkeypatch.setenv("VOXPIPE_GIT_COMMIT", "unknown")  # an image built without the build-arg
    assert git_commit(tmp_path) == (None, False)  # no repository, no image commit: nothing claimed
    monkeypatch.delenv("VOXPIPE_GIT_COMMIT")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@e"}
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    records = [tmp_path / "dvc.lock", tmp_path / "work" / "eval" / "eval.json"]
    for path in [tmp_path / "f", *records]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    subprocess.run(["git", "commit", "-qm", "x"], cwd=tmp_path, check=True, env=env)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout
    assert git_commit(tmp_path) == (head.strip(), False)
    for path in records:  # what `make demo` rewrites: the pipeline's own records, not the code that ran
        path.write_text("a new run's figures")
    assert git_commit(tmp_path / "work") == (head.strip(), False)
    (tmp_path / "f").write_text("changed")
    assert git_commit(tmp_path) == (head.strip(), True)


def test_pipeline_steps_refuse_workspace_paths_that_escape(tmp_path):
    """The KFP tasks that take a workspace path from the user check it as launch-train does."""
    from types import SimpleNamespace

    from components import steps

    artifact = SimpleNamespace(uri="gs://bucket/artifact", path=str(tmp_path / "artifact"), metadata={})
    with pytest.raises(StepError, match=r"base_model='\.\./\.\./etc/escape' resolves to .* outside the"):
        steps.init_model.python_func(workspace=str(tmp_path / "ws"), params={}, base_model="../../etc/escape",
                                     model=artifact)
    with pytest.raises(StepError, match=r"ingest.input='/etc' resolves to /etc, outside the workspace"):
        steps.ingest_plan.python_func(workspace=str(tmp_path / "ws"), data_version="x",
                                      params={"input": ["data/ok", "/etc"]}, plan=artifact)


def test_the_last_gate_before_mlflow_scrubs_params_and_tags_by_value(tmp_path):
    """record.log_params / log_tags scrub by value shape even when a caller passes a raw value (issue 41):
    a real sqlite store holds *** where the token was."""
    from voxpipe.track.record import log_params, log_tags
    from voxpipe.track.tracking import session

    token = NEUTRAL["MY_SETTING"]
    with session(f"sqlite:///{tmp_path / 'mlflow.db'}") as client:
        run = client.create_run(client.create_experiment("gate", artifact_location=str(tmp_path / "a")))
        log_params(client, run.info.run_id, {"my.setting": f"x {token}", "train.lr": "0.0001"})
        log_tags(client, run.info.run_id, {"note": token})
        data = client.get_run(run.info.run_id).data
    assert data.params == {"my.setting": f"x {REDACTED}", "train.lr": "0.0001"}
    assert data.tags["note"] == REDACTED

"""Issue 22: secrets recognised by the shape of their variable's name (PGPASSWORD, MYSQL_PWD, SENTRY_DSN,
...), query tokens in URIs, log records scrubbed; and native crashes that leave a trace (faulthandler,
numba's cache in a per-user folder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from servers import free_port

from voxpipe.errors import StepError
from voxpipe.launch.volcano import job_yaml, render_job
from voxpipe.params import Params
from voxpipe.secrets import REDACTED, is_secret_name, scrub, uri_passwords
from voxpipe.track.tracking import redact_params, resolve_tracking_uri, run_secrets

PG, MYSQL = "pg-Aa11-never-logged", "my-Bb22-never-logged"
SENTRY_KEY = "5f1e2d3c4b5a69788796a5b4c3d2e1f0"
SENTRY = f"https://{SENTRY_KEY}@o12345.ingest.sentry.io/678"
TOKEN = "tok-Cc33-never-logged"
VOXPIPE = str(Path(sys.executable).with_name("voxpipe"))


@pytest.fixture
def shaped(monkeypatch):
    monkeypatch.setenv("PGPASSWORD", PG)
    monkeypatch.setenv("MYSQL_PWD", MYSQL)
    monkeypatch.setenv("SENTRY_DSN", SENTRY)
    return monkeypatch


def test_names_by_shape():
    secret = ["PGPASSWORD", "MYSQL_PWD", "SENTRY_DSN", "DATABASE_DSN", "GITHUB_TOKEN", "HF_TOKEN",
              "AWS_SECRET_ACCESS_KEY", "GOOGLE_APPLICATION_CREDENTIALS", "WANDB_API_KEY", "REDIS_PASSWD",
              "MY_APIKEY", "TOKEN"]
    ordinary = ["MAX_TOKENS", "TOKENIZERS_PARALLELISM", "PWD", "OLDPWD", "KEYBOARD", "HOME", "PATH",
                "MLFLOW_TRACKING_USERNAME", "PASSENGER"]
    assert [n for n in secret if not is_secret_name(n)] == []
    assert [n for n in ordinary if is_secret_name(n)] == []


def test_shaped_secrets_and_a_password_in_the_run_name_are_redacted(shaped):
    text = f"run ft-{PG}-{MYSQL} sentry {SENTRY} uri http://h:5000/?token={TOKEN}&x=1 postgres://u:{PG}@db/x"
    clean = scrub(text)
    assert all(s not in clean for s in (PG, MYSQL, SENTRY_KEY, TOKEN)), clean
    assert "?token=***&x=1" in clean and "postgres://u:***@db/x" in clean
    assert TOKEN in uri_passwords(f"https://mlflow.example/?token={TOKEN}")
    params = Params.model_validate({"register": {"run_name": f"ft-{PG}"}, "train": {"out": f"runs/{MYSQL}"},
                                    "launch": {"secret_env": {}}})
    logged = redact_params(params.flat(), run_secrets(params))
    assert logged["register.run_name"] == f"ft-{REDACTED}" and logged["train.out"] == f"runs/{REDACTED}"
    # the rendered Job refuses to carry them (a param holding the launcher's secret value)
    with pytest.raises(StepError, match="secret value in VOXPIPE_PARAMS"):
        render_job(Params.model_validate({"train": {"out": f"runs/{PG}"}}), "ml")
    assert PG not in job_yaml(render_job(Params(), "ml"))


@pytest.mark.parametrize("name", ["PGPASSWORD", "MYSQL_PWD", "SENTRY_DSN"])
def test_launch_env_refuses_secret_shaped_names_and_points_to_secret_env(name):
    with pytest.raises(StepError, match=rf"launch.env.{name} holds a secret.*launch.secret_env.{name}="):
        render_job(Params.model_validate({"launch": {"env": {name: "some-value-123"}}}), "ml")


def test_a_token_in_the_tracking_uri_is_refused_and_never_printed(tmp_path):
    with pytest.raises(StepError) as err:
        resolve_tracking_uri(f"https://mlflow.example/?token={TOKEN}", tmp_path)
    assert TOKEN not in str(err.value) and "MLFLOW_TRACKING_TOKEN" in str(err.value)
    # from the environment (where MLflow itself reads it): retries and the final error print no token
    port = free_port()  # nothing listens: every request fails and is retried
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}/?token={TOKEN}",
           "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "0",
           "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    command = [VOXPIPE, "compare", "--out", str(tmp_path / "c"), "--tracking-work", str(tmp_path)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 1 and "voxpipe compare: error:" in output
    assert TOKEN not in output and "token=***" in output


def test_the_cli_enables_faulthandler_and_a_per_user_numba_cache(tmp_path):
    code = ("import json, faulthandler, os; from voxpipe.cli import main; main(['params']); import numba; "
            "print(json.dumps([faulthandler.is_enabled(), os.environ['NUMBA_CACHE_DIR'], "
            "numba.config.CACHE_DIR]))")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"} | {"XDG_CACHE_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=tmp_path).stdout.splitlines()[-1]
    cache = str(tmp_path / "voxpipe" / "numba")
    assert json.loads(out) == [True, cache, cache]
    mine = {**env, "NUMBA_CACHE_DIR": str(tmp_path / "mine")}  # the user's own choice is kept
    out = subprocess.run([sys.executable, "-c", code], env=mine, capture_output=True, text=True, check=True,
                         cwd=tmp_path).stdout.splitlines()[-1]
    assert json.loads(out)[1:] == [str(tmp_path / "mine")] * 2


def test_a_native_crash_leaves_a_python_stack(tmp_path):
    code = ("from voxpipe.cli import native_crash_safety; native_crash_safety()\n"
            "import ctypes\n"
            "def deep_in_native_code():\n    ctypes.string_at(0)\n"
            "deep_in_native_code()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "Fatal Python error: Segmentation fault" in done.stderr and "deep_in_native_code" in done.stderr

"""Issue 22: secrets recognised by the shape of their variable's name (PGPASSWORD, MYSQL_PWD, SENTRY_DSN,
...), query tokens in URIs, log records scrubbed; and native crashes that leave a trace (faulthandler,
numba's cache in a per-user folder)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from servers import free_port

from voxpipe.errors import StepError
from voxpipe.launch.pod import job_yaml
from voxpipe.launch.volcano import render_job
from voxpipe.params import Params
from voxpipe.secrets import REDACTED, ScrubFilter, allowing, is_secret_name, scrub, uri_passwords, value_shape
from voxpipe.track.tracking import not_secret_values, redact_params, resolve_tracking_uri, run_secrets

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


# -- issue 34: secrets by the shape of the value, whatever the key is called ---------------------------------
AZURE_KEY = "q3ZkV9x2LmN8pR4tW6yB1cD5fG7hJ0kM2nP4rS6uV8wX0zA3bC5dE7fH9jK1mN3pQ5sT7vW9yZ1aB3cD5eF7gH9jK1mA=="
AZURE = (f"DefaultEndpointsProtocol=https;AccountName=voxpipedata;AccountKey={AZURE_KEY};"
         "EndpointSuffix=core.windows.net")
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJ2b3hwaXBlIiwiaWF0IjoxNzAwMDAwMDAwfQ."
       "n0tAR3alS1gnatur3-but_shaped_like0ne")
SAS = ("BlobEndpoint=https://voxpipedata.blob.core.windows.net/;SharedAccessSignature=sv=2022-11-02&ss=b&sp=rl"
       "&se=2027-01-01&sig=AbCdEf0123456789ghIjKlmN%2Bop%3D")
PEM = ("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\n"
       "-----END PRIVATE KEY-----\n")
DB = "Server=db.internal;Database=voices;User Id=voxpipe;Password=Pg9-never-logged;"
OPAQUE = "xK9mQ2vL7pR4tW8yB3nZ6cF1hJ5gD0sA"  # a random-looking token with no prefix at all
SHAPED = {"azure": (AZURE, AZURE_KEY), "jwt": (JWT, JWT), "sas": (SAS, "sig=AbCdEf0123456789ghIjKlmN"),
          "pem": (PEM, "MIIEvQIBADANBgkqhkiG9w0BAQEF"), "db": (DB, "Pg9-never-logged"),
          "token": (OPAQUE, OPAQUE)}


@pytest.mark.parametrize("kind", sorted(SHAPED))
def test_launch_env_refuses_secret_shaped_values_under_plain_names(kind):
    """Done-when of issue 34: an Azure connection string and a JWT under plain names are refused (and the
    other shapes with them), in one paragraph that names the key and the ways out, never the value."""
    value, secret = SHAPED[kind]
    with pytest.raises(StepError) as err:
        render_job(Params.model_validate({"launch": {"env": {"STORAGE": value}}}), "ml")
    message = str(err.value)
    assert "\n" not in message and message.startswith("launch.env.STORAGE holds a secret by the shape of its")
    assert "launch.secret_env.STORAGE=<secret-name>/<key>" in message and "launch.env_not_secret" in message
    assert secret not in message
    assert scrub(message) == message  # the CLI prints it scrubbed: naming the shapes is not one of them


@pytest.mark.parametrize("kind", sorted(SHAPED))
def test_secret_shaped_values_are_redacted_from_params_and_logs_whatever_the_key(kind, caplog):
    value, secret = SHAPED[kind]
    params = Params.model_validate({"register": {"run_name": f"ft {value}"},
                                    "launch": {"env": {"STORAGE": value}}})
    logged = redact_params(params.flat(), run_secrets(params))
    assert secret not in logged["register.run_name"] and REDACTED in logged["register.run_name"]
    assert secret not in logged["launch.env.STORAGE"]
    logger = logging.getLogger("voxpipe.test.shapes")
    logger.addFilter(ScrubFilter())
    with caplog.at_level(logging.INFO, logger="voxpipe.test.shapes"):
        logger.info("connecting with %s", value)
    assert secret not in caplog.text and REDACTED in caplog.text


def test_a_short_password_is_redacted_where_it_stands_not_all_over_the_text():
    text = "Server=db;Password=abc;Database=x; abc, a, b"
    assert scrub(text) == "Server=db;Password=***;Database=x; abc, a, b"
    assert scrub("Password=, Pwd=)") == "Password=, Pwd=)"  # no value: nothing to hide


def test_ordinary_values_keep_their_shape():
    ordinary = ["data/sample/wavs/SpkF0001/Take2/clip_0001.wav", "HuggingFaceTB/SmolLM2-135M-Instruct",
                "9f1e2d3c4b5a69788796a5b4c3d2e1f09f1e2d3c4b5a69788796a5b4c3d2e1f0",  # a sha256
                "3f2a6c1e-9b7d-4e2f-8a1c-5d6e7f8a9b0c", "voxpipe-voxcpm2-fresh-2026-12-02T03-00-00Z",
                "openbmb/VoxCPM2/checkpoints/step-1000/model.safetensors", "ThisIsALongCamelCaseIdentifier2",
                "/work/hC/.venv/lib/python3.11/site-packages/torch/FileSystemWriter.py",
                "train.max_tokens=4096"]
    assert [v for v in ordinary if value_shape(v) or scrub(v) != v] == []


def test_a_value_that_only_looks_like_a_secret_is_let_through_when_listed():
    """The allow path: launch.env_not_secret names the entries whose values look like secrets but are not;
    the rendered Job carries them, and register's MLflow params keep them. A name that launch.env does not
    set is an error; a secret-shaped name or a URI password is refused all the same."""
    cert = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUPublicCertificate0\n-----END CERTIFICATE-----"
    launch = {"env": {"BUILD_ID": OPAQUE, "CA_CERT": cert}, "env_not_secret": ["BUILD_ID", "CA_CERT"]}
    params = Params.model_validate({"launch": launch})
    rendered = job_yaml(render_job(params, "ml"))
    assert OPAQUE in rendered and "PublicCertificate0" in rendered
    with allowing(not_secret_values(params)):
        logged = redact_params(params.flat(), run_secrets(params))
    assert OPAQUE in logged["launch.env.BUILD_ID"] and "PublicCertificate0" in logged["launch.env.CA_CERT"]
    assert OPAQUE not in redact_params(params.flat(), run_secrets(params))["launch.env.BUILD_ID"]  # without

    with pytest.raises(StepError, match=r"^launch.env_not_secret names CA_BUNDLE, which launch.env does not"):
        render_job(Params.model_validate({"launch": {"env": {"X": "1"}, "env_not_secret": ["CA_BUNDLE"]}}),
                   "ml")
    with pytest.raises(StepError, match="launch.env.API_TOKEN holds a secret .its name says so"):
        render_job(Params.model_validate({"launch": {"env": {"API_TOKEN": OPAQUE},
                                                     "env_not_secret": ["API_TOKEN"]}}), "ml")


def test_a_secret_shaped_param_is_refused_in_the_rendered_job():
    with pytest.raises(StepError) as err:
        render_job(Params.model_validate({"train": {"out": f"runs/{JWT}"}}), "ml")
    message = str(err.value)
    assert "\n" not in message
    assert "secret in VOXPIPE_PARAMS by the shape of a value (a JSON Web Token" in message
    assert JWT not in message


# -- issue 41 part 5: service tokens under neutral names, by detect-secrets' detectors and known prefixes ----
TOKENS = {  # fake values of each kind; what must not survive a render, a params record or a log line
    "github": "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5",
    "github fine-grained": "github_pat_11ABCDEFG0" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5bC7dE9fG1h",
    "openai legacy": "sk-" + "aB3dE5fG7hJ9kL1mN3pQ" + "T3BlbkFJ" + "rS7tU9vW1xY3zA5bC7dE",
    "openai project": "sk-proj-" + "Ab1xCd2yEf3zGh4wIj5vKl6uMn7tOp8sQr9rSt0q",
    "hugging face": "hf_" + "ZqWmXnYbVcUdTeSfRgQhPiOjNkMlA1",
    "aws access key id": "AKIA" + "IOSFODNN7EXAMPLE",
    "slack bot": "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    "slack webhook": "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
    "gitlab": "glpat-" + "x1Y2z3W4v5U6t7S8r9Q0",
    "stripe live": "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc",
    "npm": "npm_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "google api key": "AIza" + "SyD3x9Kq2LmN4oP5rS6tU7vW8xY9zA0bC1d",
    "azure ad client secret": "abc8Q~" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3z",
    "twilio": "SK" + "0123456789abcdef0123456789abcdef",
    "sendgrid": "SG." + "aB3dE5fG7hJ9kL1mN3pQ5r" + "." + "S7tU9vW1xY3zA5bC7dE9fG1hJ3kL5mN7pQ9rS1tU3vW",
    "private key block": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n"
                         "-----END OPENSSH PRIVATE KEY-----",
    "base64url random": "Xk3_9fJq-Lw2Zp8Rt5Vb7Nc4Md1Hg6Yj0Es",
    "base36 random": "k7x2m9qz4w8r1t6y3p0v5n2b8c4j7h9g1f3d",
}


def _secret_part(kind: str) -> str:
    """The part that must disappear (a PEM block's body, a webhook's token)."""
    return {"private key block": "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ",
            "slack webhook": "XXXXXXXXXXXXXXXXXXXXXXXX"}.get(kind, TOKENS[kind])


@pytest.mark.parametrize("kind", sorted(TOKENS))
def test_service_tokens_under_neutral_names_are_refused_in_launch_env(kind):
    with pytest.raises(StepError) as err:
        render_job(Params.model_validate({"launch": {"env": {"MY_SETTING": TOKENS[kind]}}}), "ml")
    message = str(err.value)
    assert "\n" not in message and message.startswith("launch.env.MY_SETTING holds a secret by the shape")
    assert "launch.secret_env.MY_SETTING=<secret-name>/<key>" in message and _secret_part(kind) not in message


@pytest.mark.parametrize("kind", sorted(TOKENS))
def test_service_tokens_are_refused_in_the_rendered_job_and_scrubbed_from_params_tags_and_logs(kind, caplog):
    token = TOKENS[kind]
    with pytest.raises(StepError, match="would carry a secret in VOXPIPE_PARAMS by the shape of a value"):
        render_job(Params.model_validate({"train": {"out": f"runs/x {token}"}}), "ml")
    params = Params.model_validate({"register": {"run_name": f"ft {token}"}, "launch": {"env": {"A": token}}})
    logged = redact_params(params.flat(), run_secrets(params))
    assert _secret_part(kind) not in logged["register.run_name"] and REDACTED in logged["register.run_name"]
    assert _secret_part(kind) not in logged["launch.env.A"]
    assert _secret_part(kind) not in scrub(json.dumps({"report": token}))  # a report, a tag
    logger = logging.getLogger("voxpipe.test.tokens")
    logger.addFilter(ScrubFilter())
    with caplog.at_level(logging.INFO, logger="voxpipe.test.tokens"):
        logger.info("calling with %s", token)
    assert _secret_part(kind) not in caplog.text


def test_digests_run_ids_and_the_projects_own_params_are_not_secrets():
    """The trap of entropy detectors: hex digests (md5, sha1, sha256, MLflow run ids), UUIDs and every value
    of the shipped params, recipes and DVC lock keep their shape."""
    import hashlib
    import uuid

    from voxpipe.params import load_params

    root = Path(__file__).parent.parent
    values = [hashlib.md5(b"x").hexdigest(), hashlib.sha1(b"x").hexdigest(), hashlib.sha256(b"x").hexdigest(),
              uuid.uuid4().hex, str(uuid.uuid4()), "b6f0e1a9c3d24f7e8a1b2c3d4e5f6a7b",
              f"md5:{hashlib.md5(b'y').hexdigest()}.dir", f"sha256:{hashlib.sha256(b'y').hexdigest()}",
              "voxpipe-sample · full · 40 steps · lr 0.0001", "runs/ft-001/checkpoints/step-000400"]
    values += [str(v) for v in load_params(root / "params.yaml").flat().values()]
    for path in [root / "dvc.lock", *sorted((root / "recipes").glob("*.yaml"))]:
        values += path.read_text().splitlines()
    assert [v for v in values if value_shape(v) or scrub(v) != v] == []


def test_a_token_shape_inside_a_longer_base64_run_is_not_a_token(tmp_path):
    """A real RNG state (the one a checkpoint saves) whose base64 holds `ACCA` + 16 upper-case characters,
    AWS's key-id shape: detect-secrets' pattern has no word boundary, and scrubbing it made the state 15
    bytes short, so every resume of such a checkpoint failed. The blob is left as it is; the same run alone
    is still a key."""
    import base64

    import torch

    from voxpipe.train.checkpoint import rng_state, set_rng_state

    torch.manual_seed(249)
    torch.rand(249 * 7)
    state = rng_state(torch.device("cpu"))
    blob = base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()
    assert "ACCAAAAAQAAAO8BAAAAA" in blob
    assert scrub(blob) == blob
    assert scrub("key ACCAAAAAQAAAO8BAAAAA") == f"key {REDACTED}"
    written = tmp_path / "state.json"
    written.write_text(scrub(json.dumps({"rng": state})))
    set_rng_state(json.loads(written.read_text())["rng"], torch.device("cpu"))  # loads: nothing was cut

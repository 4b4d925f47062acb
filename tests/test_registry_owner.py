"""Issue 22: a registry a reader cannot take over. A real `mlflow server --app-name basic-auth` with the
shipped ConfigMap's settings (`default_permission = READ`), the pipeline as its admin account and a
reader account, which tries each attack of the issue: pre-creating the model or the experiment,
squatting the old lock name, taking or holding the register lock, editing what registry-init made.
"""

from __future__ import annotations

import json
import logging

import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.server.auth.client import AuthServiceClient
from test_security import ADMIN, ADMIN_PASSWORD, auth_server  # noqa: F401  (the fixture)
from test_track import write_eval, write_mfu, write_training

from voxpipe.cli import main
from voxpipe.errors import StepError
from voxpipe.params import Params
from voxpipe.steps.model import ModelParams
from voxpipe.steps.tracking import TrackingParams
from voxpipe.steps.train import TrainParams
from voxpipe.track.live import LiveRun
from voxpipe.track.register import register
from voxpipe.track.registry_init import registry_init
from voxpipe.track.reglock import LOCK_TAG, _log_once, lock_runs, register_lock
from voxpipe.train.init_model import init_model

READER, READER_PASSWORD = "reader", "rdr-Pw5512-not-admin"
PIPE, PIPE_PASSWORD = "pipe", "pipe-Pw8812-not-admin"


@pytest.fixture(scope="module")
def users(auth_server):  # noqa: F811
    uri, _ = auth_server
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
        mp.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
        auth = AuthServiceClient(uri)
        auth.create_user(READER, READER_PASSWORD)
        auth.create_user(PIPE, PIPE_PASSWORD)
    return uri


@pytest.fixture
def as_user(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)

    def switch(user: str, password: str) -> None:
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    return switch


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("owned_run")
    init_model(ModelParams(preset="tiny", out=str(root / "export")))
    train = write_training(root / "train", 1e-4, [2.0, 1.9, 1.8])
    return {"model": str(root / "export"), "train": str(train),
            "ingest": None, "eval": str(write_eval(root / "eval", 1.9, 2.0)),
            "mfu": str(write_mfu(root / "mfu", 0.01))}


def params(uri, files, tmp_path, model, experiment, **register_keys) -> Params:
    return Params.model_validate({
        "register": {**files, "out": str(tmp_path / "register"), "model_name": model, **register_keys},
        "tracking": {"uri": uri, "work": str(tmp_path / "work"), "experiment": experiment},
        "launch": {"secret_env": {}},
    })


def test_a_reader_who_created_the_model_first_is_refused_by_name(users, files, as_user, tmp_path):
    uri = users
    as_user(READER, READER_PASSWORD)
    MlflowClient(uri, registry_uri=uri).create_registered_model("voxpipe-fresh")
    as_user(ADMIN, ADMIN_PASSWORD)
    with pytest.raises(StepError, match=r"registered model 'voxpipe-fresh' on MLflow at "
                       r"http://127\.0\.0\.1:\d+ is owned by 'reader', not by the pipeline's account "
                       r"'admin'.*Choose another name"):
        register(params(uri, files, tmp_path, "voxpipe-fresh", "fresh-exp"))
    assert MlflowClient(uri).search_model_versions("name = 'voxpipe-fresh'") == []  # nothing registered
    with pytest.raises(StepError, match="owned by 'reader'"):  # registry-init does not take it over either
        registry_init(params(uri, files, tmp_path, "voxpipe-fresh", "fresh-exp"))


def test_a_reader_who_created_the_experiment_first_is_refused_by_name(users, files, as_user, tmp_path):
    uri = users
    as_user(READER, READER_PASSWORD)
    experiment = MlflowClient(uri).create_experiment("voxpipe-taken")
    as_user(ADMIN, ADMIN_PASSWORD)
    with pytest.raises(StepError, match=rf"experiment 'voxpipe-taken' \(id {experiment}\) .* by 'reader'"):
        register(params(uri, files, tmp_path, "voxpipe-model-x", "voxpipe-taken"))
    assert MlflowClient(uri).search_runs([experiment]) == []  # no run logged into the reader's experiment


def test_live_training_refuses_an_experiment_a_reader_created(users, as_user, tmp_path):
    """Issue 34: train's live run (`train.track`) checks the experiment's owner as register does, before it
    creates a run there."""
    uri = users
    as_user(READER, READER_PASSWORD)
    experiment = MlflowClient(uri).create_experiment("voxpipe-live-taken")
    as_user(ADMIN, ADMIN_PASSWORD)
    tracking = TrackingParams(uri=uri, work=str(tmp_path / "work"), experiment="voxpipe-live-taken")
    with pytest.raises(StepError) as err:
        LiveRun(tracking, TrainParams(out=str(tmp_path / "train")), tmp_path / "train", 0)
    message = str(err.value)
    assert "\n" not in message and f"experiment 'voxpipe-live-taken' (id {experiment})" in message
    assert "owned by 'reader'" in message and "registry-init" in message
    assert MlflowClient(uri).search_runs([experiment]) == []  # no run logged into the reader's experiment
    as_user(PIPE, PIPE_PASSWORD)  # a non-admin account cannot verify: refused, naming train's live run
    with pytest.raises(StepError, match=r"no admin .*train's live run \(train.track\) cannot verify"):
        LiveRun(tracking, TrainParams(out=str(tmp_path / "train")), tmp_path / "train", 0)


def test_registry_init_then_the_reader_can_change_nothing(users, files, as_user, tmp_path, capsys):
    uri = users
    model, experiment = "voxpipe-owned", "voxpipe-owned-exp"
    as_user(READER, READER_PASSWORD)
    reader = MlflowClient(uri, registry_uri=uri)
    reader.create_registered_model(f"{model}.register-lock")  # the old lock's name: harmless to squat now
    as_user(ADMIN, ADMIN_PASSWORD)
    assert main(["registry-init", "--model-name", model, "--tracking-uri", uri,
                 "--tracking-experiment", experiment, "--tracking-work", str(tmp_path / "w")]) == 0
    assert "owned by 'admin', others READ" in capsys.readouterr().out
    first = register(params(uri, files, tmp_path, model, experiment)).registered
    assert first["aliases"] == ["candidate", "champion"]
    experiment_id = first["experiment_id"]
    locks_id = MlflowClient(uri).get_experiment_by_name(f"{experiment}-register-locks").experiment_id
    (lock,) = MlflowClient(uri).search_runs([locks_id], filter_string=f"tags.`{LOCK_TAG}` = '{model}'")

    as_user(READER, READER_PASSWORD)
    attacks = {
        "delete @champion": lambda: reader.delete_registered_model_alias(model, "champion"),
        "move @champion": lambda: reader.set_registered_model_alias(model, "champion", first["version"]),
        "delete the model": lambda: reader.delete_registered_model(model),
        "tag the model": lambda: reader.set_registered_model_tag(model, "k", "v"),
        "add a run": lambda: reader.create_run(experiment_id),
        "take the lock": lambda: reader.log_param(lock.info.run_id, "lock.99", "reader"),
        "end the lock run": lambda: reader.delete_run(lock.info.run_id),
    }
    for what, attack in attacks.items():
        with pytest.raises(MlflowException) as refused:
            attack()
        assert refused.value.error_code == "PERMISSION_DENIED", what
    with pytest.raises(StepError, match=r"refused to take the register lock .*403 permission denied"):
        with register_lock(reader, uri, locks_id, model, timeout_s=5):
            pass  # a 403 is an error, not a wait

    as_user(ADMIN, ADMIN_PASSWORD)
    again = register(params(uri, files, tmp_path / "again", model, experiment)).registered  # not held up
    assert again["version"] == first["version"] and not again["created"]


def test_others_granted_edit_are_refused_until_registry_init_lowers_them(users, files, as_user, tmp_path):
    uri = users
    model, experiment = "voxpipe-shared", "voxpipe-shared-exp"
    as_user(ADMIN, ADMIN_PASSWORD)
    registry_init(params(uri, files, tmp_path, model, experiment))
    AuthServiceClient(uri).grant_user_permission(READER, "registered_model", model, "EDIT")
    with pytest.raises(StepError, match=r"can be edited by others than the pipeline's account 'admin': "
                       r"'reader' \(EDIT\)\. Run `voxpipe registry-init`"):
        register(params(uri, files, tmp_path, model, experiment))
    lowered = registry_init(params(uri, files, tmp_path, model, experiment))
    locks = MlflowClient(uri).get_experiment_by_name("voxpipe-shared-exp-register-locks").experiment_id
    assert lowered.lowered == {f"experiment 'voxpipe-shared-exp' (id {lowered.experiment_id})": [],
                               "registered model 'voxpipe-shared'": ["reader"],
                               f"experiment 'voxpipe-shared-exp-register-locks' (id {locks})": []}
    assert AuthServiceClient(uri).get_user_permission(READER, "registered_model", model).permission == "READ"
    assert register(params(uri, files, tmp_path, model, experiment)).registered["created"]


def test_a_non_admin_pipeline_account_cannot_verify_and_is_told_so(users, files, as_user, tmp_path):
    uri = users
    as_user(PIPE, PIPE_PASSWORD)
    with pytest.raises(StepError, match=r"account 'pipe' is no admin .* Make 'pipe' an MLflow admin"):
        register(params(uri, files, tmp_path, "voxpipe-pipe", "voxpipe-pipe-exp"))


def test_a_held_lock_is_a_bounded_logged_wait(users, as_user, caplog):
    uri = users
    as_user(ADMIN, ADMIN_PASSWORD)
    client = MlflowClient(uri)
    experiment = client.create_experiment("voxpipe-lock-exp")
    (run_id,) = lock_runs(client, experiment, "voxpipe-lock")
    assert _log_once(client, run_id, "lock.0", "another register", uri, "take it")
    with caplog.at_level(logging.INFO, logger="voxpipe"), pytest.raises(
            StepError, match=r"held by another register and did not come free in 2 s \(register.lock_timeo"):
        with register_lock(client, uri, experiment, "voxpipe-lock", timeout_s=2.0):
            pass
    assert "waiting for the register lock of 'voxpipe-lock', held by another register" in caplog.text
    assert json.dumps(client.get_run(run_id).data.params) == json.dumps({"lock.0": "another register"})

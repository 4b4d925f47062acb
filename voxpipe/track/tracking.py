"""Where runs go, which MLflow run a pipeline run is, and keeping secrets out of everything logged.

Tracking URI: the step's `tracking_uri` param, else $MLFLOW_TRACKING_URI, else an embedded sqlite
database `<work>/mlflow.db` with artifacts in `<work>/mlruns` (the model registry needs a database
store; no server needed). Credentials come only from the environment, where MLflow itself reads
them (MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN); a password inside a
`tracking_uri` param is refused, and every value voxpipe logs passes through `scrub`.

One pipeline run = one MLflow run. Its identity is the pipeline key: a digest of what the run
records (params incl. the data version, export, training, eval and MFU reports, KFP run id), so a
run never mixes results of different executions. The run is found, in order, through
$MLFLOW_RUN_ID (an orchestrator that made the run itself), the trainer's live run (`train.track`:
its id is the train report's `mlflow_run_id`; taken when this store holds it in this experiment and
no other pipeline key has claimed it, so a run id from another store or a second evaluation of the
same training falls through), `<work>/mlflow_run.json` (the last run this work folder logged to), or
the `voxpipe.pipeline_key` tag in the experiment; else it is created. The run found is tagged with
the key and `<work>/mlflow_run.json` rewritten. So rerunning `register` on unchanged files logs into
the same run, and any change of data, params or results starts a new one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from voxpipe.errors import StepError
from voxpipe.report import write_json
from voxpipe.secrets import REDACTED, is_secret_name, scrub, secret_values, uri_passwords
from voxpipe.track.sqlite_store import ready_sqlite_store

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from voxpipe.params import Params

RUN_FILE = "mlflow_run.json"
KEY_TAG = "voxpipe.pipeline_key"


# -- secrets (voxpipe/secrets.py: by value) --------------------------------------------------------
def redact_uri(uri: str) -> str:
    """The URI with a password and secret-looking query values replaced; the user name is kept.

    A URI with neither comes back unchanged (re-joining would turn sqlite:////abs into sqlite://abs)."""
    parts = urlsplit(uri)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    if parts.password is None and not any(is_secret_name(k) for k, _ in pairs):
        return uri
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username}:{REDACTED}@{netloc.rpartition('@')[2]}"
    query = urlencode([(k, REDACTED if is_secret_name(k) else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def run_secrets(params: Params, logged: dict[str, Any] | None = None) -> list[str]:
    """The secret values a run's record must not hold: the environment's, those of the variables
    `launch.secret_env` names, secret-named `launch.env` values (launch-train refuses them, but the
    params are logged anyway), and every URI password inside any param (and any `logged` value)."""
    values = [*params.flat().values(), *(logged or {}).values()]
    return secret_values(params.launch.secret_env, [_as_text(v) for v in values], [params.launch.env])


def not_secret_values(params: Params) -> list[str]:
    """The launch.env values `launch.env_not_secret` lets through: look like secrets, are not (`allowing`)."""
    return [params.launch.env[n] for n in params.launch.env_not_secret if n in params.launch.env]


def redact_params(flat: dict[str, Any], values: list[str] | None = None) -> dict[str, str]:
    """Params as MLflow strings with every secret value scrubbed (keys are never judged by name).
    `values`: the secrets to hide (default: the environment's and the URI passwords in `flat`)."""
    texts = {k: _as_text(v) for k, v in flat.items()}
    values = secret_values(texts=texts.values()) if values is None else values
    return {k: scrub(text, values) for k, text in texts.items()}


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


# -- where runs go --------------------------------------------------------------------------------
def resolve_tracking_uri(param: str | None, work: Path) -> str:
    if param:
        if uri_passwords(param):
            raise StepError(
                f"tracking_uri {redact_uri(param)!r} carries a password or a token: put credentials in "
                "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) instead"
            )
        return param
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    work.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{work.resolve() / 'mlflow.db'}"


def local_artifact_root(tracking_uri: str, work: Path) -> str | None:
    """With a database store and no server, artifacts go to `<work>/mlruns` (MLflow's default is the CWD)."""
    if urlsplit(tracking_uri).scheme in ("http", "https", "databricks"):
        return None
    return (work.resolve() / "mlruns").as_uri()


@contextmanager
def session(tracking_uri: str) -> Iterator[MlflowClient]:
    """A client for `tracking_uri` (tracking and registry), which is also MLflow's process default while
    inside (the fluent log_input / log_model use it). MLflow keeps its default in $MLFLOW_TRACKING_URI;
    the previous value is put back so a library caller's environment is left as it was. MLflow errors
    (server unreachable, permission denied) become a StepError naming the redacted URI."""
    import mlflow
    from mlflow.exceptions import MlflowException

    previous = os.environ.get("MLFLOW_TRACKING_URI")
    # MLflow's per-file upload/download bars go to stderr even in a pod's log; the steps log their own
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    mlflow.set_tracking_uri(tracking_uri)
    try:
        with _sqlite_creation_lock(tracking_uri):
            client = mlflow.MlflowClient(tracking_uri, registry_uri=tracking_uri)  # creates the tables
            client.search_registered_models(max_results=1)  # the registry store on the same database
        yield client
    except MlflowException as e:
        raise StepError(f"MLflow at {redact_uri(tracking_uri)}: {scrub(e.message)}") from e
    finally:
        mlflow.set_tracking_uri(previous)


@contextmanager
def _sqlite_creation_lock(tracking_uri: str) -> Iterator[None]:
    """Serialize opening a sqlite store: MLflow creates and migrates (alembic) its tables when a client
    is made, and two processes doing that at once fail ("Online migration expected to match one
    row"). A flock on `<db>.lock` makes the second wait until the first has finished. Under it a new
    store is created whole (sqlite_store.py), so a full disk cannot leave it half-migrated."""
    if not tracking_uri.startswith("sqlite:///"):
        yield
        return
    db = Path(tracking_uri.removeprefix("sqlite:///"))
    try:
        lock = open(db.with_name(f"{db.name}.lock"), "a")
    except OSError as e:
        raise StepError(f"MLflow store {db}: cannot create its lock file ({e.strerror or e}); free space on "
                        f"that volume or make {db.parent} writable, and rerun") from e
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held for the seconds a migration takes, released on close
        ready_sqlite_store(db)  # a new store made whole or not at all; a half-migrated one named
        yield


EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}  # the UI's model-training view
# MLflow's UI leaves every experiment with this tag out of its experiments list (MLflow 3's list asks for
# `tags.`mlflow.experiment.isGateway` IS NULL`; its AI gateway tags its own usage experiments so): MLflow's
# one way to keep an internal experiment out of the list the user sees. The register locks' carries it.
INTERNAL_EXPERIMENT = {"mlflow.experiment.isGateway": "true"}


def locks_experiment(experiment: str) -> str:
    """The experiment of `experiment`'s register locks: one of their own keeps them out of the runs list,
    and its INTERNAL_EXPERIMENT tag keeps it out of the experiments list."""
    return f"{experiment}-register-locks"


def pipeline_experiments(client: MlflowClient, experiment: str, tracking_uri: str, work: Path
                         ) -> tuple[str, str]:
    """The ids of the runs' experiment and of its register locks' (`locks_experiment`), each created if
    need be: register, promote and registry-init write in both."""
    root = local_artifact_root(tracking_uri, work)
    runs = experiment_id(client, experiment, root)
    locks = experiment_id(client, locks_experiment(experiment), root, EXPERIMENT_KIND | INTERNAL_EXPERIMENT)
    return runs, locks


def experiment_id(client: MlflowClient, name: str, artifact_location: str | None,
                  tags: dict[str, str] = EXPERIMENT_KIND) -> str:
    """The experiment's id, created if need be, and tagged (an older one too) so the MLflow UI opens it in
    its model-training view (not the GenAI one: traces, judges, prompts); `tags` may add
    INTERNAL_EXPERIMENT."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location, tags=tags)
        except MlflowException as e:  # a concurrent register created it first: use theirs
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            experiment = client.get_experiment_by_name(name)
    if experiment.lifecycle_stage != "active":
        raise StepError(f"MLflow experiment {name!r} is deleted: restore it or choose another name")
    for key, value in tags.items():
        if experiment.tags.get(key) != value:
            client.set_experiment_tag(experiment.experiment_id, key, value)
    return experiment.experiment_id


# -- which run ------------------------------------------------------------------------------------
def pipeline_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class RunRef:
    run_id: str
    experiment_id: str
    created: bool


def orchestrator_run(client: MlflowClient) -> RunRef | None:
    """$MLFLOW_RUN_ID: the run an orchestrator made for this pipeline run (an error if the store lacks it)."""
    explicit = os.environ.get("MLFLOW_RUN_ID")
    if not explicit:
        return None
    return RunRef(explicit, client.get_run(explicit).info.experiment_id, created=False)


def pipeline_run(
    client: MlflowClient,
    experiment: str,
    work: Path,
    key: str,
    tracking_uri: str,
    run_name: str | None,
    trained_in: str | None = None,
) -> RunRef:
    """The MLflow run of the pipeline run with this key (see the module docstring for the order);
    `trained_in` is the trainer's live run id from the train report."""
    explicit = orchestrator_run(client)
    if explicit is not None:
        return explicit
    record_path = work / RUN_FILE
    place = {"tracking_uri": redact_uri(tracking_uri), "experiment_id": experiment}
    run_id = (
        _live_run(client, trained_in, experiment, key)
        or recorded_run(client, record_path, {"key": key, **place})
        or _tagged_run(client, experiment, key)
    )
    if run_id is None:
        ref = RunRef(client.create_run(experiment, run_name=run_name, tags={KEY_TAG: key}).info.run_id,
                     experiment, created=True)
    else:
        client.set_tag(run_id, KEY_TAG, key)  # a no-op except on the trainer's live run: claimed now
        ref = RunRef(run_id, experiment, created=False)
    write_json(record_path, {"run_id": ref.run_id, "key": key, **place})
    return ref


def _live_run(client: MlflowClient, run_id: str | None, experiment: str, key: str) -> str | None:
    from mlflow.exceptions import MlflowException

    if run_id is None:
        return None
    try:
        run = client.get_run(run_id)
    except MlflowException:
        return None  # trained against another store (or the run is gone): not ours to adopt
    claimed = run.data.tags.get(KEY_TAG)
    usable = run.info.lifecycle_stage == "active" and run.info.experiment_id == experiment
    return run_id if usable and claimed in (None, key) else None


def recorded_run(client: MlflowClient, record_path: Path, expected: dict[str, str]) -> str | None:
    """The active run a record file names, if the record holds every `expected` field as given."""
    record = _read_record(record_path)
    if record and all(record.get(k) == v for k, v in expected.items()):
        if _run_is_active(client, record["run_id"]):
            return record["run_id"]
    return None


def _tagged_run(client: MlflowClient, experiment: str, key: str) -> str | None:
    found = client.search_runs(
        [experiment], filter_string=f"tags.`{KEY_TAG}` = '{key}'", max_results=1,
        order_by=["attributes.start_time DESC"],
    )
    return found[0].info.run_id if found else None


@contextmanager
def active_run(run_id: str) -> Iterator[None]:
    """The run made active for MLflow's fluent calls (log_input, log_model), without its "View run" print."""
    import mlflow

    previous = os.environ.get(_QUIET)
    os.environ[_QUIET] = "true"
    try:
        with mlflow.start_run(run_id=run_id):
            yield
    finally:
        if previous is None:
            os.environ.pop(_QUIET, None)
        else:
            os.environ[_QUIET] = previous


_QUIET = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # missing or half-written: the tag search finds the run again
    return record if isinstance(record, dict) else None


def _run_is_active(client: MlflowClient, run_id: str) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id).info.lifecycle_stage == "active"
    except MlflowException:
        return False

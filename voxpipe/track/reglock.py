"""The registry-wide `register` lock, on an object only the pipeline's account may write.

The lock is a run in a pipeline-owned experiment of its own (`<experiment>-register-locks`, so the runs
list shows training runs only, tagged so MLflow's experiments list leaves it out: tracking.py
INTERNAL_EXPERIMENT; tag `voxpipe.register_lock` = the model's name),
and its state is in the run's params, which MLflow makes write-once: logging `lock.N` with a value
different from the one already there fails in every store (a unique key per run). So `lock.N = token`
is an atomic compare-and-set: whoever logs epoch N first holds the lock, and `free.N` releases it.
Writing a param takes EDIT on the experiment, which `ownership.check_owned` has just verified no one
but the pipeline (and admins) holds: a READ user can neither take the lock nor keep it held. (The
old marker, a registered model `<name>.register-lock`, was something any user may create.)

Two first registers at once may each create a lock run. A register therefore takes the lock in every
lock run it finds, in run-id order (one global order: no two registers wait on each other). Runs are only
ever added, and each register searches after its own create, so the set one register saw is contained in
the set any later one sees: two holders always share a run, and only one can hold it.

A lock held unchanged for `lease_s` of waiting belongs to a register that died inside its
(sub-second) critical section: it is broken (`free.N = broken by ...`) with a warning. Every wait is
bounded by `timeout_s` and logged; a 403 is an error, never swallowed.
"""

from __future__ import annotations

import logging
import os
import random
import re
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from voxpipe.errors import StepError

if TYPE_CHECKING:
    from mlflow import MlflowClient

log = logging.getLogger(__name__)

LOCK_TAG = "voxpipe.register_lock"
LEASE_S = 120.0
_EPOCH = re.compile(r"^lock\.(\d+)$")


def lock_runs(client: MlflowClient, experiment_id: str, model: str) -> list[str]:
    """The lock runs of `model` in the experiment, in run-id order; one is created if there is none."""
    found = _lock_runs(client, experiment_id, model)
    if not found:
        run = client.create_run(experiment_id, run_name=f"register lock: {model}", tags={LOCK_TAG: model})
        client.set_terminated(run.info.run_id, "FINISHED")  # not a training run: no "running" in the UI
        found = _lock_runs(client, experiment_id, model)
    return found


def _lock_runs(client: MlflowClient, experiment_id: str, model: str) -> list[str]:
    runs = client.search_runs([experiment_id], filter_string=f"tags.`{LOCK_TAG}` = '{model}'",
                              max_results=100)
    return sorted(r.info.run_id for r in runs)


def _epoch(params: dict[str, str]) -> int:
    """The newest epoch taken (-1: never)."""
    return max((int(m.group(1)) for k in params if (m := _EPOCH.match(k))), default=-1)


def _log_once(client: MlflowClient, run_id: str, key: str, value: str, uri: str, what: str) -> bool:
    """Log a write-once param; False when another value got there first."""
    from mlflow.exceptions import MlflowException

    from voxpipe.track.ownership import forbidden

    try:
        client.log_param(run_id, key, value)
    except MlflowException as e:
        if e.error_code == "PERMISSION_DENIED":
            raise forbidden(e, what, uri) from e
        if e.error_code != "INVALID_PARAMETER_VALUE":
            raise
    return client.get_run(run_id).data.params.get(key) == value


@contextmanager
def register_lock(client: MlflowClient, uri: str, experiment_id: str, model: str, timeout_s: float,
                  lease_s: float = LEASE_S) -> Iterator[None]:
    token = f"{socket.gethostname()} pid {os.getpid()} {uuid.uuid4().hex[:8]}"
    deadline = time.monotonic() + timeout_s
    held: list[tuple[str, int]] = []
    try:
        for run_id in lock_runs(client, experiment_id, model):
            held.append((run_id, _take(client, uri, run_id, model, token, deadline, timeout_s, lease_s)))
        yield
    finally:
        for run_id, epoch in reversed(held):
            if not _log_once(client, run_id, f"free.{epoch}", token, uri, f"release the lock of {model!r}"):
                log.warning("register: the register lock of %r was broken while this register held it (it "
                            "took over %.0f s)", model, lease_s)


def _take(client: MlflowClient, uri: str, run_id: str, model: str, token: str, deadline: float,
          timeout_s: float, lease_s: float) -> int:
    """Take the lock in one lock run: the epoch taken, once the newest epoch is free."""
    seen, since = None, time.monotonic()
    while True:
        params = client.get_run(run_id).data.params
        n = _epoch(params)
        if n < 0 or f"free.{n}" in params:
            if _log_once(client, run_id, f"lock.{n + 1}", token, uri, f"take the register lock of {model!r}"):
                return n + 1
            continue
        now = time.monotonic()
        if n != seen:
            seen, since = n, now
            log.info("register: waiting for the register lock of %r, held by %s (run %s, up to %.0f s)",
                     model, params[f"lock.{n}"], run_id, timeout_s)
        elif now - since > lease_s:
            log.warning("register: breaking the register lock of %r held by %s: unchanged for %.0f s (a "
                        "register that died while holding it)", model, params[f"lock.{n}"], lease_s)
            _log_once(client, run_id, f"free.{n}", f"broken by {token}", uri, f"break the lock of {model!r}")
            continue
        if now > deadline:
            raise StepError(f"register: the register lock of {model!r} (MLflow run {run_id}, param lock.{n}) "
                            f"is held by {params[f'lock.{n}']} and did not come free in {timeout_s:.0f} s "
                            "(register.lock_timeout_s); rerun register when that register has finished")
        time.sleep(0.1 + 0.3 * random.random())

"""Submit a Volcano Job and follow it to its end, so the pipeline step fails when training fails.

Polling (not a watch stream): a status read every few seconds is cheap next to hours of training,
and it survives API-server restarts and dropped connections without resume bookkeeping. On failure
the error carries the log tail of the pod that failed first: with collective training the other
ranks then die of communication timeouts, so the first failure is the cause. A timeout or a
SIGTERM/SIGINT (the KFP run was cancelled) deletes the job, so no gang keeps holding accelerators;
so does a pod that can never start (a Secret `launch.secret_env` names is missing, a bad image name),
at once rather than after the timeout.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from voxpipe.errors import StepError
from voxpipe.launch.pod import GROUP, JOB_NAME_LABEL, PLURAL, VERSION

FAILED_PHASES = frozenset({"Failed", "Aborted", "Terminated"})
TASK_LABEL = "volcano.sh/task-spec"  # Volcano's label with the pod's task name (master / worker)
MAX_POLL_ERRORS = 5  # consecutive failed status reads before giving up on the API server
# container states waiting never resolves: a missing Secret or key (launch.secret_env), a bad image name
STUCK_REASONS = frozenset({"CreateContainerConfigError", "InvalidImageName", "ErrImageNeverPull"})
_LATEST = datetime.max.replace(tzinfo=UTC)
logger = logging.getLogger(__name__)


def _stderr(message: str) -> None:
    logger.info("%s", message)


@dataclass(frozen=True)
class JobOutcome:
    namespace: str
    name: str
    phase: str
    restarts: int
    seconds: float


class _Cancelled(BaseException):
    """Raised from the signal handler; a BaseException so no `except Exception` swallows it."""


class _Stuck(Exception):
    """A pod of the job cannot start and never will by itself (STUCK_REASONS)."""


@contextmanager
def _cancel_on_signals() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise _Cancelled(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _api_error(e: ApiException) -> str:
    return f"HTTP {e.status} {e.reason}".strip()


def submit(api: client.ApiClient, job: dict[str, Any]) -> str:
    """Create the job; returns the name the server gave it."""
    namespace = job["metadata"]["namespace"]
    try:
        created = client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, job
        )
    except ApiException as e:
        hint = {
            404: f"is Volcano installed (the {GROUP}/{VERSION} Job CRD), does the namespace exist?",
            403: "the pod's service account needs the Role in manifests/namespaced/rbac.yaml",
        }.get(e.status, e.body or "")
        raise StepError(
            f"could not create the Volcano job in namespace {namespace!r}: {_api_error(e)}; {hint}"
        ) from None
    return created["metadata"]["name"]


def _failed_first(pods: list[client.V1Pod]) -> tuple[client.V1Pod, str] | None:
    """The pod that failed earliest, and why; else the master pod (evicted or aborted gangs)."""
    failures = []
    for pod in pods:
        for cs in pod.status.container_statuses or []:
            term = cs.state.terminated if cs.state else None
            if term is not None and term.exit_code != 0:
                why = f"exit code {term.exit_code}" + (f", {term.reason}" if term.reason else "")
                failures.append((term.finished_at or _LATEST, pod.metadata.name, pod, why))
        if pod.status.phase == "Failed" and pod.status.reason:  # evicted pods have no terminated container
            failures.append((_LATEST, pod.metadata.name, pod, pod.status.reason))
    if failures:
        _, _, pod, why = min(failures, key=lambda f: (f[0], f[1]))
        return pod, why
    masters = [p for p in pods if (p.metadata.labels or {}).get(TASK_LABEL) == "master"]
    chosen = masters or sorted(pods, key=lambda p: p.metadata.name)
    return (chosen[0], f"phase {chosen[0].status.phase}") if chosen else None


def pod_report(api: client.ApiClient, namespace: str, name: str, tail_lines: int) -> str:
    """Which pod to blame and the tail of its log, as text for the error message."""
    core = client.CoreV1Api(api)
    try:
        pods = core.list_namespaced_pod(namespace, label_selector=f"{JOB_NAME_LABEL}={name}").items
    except ApiException as e:
        return f"(could not list its pods: {_api_error(e)})"
    found = _failed_first(pods)
    if found is None:
        return "(no pod of the job is left to read a log from)"
    pod, why = found
    try:
        text = core.read_namespaced_pod_log(pod.metadata.name, namespace, tail_lines=tail_lines)
    except ApiException as e:
        text = f"(log unavailable: {_api_error(e)})"
    return f"pod {pod.metadata.name} ({why}), last {tail_lines} log lines:\n{text.rstrip()}"


def _delete(api: client.ApiClient, namespace: str, name: str) -> str:
    try:
        client.CustomObjectsApi(api).delete_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, propagation_policy="Background"
        )
    except ApiException as e:
        return f"deleting it failed ({_api_error(e)}): run `kubectl -n {namespace} delete vcjob {name}`"
    return "deleted it"


def _stuck_pod(api: client.ApiClient, namespace: str, name: str) -> str | None:
    """'pod X: reason: message' for a pod whose container is stuck in STUCK_REASONS, else None."""
    try:
        pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=f"{JOB_NAME_LABEL}={name}")
    except ApiException:
        return None  # the status poll reports a lost API server
    for pod in pods.items:
        for cs in pod.status.container_statuses or []:
            waiting = cs.state.waiting if cs.state else None
            if waiting is not None and waiting.reason in STUCK_REASONS:
                return f"pod {pod.metadata.name}: {waiting.reason}: {waiting.message or ''}".rstrip(": ")
    return None


def _read_status(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return obj.get("status") or {}


def watch(
    api: client.ApiClient,
    namespace: str,
    name: str,
    *,
    timeout_s: float,
    poll_s: float,
    tail_lines: int,
    log: Callable[[str], None] = _stderr,
) -> JobOutcome:
    """Poll until Completed (returned) or Failed/Aborted/Terminated or timeout (StepError)."""
    custom = client.CustomObjectsApi(api)
    start = time.monotonic()
    last_phase, errors = None, 0
    while True:
        try:
            status = _read_status(custom, namespace, name)
            errors = 0
        except ApiException as e:
            if e.status == 404:
                raise StepError(f"Volcano job {namespace}/{name} disappeared (deleted by someone?)") from None
            errors += 1
            status = None
            log(f"{namespace}/{name}: status read failed ({_api_error(e)}), {errors}/{MAX_POLL_ERRORS}")
        except urllib3.exceptions.HTTPError as e:
            errors += 1
            status = None
            log(f"{namespace}/{name}: API server unreachable ({e}), {errors}/{MAX_POLL_ERRORS}")
        if errors >= MAX_POLL_ERRORS:
            raise StepError(f"lost the API server while watching Volcano job {namespace}/{name}")
        elapsed = time.monotonic() - start
        if status is not None:
            state = status.get("state") or {}
            phase = state.get("phase") or "Pending"
            restarts = int(status.get("retryCount") or 0)
            if phase != last_phase:
                reason = f" ({state['reason']})" if state.get("reason") not in (None, "", phase) else ""
                log(f"{namespace}/{name}: {phase}{reason}, {restarts} restart(s), {elapsed:.0f} s")
                last_phase = phase
            if phase == "Completed":
                return JobOutcome(namespace, name, phase, restarts, elapsed)
            if phase in FAILED_PHASES:
                detail = "; ".join(x for x in (state.get("reason"), state.get("message")) if x and x != phase)
                raise StepError(
                    f"Volcano job {namespace}/{name} ended {phase}" + (f" ({detail})" if detail else "")
                    + f" after {restarts} restart(s). "
                    + pod_report(api, namespace, name, tail_lines)
                )
            stuck = _stuck_pod(api, namespace, name)
            if stuck:
                raise _Stuck(stuck)
        if elapsed >= timeout_s:
            raise TimeoutError(f"still {last_phase} after {timeout_s:.0f} s")
        time.sleep(poll_s)


def run_job(
    api: client.ApiClient,
    job: dict[str, Any],
    *,
    timeout_s: float,
    poll_s: float,
    tail_lines: int,
    log: Callable[[str], None] = _stderr,
) -> JobOutcome:
    """Submit, watch to the end; delete the job on timeout or cancellation (then raise StepError)."""
    namespace = job["metadata"]["namespace"]
    name = submit(api, job)
    log(f"submitted Volcano job {namespace}/{name}")
    try:
        with _cancel_on_signals():
            return watch(
                api, namespace, name, timeout_s=timeout_s, poll_s=poll_s, tail_lines=tail_lines, log=log
            )
    except _Stuck as e:
        raise StepError(
            f"Volcano job {namespace}/{name} cannot start its pods ({e}); "
            f"{_delete(api, namespace, name)}. A missing Secret or key: create the Secrets launch.secret_env "
            "names (docs/cluster.md) or fix the reference; a bad image name: fix launch.image."
        ) from None
    except TimeoutError as e:
        report = pod_report(api, namespace, name, tail_lines)
        raise StepError(
            f"Volcano job {namespace}/{name} timed out ({e}); {_delete(api, namespace, name)}. {report}"
        ) from None
    except _Cancelled as e:
        outcome = _delete(api, namespace, name)
        raise StepError(f"cancelled by {e}: Volcano job {namespace}/{name}: {outcome}") from None

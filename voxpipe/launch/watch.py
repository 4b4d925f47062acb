"""Submit a launcher's job and follow it to its end, so the pipeline step fails when training fails.

Polling (not a watch stream): a status read every few seconds is cheap next to hours of training,
and it survives API-server restarts and dropped connections without resume bookkeeping. On failure
the error carries the log tail of the pod that failed first: with collective training the other
ranks then die of communication timeouts, so the first failure is the cause. A timeout or a
SIGTERM/SIGINT (the KFP run was cancelled) deletes the job, so no gang keeps holding accelerators;
so does a pod that can never start (a Secret `launch.secret_env` names is missing, a bad image name),
at once rather than after the timeout. The same code for every backend: each says where its job lives
and how to read its status (voxpipe/launch/base.py `Resource`, `State`).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from voxpipe.errors import StepError
from voxpipe.launch.base import Launcher, Outcome, Resource, State

MAX_POLL_ERRORS = 5  # consecutive failed status reads before giving up on the API server
# container states waiting never resolves: a missing Secret or key (launch.secret_env), a bad image name
STUCK_REASONS = frozenset({"CreateContainerConfigError", "InvalidImageName", "ErrImageNeverPull"})
_LATEST = datetime.max.replace(tzinfo=UTC)
logger = logging.getLogger(__name__)


def _stderr(message: str) -> None:
    logger.info("%s", message)


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


def create(api: client.ApiClient, resource: Resource, body: dict[str, Any], exists_ok: bool = False) -> str:
    """Create one object of `resource`; returns the name the server gave it. `exists_ok`: a 409 (an
    object named by its content, made by an earlier run) is the object wanted."""
    namespace = body["metadata"]["namespace"]
    try:
        created = client.CustomObjectsApi(api).create_namespaced_custom_object(
            resource.group, resource.version, namespace, resource.plural, body
        )
    except ApiException as e:
        if e.status == 409 and exists_ok:
            return body["metadata"]["name"]
        hint = {
            404: resource.missing_hint,
            403: "the pod's service account needs the Role in manifests/namespaced/rbac.yaml",
        }.get(e.status, e.body or "")
        raise StepError(
            f"could not create the {resource.kind} in namespace {namespace!r}: {_api_error(e)}; {hint}"
        ) from None
    return created["metadata"]["name"]


def _failed_first(pods: list[client.V1Pod], first: tuple[str, str]) -> tuple[client.V1Pod, str] | None:
    """The pod that failed earliest, and why; else rank 0's pod (`first`: evicted or aborted gangs)."""
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
    label, value = first
    masters = [p for p in pods if (p.metadata.labels or {}).get(label) == value]
    chosen = masters or sorted(pods, key=lambda p: p.metadata.name)
    return (chosen[0], f"phase {chosen[0].status.phase}") if chosen else None


def pod_report(api: client.ApiClient, resource: Resource, namespace: str, name: str, tail_lines: int) -> str:
    """Which pod to blame and the tail of its log, as text for the error message."""
    core = client.CoreV1Api(api)
    try:
        pods = core.list_namespaced_pod(namespace, label_selector=f"{resource.pod_label}={name}").items
    except ApiException as e:
        return f"(could not list its pods: {_api_error(e)})"
    found = _failed_first(pods, resource.first_pod)
    if found is None:
        return "(no pod of the job is left to read a log from)"
    pod, why = found
    try:
        text = core.read_namespaced_pod_log(pod.metadata.name, namespace, tail_lines=tail_lines)
    except ApiException as e:
        text = f"(log unavailable: {_api_error(e)})"
    return f"pod {pod.metadata.name} ({why}), last {tail_lines} log lines:\n{text.rstrip()}"


def delete(api: client.ApiClient, resource: Resource, namespace: str, name: str) -> str:
    try:
        client.CustomObjectsApi(api).delete_namespaced_custom_object(
            resource.group, resource.version, namespace, resource.plural, name,
            propagation_policy="Background",
        )
    except ApiException as e:
        return (f"deleting it failed ({_api_error(e)}): run "
                f"`kubectl -n {namespace} delete {resource.kubectl} {name}`")
    return "deleted it"


def _stuck_pod(api: client.ApiClient, resource: Resource, namespace: str, name: str) -> str | None:
    """'pod X: reason: message' for a pod whose container is stuck in STUCK_REASONS, else None."""
    try:
        pods = client.CoreV1Api(api).list_namespaced_pod(namespace,
                                                         label_selector=f"{resource.pod_label}={name}")
    except ApiException:
        return None  # the status poll reports a lost API server
    for pod in pods.items:
        for cs in pod.status.container_statuses or []:
            waiting = cs.state.waiting if cs.state else None
            if waiting is not None and waiting.reason in STUCK_REASONS:
                return f"pod {pod.metadata.name}: {waiting.reason}: {waiting.message or ''}".rstrip(": ")
    return None


def _read_status(
    custom: client.CustomObjectsApi, resource: Resource, namespace: str, name: str
) -> dict[str, Any]:
    obj = custom.get_namespaced_custom_object(
        resource.group, resource.version, namespace, resource.plural, name
    )
    return obj.get("status") or {}


def _restarts(state: State) -> str:
    return "" if state.restarts is None else f" after {state.restarts} restart(s)"


def follow(
    api: client.ApiClient,
    resource: Resource,
    read: Callable[[dict[str, Any]], State],
    namespace: str,
    name: str,
    *,
    timeout_s: float,
    poll_s: float,
    tail_lines: int,
    log: Callable[[str], None] = _stderr,
) -> Outcome:
    """Poll until the job is done (returned), has failed (StepError with the failing pod's log) or the
    timeout passes (TimeoutError); a pod that can never start raises _Stuck."""
    custom = client.CustomObjectsApi(api)
    start = time.monotonic()
    last_phase, errors = None, 0
    while True:
        try:
            status = _read_status(custom, resource, namespace, name)
            errors = 0
        except ApiException as e:
            if e.status == 404:
                raise StepError(
                    f"{resource.kind} {namespace}/{name} disappeared (deleted by someone?)"
                ) from None
            errors += 1
            status = None
            log(f"{namespace}/{name}: status read failed ({_api_error(e)}), {errors}/{MAX_POLL_ERRORS}")
        except urllib3.exceptions.HTTPError as e:
            errors += 1
            status = None
            log(f"{namespace}/{name}: API server unreachable ({e}), {errors}/{MAX_POLL_ERRORS}")
        if errors >= MAX_POLL_ERRORS:
            raise StepError(f"lost the API server while watching {resource.kind} {namespace}/{name}")
        elapsed = time.monotonic() - start
        if status is not None:
            state = read(status)
            if state.phase != last_phase:
                reason = f" ({state.reason})" if state.reason not in ("", state.phase) else ""
                count = "" if state.restarts is None else f", {state.restarts} restart(s)"
                log(f"{namespace}/{name}: {state.phase}{reason}{count}, {elapsed:.0f} s")
                last_phase = state.phase
            if state.done:
                return Outcome(namespace, name, state.phase, state.restarts, elapsed)
            if state.failed:
                raise StepError(
                    f"{resource.kind} {namespace}/{name} ended {state.phase}"
                    + (f" ({state.detail})" if state.detail else "") + f"{_restarts(state)}. "
                    + pod_report(api, resource, namespace, name, tail_lines)
                )
            stuck = _stuck_pod(api, resource, namespace, name)
            if stuck:
                raise _Stuck(stuck)
        if elapsed >= timeout_s:
            raise TimeoutError(f"still {last_phase} after {timeout_s:.0f} s")
        time.sleep(poll_s)


def run_job(
    api: client.ApiClient,
    launcher: Launcher,
    objects: list[dict[str, Any]],
    *,
    timeout_s: float,
    poll_s: float,
    tail_lines: int,
    log: Callable[[str], None] = _stderr,
) -> Outcome:
    """Submit, watch to the end; cancel the job on timeout or cancellation (then raise StepError)."""
    kind = launcher.resource.kind
    namespace = objects[-1]["metadata"]["namespace"]
    name = launcher.submit(api, objects)
    log(f"submitted {kind} {namespace}/{name}")
    try:
        with _cancel_on_signals():
            return launcher.watch(
                api, namespace, name, timeout_s=timeout_s, poll_s=poll_s, tail_lines=tail_lines, log=log
            )
    except _Stuck as e:
        raise StepError(
            f"{kind} {namespace}/{name} cannot start its pods ({e}); "
            f"{launcher.cancel(api, namespace, name)}. A missing Secret or key: create the Secrets "
            "launch.secret_env names (docs/cluster.md) or fix the reference; a bad image name: fix "
            "launch.image."
        ) from None
    except TimeoutError as e:
        report = launcher.logs(api, namespace, name, tail_lines)
        raise StepError(
            f"{kind} {namespace}/{name} timed out ({e}); {launcher.cancel(api, namespace, name)}. {report}"
        ) from None
    except _Cancelled as e:
        outcome = launcher.cancel(api, namespace, name)
        raise StepError(f"cancelled by {e}: {kind} {namespace}/{name}: {outcome}") from None

"""The launcher interface: what `voxpipe launch-<step>` asks of a backend, whichever runs the pods.

A backend (voxpipe/launch/volcano.py, trainjob.py) renders the objects it creates and says how to
read its kind of job; submitting, following, reading the failing pod's log and cancelling are then
the same polling code (voxpipe/launch/watch.py) for all of them. Backends are named in one place
(voxpipe/launchers.py, each with its settings; voxpipe/launch/registry.py loads one), so the step
never switches on a name and a new backend is one module and one registration (with its settings
model); voxpipe/launch/followed.py holds the shared half of an implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from voxpipe.launch.pod import Owner, StepJob
    from voxpipe.params import Params


@dataclass(frozen=True)
class Resource:
    """A custom resource a backend follows: its API coordinates, how its pods are found, what to say."""

    group: str
    version: str
    plural: str
    kind: str  # in messages: "Volcano job", "TrainJob"
    kubectl: str  # its short name for `kubectl delete`
    missing_hint: str  # what a 404 on create means
    # a followed job's pods: the label naming the job on each, and the (label, value) of the pod to
    # blame when none failed (rank 0); empty for an object only created (a TrainingRuntime)
    pod_label: str = ""
    first_pod: tuple[str, str] = ("", "")


@dataclass(frozen=True)
class State:
    """One status read, in the backend's words: its phase, and whether it is over and how."""

    phase: str
    restarts: int | None  # None: the backend does not count them
    done: bool = False
    failed: bool = False
    reason: str = ""  # shown with the phase when it changes
    detail: str = ""  # the failure's reason and message


@dataclass(frozen=True)
class Outcome:
    namespace: str
    name: str
    phase: str
    restarts: int | None
    seconds: float


class Launcher(Protocol):
    """render -> submit -> watch; logs and cancel for the failure, timeout and cancellation paths."""

    resource: Resource

    def render(self, params: Params, namespace: str, owner: Owner | None,
               job: StepJob) -> list[dict[str, Any]]:
        """The objects to create, in order; the last is the one followed (a generateName'd job)."""
        ...

    def state(self, status: dict[str, Any]) -> State:
        """The followed object's `status` read as a State."""
        ...

    def submit(self, api: ApiClient, objects: list[dict[str, Any]]) -> str:
        """Create the objects; returns the name the server gave the followed one."""
        ...

    def watch(self, api: ApiClient, namespace: str, name: str, *, timeout_s: float, poll_s: float,
              tail_lines: int, log: Callable[[str], None]) -> Outcome:
        ...

    def logs(self, api: ApiClient, namespace: str, name: str, tail_lines: int) -> str:
        """Which pod to blame and the tail of its log."""
        ...

    def cancel(self, api: ApiClient, namespace: str, name: str) -> str:
        """Delete the job (its pods go with it); says what happened."""
        ...


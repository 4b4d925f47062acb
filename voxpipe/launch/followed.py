"""The half of a launcher every backend shares: submit, watch, logs and cancel of one custom resource.

A backend subclasses `Followed`, names its `resource` and adds render and state. The calls go to
voxpipe/launch/watch.py, imported on first use, so a dry run (render only) needs no kubernetes client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from voxpipe.launch.base import Outcome, Resource, State

if TYPE_CHECKING:
    from kubernetes.client import ApiClient


class Followed:
    """submit, watch, logs and cancel for `resource`; a backend adds render and state."""

    resource: Resource

    def state(self, status: dict[str, Any]) -> State:
        raise NotImplementedError

    def submit(self, api: ApiClient, objects: list[dict[str, Any]]) -> str:
        from voxpipe.launch import watch

        return watch.create(api, self.resource, objects[-1])

    def watch(self, api: ApiClient, namespace: str, name: str, *, timeout_s: float, poll_s: float,
              tail_lines: int, log: Callable[[str], None]) -> Outcome:
        from voxpipe.launch import watch

        return watch.follow(api, self.resource, self.state, namespace, name, timeout_s=timeout_s,
                            poll_s=poll_s,
                            tail_lines=tail_lines, log=log)

    def logs(self, api: ApiClient, namespace: str, name: str, tail_lines: int) -> str:
        from voxpipe.launch import watch

        return watch.pod_report(api, self.resource, namespace, name, tail_lines)

    def cancel(self, api: ApiClient, namespace: str, name: str) -> str:
        from voxpipe.launch import watch

        return watch.delete(api, self.resource, namespace, name)

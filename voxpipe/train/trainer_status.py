"""Training progress in the TrainJob's own status (Kubeflow Trainer v2.3 `status.trainerStatus`).

Trainer shows a job's progress percentage, estimated remaining seconds and metrics in the Kubeflow UI
and SDK from `status.trainerStatus` (the `TrainJobStatus` feature gate). Rank 0 of a run launched by
the `trainjob` launcher writes it with a merge patch of the TrainJob's status subresource through the
Kubernetes API, as the pod's service account (manifests/namespaced/rbac.yaml: voxpipe-trainer may
patch `trainjobs/status`, nothing else). The launcher tells the pod its TrainJob and the interval in
the env below; without them (a Volcano Job, a local run) nothing is reported.

At most one patch every `launch.progress_every_s` (Trainer's own client floor is 5 s) and one at the
end. A failed patch never stops training: it is logged once per kind of failure, with the way out.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger(__name__)

NAME_ENV = "VOXPIPE_TRAINJOB_NAME"
NAMESPACE_ENV = "VOXPIPE_TRAINJOB_NAMESPACE"
EVERY_ENV = "VOXPIPE_TRAINJOB_PROGRESS_EVERY_S"
GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
HEADLINE = {"loss": "loss", "tokens_per_s": "tokens_per_s", "mfu": "mfu"}  # record key -> metric name


def trainer_status(step: int, max_steps: int, remaining_s: float | None, record: Mapping[str, Any],
                   now: datetime) -> dict[str, Any]:
    """The `trainerStatus` object of Trainer v2.3's CRD: whole percent and seconds (int32), metrics as
    name/value strings; a metric that has no value (non-finite, no MFU peak) is left out, an unknown
    remaining time too (the CRD's "empty if unknown")."""
    status: dict[str, Any] = {
        "progressPercentage": min(100, max(0, math.floor(100 * step / max_steps))) if max_steps else 0,
        "lastUpdatedTime": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if remaining_s is not None:
        status["estimatedRemainingSeconds"] = max(0, min(2**31 - 1, round(remaining_s)))
    metrics = [{"name": name, "value": f"{value:.6g}"} for key, name in HEADLINE.items()
               if isinstance(value := record.get(key), int | float) and math.isfinite(value)]
    if metrics:
        status["metrics"] = metrics
    return status


class TrainerStatusReporter:
    """Rank 0's progress, patched into its TrainJob at most every `every_s` seconds."""

    def __init__(self, api: Any, namespace: str, name: str, every_s: float, first_step: int,
                 clock: Callable[[], float] = time.monotonic):
        self.api, self.namespace, self.name, self.every_s = api, namespace, name, every_s
        self.clock = clock
        self.started, self.first_step = clock(), first_step
        self.last_sent: float | None = None
        self.warned: set[str] = set()
        self.sent = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str], first_step: int) -> TrainerStatusReporter | None:
        """The reporter of a pod the trainjob launcher made (in-cluster credentials), else None."""
        name = environ.get(NAME_ENV)
        if not name:
            return None
        from kubernetes import client, config

        config.load_incluster_config()
        return cls(client.ApiClient(), environ.get(NAMESPACE_ENV, "default"), name,
                   float(environ.get(EVERY_ENV, "30")), first_step)

    def remaining_s(self, step: int, max_steps: int) -> float | None:
        """The steps left at this run's mean pace so far; None before a step of this run has finished."""
        done = step - self.first_step
        if done <= 0:
            return None
        return (self.clock() - self.started) / done * (max_steps - step)

    def update(self, step: int, max_steps: int, record: Mapping[str, Any], final: bool = False) -> bool:
        """Patch the status if `every_s` has passed since the last patch (always when `final`); True if
        a patch was sent and accepted."""
        now = self.clock()
        if not final and self.last_sent is not None and now - self.last_sent < self.every_s:
            return False
        self.last_sent = now
        status = trainer_status(step, max_steps, self.remaining_s(step, max_steps), record,
                                datetime.now(UTC))
        return self._patch(status)

    def _patch(self, status: dict[str, Any]) -> bool:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        try:
            client.CustomObjectsApi(self.api).patch_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, PLURAL, self.name, {"status": {"trainerStatus": status}})
        except ApiException as e:
            self._warn(str(e.status), f"HTTP {e.status} {e.reason}" + (
                ": the pod's service account may not patch trainjobs/status; apply "
                "manifests/namespaced/rbac.yaml (voxpipe-trainer)" if e.status == 403 else ""))
            return False
        except Exception as e:  # the API unreachable: progress is a view, training goes on
            self._warn(type(e).__name__, f"{type(e).__name__}: {str(e)[:200]}")
            return False
        self.sent += 1
        return True

    def _warn(self, kind: str, text: str) -> None:
        if kind not in self.warned:
            self.warned.add(kind)
            log.warning("TrainJob %s/%s: progress not written to status.trainerStatus (%s); training goes "
                        "on, and this is said once", self.namespace, self.name, text)


def reporter_from_env(environ: Mapping[str, str], first_step: int) -> TrainerStatusReporter | None:
    """Train's reporter: None outside a TrainJob, or (logged) when the in-cluster credentials fail."""
    try:
        return TrainerStatusReporter.from_env(environ, first_step)
    except Exception as e:  # kubernetes' ConfigException: no token mounted (a named runtime without it)
        log.warning("TrainJob %s: progress is not reported (%s: %s); give the pods the voxpipe-trainer "
                    "service account with its token mounted (docs/cluster.md)", environ.get(NAME_ENV),
                    type(e).__name__, str(e)[:200])
        return None

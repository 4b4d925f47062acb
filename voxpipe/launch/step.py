"""`voxpipe launch-train` / `launch-encode`: the step through launch.backend's launcher, rendered
(--dry-run) or run."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from voxpipe.errors import StepError
from voxpipe.launch.pod import Owner, StepJob, manifests_yaml
from voxpipe.launch.registry import launcher
from voxpipe.params import Params

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class LaunchResult:
    text: str

    def summary(self) -> str:
        return self.text


def pod_namespace() -> str | None:
    """The namespace of the pod we run in (None outside a pod)."""
    if SERVICE_ACCOUNT_NAMESPACE.is_file():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
    return None


def _api_client() -> ApiClient:
    """In-cluster service account inside a pod, else the kubeconfig (a laptop, CI against a cluster)."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise StepError("the kubernetes client is missing: pip install 'voxpipe[cluster]'") from None
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
        else:  # KUBECONFIG read now: the client's default was fixed when it was imported
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    except config.ConfigException as e:
        raise StepError(f"no Kubernetes credentials (in-cluster or kubeconfig): {e}") from None
    return client.ApiClient()


def launch_train(params: Params) -> LaunchResult:
    return _launch(params, StepJob.train(params.launch), params.train.out)


def launch_encode(params: Params) -> LaunchResult:
    """`encode` on launch.encode_devices accelerators; a restart resumes from the shard index."""
    return _launch(params, StepJob.encode(params.launch), params.encode.out)


def _launch(params: Params, step: StepJob, out: str) -> LaunchResult:
    launch = params.launch
    own_namespace = pod_namespace()
    namespace = launch.namespace or own_namespace or "default"
    owner = Owner.from_env(os.environ, own_namespace) if own_namespace else None
    backend = launcher(launch)
    objects = backend.render(params, namespace, owner, step)
    if launch.dry_run:
        return LaunchResult(manifests_yaml(objects).rstrip("\n"))

    api = _api_client()  # before importing watch: a clear message when the `cluster` extra is missing
    from voxpipe.launch.watch import run_job

    outcome = run_job(
        api,
        backend,
        objects,
        timeout_s=launch.timeout_seconds,
        poll_s=launch.poll_seconds,
        tail_lines=launch.log_tail_lines,
    )
    restarts = "" if outcome.restarts is None else f" after {outcome.restarts} restart(s)"
    return LaunchResult(
        f"{backend.resource.kind} {outcome.namespace}/{outcome.name} {outcome.phase}{restarts} "
        f"in {outcome.seconds:.0f} s; outputs in {out} on PVC {launch.pvc}"
    )

"""Render `voxpipe train` as a Volcano Job: gang-scheduled pods, one torchrun per pod.

Volcano's pytorch plugin gives every pod MASTER_ADDR (the master task's pod, resolvable through the
svc plugin's headless service), MASTER_PORT, WORLD_SIZE (= pods) and RANK (master 0, workers 1..);
torchrun turns them into one training process per device. An evicted or failed pod restarts the
whole job (FSDP cannot go on with a rank missing); every restart runs the same command, and
`voxpipe train` resumes from the newest complete checkpoint under train.out on the shared PVC.
"""

from __future__ import annotations

import copy
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from voxpipe.errors import StepError
from voxpipe.params import LaunchParams, TrainParams

GROUP, VERSION, PLURAL = "batch.volcano.sh", "v1alpha1", "jobs"
JOB_NAME_LABEL = "volcano.sh/job-name"  # Volcano puts it on every pod of a job
MASTER_PORT = 23456
# KFP v2 sets these on every task pod from the downward API (metadata.name, metadata.uid)
POD_NAME_ENV, POD_UID_ENV = "KFP_POD_NAME", "KFP_POD_UID"
PARAMS_ENV = "VOXPIPE_PARAMS"
PARAMS_FILE = "/tmp/voxpipe-params.yaml"
ASCEND_RESOURCE_PREFIX = "huawei.com/Ascend"
# set by the pytorch plugin or by us: a user value would silently lose or break the rendezvous
RESERVED_ENV = frozenset({"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", PARAMS_ENV, "HCCL_IF_IP"})
LABELS = {"app.kubernetes.io/name": "voxpipe", "app.kubernetes.io/component": "train"}


@dataclass(frozen=True)
class Owner:
    """The pod that launched the job; deleting it (a deleted KFP run) garbage-collects the job."""

    name: str
    uid: str
    namespace: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str], namespace: str) -> Owner | None:
        name, uid = environ.get(POD_NAME_ENV), environ.get(POD_UID_ENV)
        return cls(name, uid, namespace) if name and uid else None


def is_ascend(launch: LaunchParams) -> bool:
    return launch.accelerator.startswith(ASCEND_RESOURCE_PREFIX)


def train_script(launch: LaunchParams) -> str:
    """The pod's shell command: write the params the job carries, then exec torchrun on `voxpipe train`.

    torchrun passes SIGTERM on to its workers but SIGKILLs them after its shutdown timeout (30 s by
    default); raised to the pod's grace period so the trainer can finish its SIGTERM checkpoint.
    """
    return (
        f'printf \'%s\' "${PARAMS_ENV}" > {PARAMS_FILE} && exec torchrun'
        " --nnodes=$WORLD_SIZE --node_rank=$RANK"
        f" --nproc_per_node={launch.devices_per_pod}"
        " --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT"
        f" --shutdown_timeout={launch.grace_seconds}"
        f" -m voxpipe.cli train --params {PARAMS_FILE}"
    )


def train_params_yaml(train: TrainParams) -> str:
    """The whole `train` section, so the job reproduces this run whatever params.yaml the image has."""
    return yaml.safe_dump({"train": train.model_dump()}, sort_keys=False)


def _check_out_on_pvc(train: TrainParams, mount_path: str) -> None:
    out = posixpath.normpath(train.out)
    mount = posixpath.normpath(mount_path)
    if posixpath.isabs(out) and not (out == mount or out.startswith(mount + "/")):
        raise StepError(
            f"train.out={train.out!r} is outside the workspace PVC mounted at {mount_path}: the pods "
            "would not share their checkpoint shards and a restarted job could not resume. Use a path "
            "relative to the PVC (the working directory) or one under the mount path."
        )


def _env(launch: LaunchParams, train: TrainParams) -> list[dict[str, Any]]:
    clash = RESERVED_ENV & launch.env.keys()
    if clash:
        raise StepError(f"launch.env sets {sorted(clash)}: these are set by Volcano or voxpipe itself")
    env: list[dict[str, Any]] = [{"name": PARAMS_ENV, "value": train_params_yaml(train)}]
    if is_ascend(launch):
        env += [
            # HCCL binds its rendezvous to this address: the pod IP, not whatever interface it guesses
            {"name": "HCCL_IF_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "HCCL_CONNECT_TIMEOUT", "value": str(launch.hccl_connect_timeout)},
            {"name": "HCCL_EXEC_TIMEOUT", "value": str(launch.hccl_exec_timeout)},
            {"name": "PYTORCH_NPU_ALLOC_CONF", "value": "expandable_segments:True"},
        ]
    env += [{"name": k, "value": v} for k, v in sorted(launch.env.items())]
    return env


def _resources(launch: LaunchParams) -> dict[str, Any]:
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if launch.accelerator:
        # extended resources must have request == limit
        requests[launch.accelerator] = limits[launch.accelerator] = launch.devices_per_pod
    if launch.cpu:
        requests["cpu"] = launch.cpu
    if launch.memory:
        requests["memory"] = limits["memory"] = launch.memory
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def pod_template(launch: LaunchParams, train: TrainParams) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "train",
        "image": launch.image,
        "imagePullPolicy": launch.image_pull_policy,
        # args, not command: the image's entrypoint stays (the CANN image's sources set_env.sh)
        "args": ["/bin/sh", "-c", train_script(launch)],
        "workingDir": launch.mount_path,
        "env": _env(launch, train),
        "volumeMounts": [
            {"name": "workspace", "mountPath": launch.mount_path},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }
    resources = _resources(launch)
    if resources:
        container["resources"] = resources
    spec: dict[str, Any] = {
        # a failed container must fail the pod, so Volcano restarts the whole gang (PodFailed)
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": launch.grace_seconds,
        "containers": [container],
        "volumes": [
            {"name": "workspace", "persistentVolumeClaim": {"claimName": launch.pvc}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": launch.shm_size}},
        ],
    }
    if launch.node_selector:
        spec["nodeSelector"] = dict(launch.node_selector)
    if launch.tolerations:
        spec["tolerations"] = [dict(t) for t in launch.tolerations]
    return {"metadata": {"labels": dict(LABELS)}, "spec": spec}


def render_job(
    launch: LaunchParams, train: TrainParams, namespace: str, owner: Owner | None = None
) -> dict[str, Any]:
    """The Volcano Job for one training run; the server picks the name (generateName)."""
    _check_out_on_pvc(train, launch.mount_path)
    metadata: dict[str, Any] = {
        "generateName": "voxpipe-train-",
        "namespace": namespace,
        "labels": dict(LABELS),
    }
    if owner is not None:
        if owner.namespace != namespace:
            raise StepError(
                f"launch.namespace={namespace!r} differs from the launcher pod's namespace "
                f"{owner.namespace!r}: an ownerReference cannot cross namespaces (leave it empty)"
            )
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": owner.name, "uid": owner.uid}
        ]
    template = pod_template(launch, train)
    tasks: list[dict[str, Any]] = [
        {
            "name": "master",
            "replicas": 1,
            # only the master's completion ends the job: workers may finish while rank 0 still
            # writes the export, and a job-level TaskCompleted would kill it then
            "policies": [{"event": "TaskCompleted", "action": "CompleteJob"}],
            "template": template,
        }
    ]
    if launch.pods > 1:
        tasks.append({"name": "worker", "replicas": launch.pods - 1, "template": copy.deepcopy(template)})
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "schedulerName": "volcano",
            "queue": launch.queue,
            "minAvailable": launch.pods,  # gang: all pods start together or none does
            "maxRetry": launch.max_retry,
            "ttlSecondsAfterFinished": launch.ttl_seconds,
            "plugins": {
                "pytorch": ["--master=master", "--worker=worker", f"--port={MASTER_PORT}"],
                "svc": [],
            },
            "policies": [{"events": ["PodEvicted", "PodFailed"], "action": "RestartJob"}],
            "tasks": tasks,
        },
    }


class _BlockStrDumper(yaml.SafeDumper):
    """Multi-line strings (the embedded params) as `|` blocks, readable in a dry run and a golden file."""


_BlockStrDumper.add_representer(
    str,
    lambda dumper, s: dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None),
)


def job_yaml(job: dict[str, Any]) -> str:
    return yaml.dump(job, Dumper=_BlockStrDumper, sort_keys=False, width=1000)

"""The restricted pod every launcher runs a step in, and the checks every rendered object passes.

One builder for both backends (voxpipe/launch/volcano.py, trainjob.py), so a launcher cannot drift
from the security rules: the pods meet the "restricted" Pod Security Standard (non-root, no privilege
escalation, no capabilities, RuntimeDefault seccomp, read-only root filesystem with /tmp an emptyDir,
no service account token: training never calls the API). Secrets arrive by reference only
(`launch.secret_env` as secretKeyRef); a rendered object that would carry a secret value is refused.
The params the step reads travel whole in the pod's env, so the run reproduces whatever params.yaml
the image has, and every workspace path is checked to stay on the shared volume.

Each pod runs one torchrun (one process per device); the launcher supplies its rendezvous arguments.
An evicted or failed pod restarts the whole gang (FSDP cannot go on with a rank missing); every
restart runs the same command, and `voxpipe train` resumes from the newest complete checkpoint under
train.out on the shared PVC; `encode` resumes from its shard index.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from voxpipe.errors import StepError
from voxpipe.integrity import KEY_ENV
from voxpipe.launch.kube_rules import dns1123_subdomain
from voxpipe.launch.workspace import inside_workspace
from voxpipe.params import Params
from voxpipe.secrets import SECRET_ENV_NAMES, is_secret_name, secret_values, uri_passwords, value_shape
from voxpipe.steps.launch import LaunchParams

# KFP v2 sets these on every task pod from the downward API (metadata.name, metadata.uid)
POD_NAME_ENV, POD_UID_ENV = "KFP_POD_NAME", "KFP_POD_UID"
PARAMS_ENV = "VOXPIPE_PARAMS"
SCRATCH = "/tmp"  # an emptyDir: the root filesystem is read-only
PARAMS_FILE = f"{SCRATCH}/voxpipe-params.yaml"
ASCEND_RESOURCE_PREFIX = "huawei.com/Ascend"
# keys holding workspace paths: relative to the PVC mount, and never outside it
WORKSPACE_PATHS = ("train.data", "train.out", "model.base", "tracking.work")
# set by a launcher (Volcano's pytorch plugin, Trainer's torch plugin) or by us: a user value would
# silently lose or break the rendezvous
RESERVED_ENV = frozenset(
    {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", PARAMS_ENV, "HCCL_IF_IP", "HOME", SECRET_ENV_NAMES,
     "PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
)
POD_SECURITY = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_REF = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)/([-._a-zA-Z0-9]+)$")
LABELS = {"app.kubernetes.io/name": "voxpipe", "app.kubernetes.io/component": "train"}
# pods that may reach the MLflow server (its NetworkPolicy, manifests/namespaced/mlflow-networkpolicy.yaml)
MLFLOW_CLIENT_LABEL = {"voxpipe.io/mlflow-client": "true"}


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


@dataclass(frozen=True)
class StepJob:
    """The step a job runs, the params sections it reads (carried whole), its path keys, its gang."""

    step: str
    carried: tuple[str, ...]
    paths: tuple[str, ...]  # keys holding workspace paths (a list value: each item)
    pods: int
    devices_per_pod: int

    @classmethod
    def train(cls, launch: LaunchParams) -> StepJob:
        return cls("train", CARRIED, WORKSPACE_PATHS, launch.pods, launch.devices_per_pod)

    @classmethod
    def encode(cls, launch: LaunchParams) -> StepJob:
        """launch.encode_devices accelerators: one pod when they fit in one, else full pods."""
        per_pod = min(launch.encode_devices, launch.devices_per_pod)
        if launch.encode_devices % per_pod:
            raise StepError(
                f"launch.encode_devices={launch.encode_devices} does not fill whole pods of "
                f"launch.devices_per_pod={launch.devices_per_pod}: use at most {launch.devices_per_pod} "
                f"or a multiple of it"
            )
        return cls("encode", ("model", "encode"), ("encode.manifest", "encode.out", "model.base"),
                   launch.encode_devices // per_pod, per_pod)


def torchrun_script(launch: LaunchParams, job: StepJob, rendezvous: str, grace: int) -> str:
    """The pod's shell command: write the params the job carries, then exec torchrun on `voxpipe <step>`.

    `rendezvous` holds the launcher's torchrun arguments (nodes, rank, processes per node, master), from
    the env its controller sets. torchrun passes SIGTERM on to its workers but SIGKILLs them after its
    shutdown timeout (30 s by default); raised to the pod's grace period so the trainer can finish its
    SIGTERM checkpoint (`grace`: voxpipe.launch.grace).
    """
    return (
        f'printf \'%s\' "${PARAMS_ENV}" > {PARAMS_FILE} && exec torchrun {rendezvous}'
        f" --shutdown_timeout={grace}"
        f" -m voxpipe.cli {job.step} --params {PARAMS_FILE}"
    )


CARRIED = ("model", "train", "tracking")  # what `voxpipe train` reads


def train_params_yaml(params: Params, carried: tuple[str, ...] = CARRIED) -> str:
    """The sections the step reads (`voxpipe train`'s by default), whole, so the job reproduces this run
    whatever params.yaml the image has."""
    return yaml.safe_dump(params.model_dump(by_alias=True, include=set(carried)), sort_keys=False)


def check_paths(params: Params, job: StepJob) -> None:
    """The step's workspace paths stay on the shared volume, whatever runs it."""
    flat = params.flat()
    for key in job.paths:
        for path in flat[key] if isinstance(flat[key], list) else [flat[key]]:
            inside_workspace(params.launch.mount_path, key, path)


def check_signing_key(params: Params, job: StepJob) -> None:
    """Training pods sign checkpoints with a key from a Secret, whatever runs them."""
    if job.step == "train" and KEY_ENV not in params.launch.secret_env:
        raise StepError(
            f"launch.secret_env has no {KEY_ENV}: the training pods would sign and verify checkpoints with a "
            "key file on the shared volume, which anyone who can write the checkpoints could replace. Create "
            f"a Secret (`kubectl create secret generic voxpipe-checkpoint --from-literal=key=$(openssl rand "
            f"-hex 32)`) and set launch.secret_env.{KEY_ENV}=voxpipe-checkpoint/key (docs/cluster.md)")


def metadata(job: StepJob, namespace: str, owner: Owner | None) -> dict[str, Any]:
    """A launched object's metadata: a server-picked name (generateName), voxpipe's labels, and the
    launcher pod as its owner, so deleting the pod (a deleted KFP run) garbage-collects the run."""
    meta: dict[str, Any] = {
        "generateName": f"voxpipe-{job.step}-", "namespace": namespace, "labels": labels(job)
    }
    if owner is not None:
        if owner.namespace != namespace:
            raise StepError(
                f"launch.namespace={namespace!r} differs from the launcher pod's namespace "
                f"{owner.namespace!r}: an ownerReference cannot cross namespaces (leave it empty)"
            )
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner.name, "uid": owner.uid}]
    return meta


def _secret_env(launch: LaunchParams) -> list[dict[str, Any]]:
    """launch.secret_env as secretKeyRef entries, and their names for voxpipe's redaction in the pod."""
    env = []
    for name, ref in sorted(launch.secret_env.items()):
        match = _SECRET_REF.match(ref)
        if not _ENV_NAME.match(name) or match is None or dns1123_subdomain(match[1]):
            raise StepError(
                f"launch.secret_env.{name}: {ref!r} is not an environment variable name mapped to a "
                "Kubernetes Secret reference `secret-name/key` (a DNS-1123 subdomain as the secret name; key "
                "of letters, digits, '-', '_', '.'). Name the Secret here, never its value."
            )
        env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": match[1], "key": match[3]}}})
    if env:
        env.append({"name": SECRET_ENV_NAMES, "value": ",".join(sorted(launch.secret_env))})
    return env


def _plain_env(launch: LaunchParams) -> list[dict[str, Any]]:
    clash = RESERVED_ENV & (launch.env.keys() | launch.secret_env.keys())
    if clash:
        raise StepError(f"launch.env / launch.secret_env set {sorted(clash)}: the launcher or voxpipe sets "
                       "them; leave them out")
    both = sorted(launch.env.keys() & launch.secret_env.keys())
    if both:
        raise StepError(f"{both} are in both launch.env and launch.secret_env: keep the secret_env entry")
    unknown = sorted(set(launch.env_not_secret) - launch.env.keys())
    if unknown:
        raise StepError(
            f"launch.env_not_secret names {', '.join(unknown)}, which launch.env does not set: list only the "
            "names of launch.env entries whose values look like secrets but are not (or remove them)")
    for name, value in launch.env.items():
        shape = None if name in launch.env_not_secret else value_shape(value)
        if is_secret_name(name) or (uri_passwords(value) and not shape):
            raise StepError(
                f"launch.env.{name} holds a secret (its name says so, or a URI password): a plain value "
                "would sit in the Job spec for anyone who can read Jobs. Store it in a Kubernetes Secret "
                f"and reference it instead: launch.secret_env.{name}=<secret-name>/<key> (docs/security.md)."
            )
        if shape:
            raise StepError(
                f"launch.env.{name} holds a secret by the shape of its value ({shape}), whatever its name: a "
                "plain value would sit in the Job spec for anyone who can read Jobs. Store it in a "
                "Kubernetes Secret and reference it instead: "
                f"launch.secret_env.{name}=<secret-name>/<key>; if the value only looks like a secret (a "
                f"public certificate), add {name} to launch.env_not_secret (docs/security.md).")
    return [{"name": k, "value": v} for k, v in sorted(launch.env.items())]


def container_env(launch: LaunchParams, params: Params, job: StepJob) -> list[dict[str, Any]]:
    """The step's env: its params, a writable HOME, the HCCL settings on Ascend, launch.env and secrets."""
    plain = _plain_env(launch)
    env: list[dict[str, Any]] = [
        {"name": PARAMS_ENV, "value": train_params_yaml(params, job.carried)},
        {"name": "HOME", "value": SCRATCH},  # caches (torch, CANN logs) need a writable home
    ]
    if is_ascend(launch):
        env += [
            # HCCL binds its rendezvous to this address: the pod IP, not whatever interface it guesses
            {"name": "HCCL_IF_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "HCCL_CONNECT_TIMEOUT", "value": str(launch.hccl_connect_timeout)},
            {"name": "HCCL_EXEC_TIMEOUT", "value": str(launch.hccl_exec_timeout)},
            {"name": "PYTORCH_NPU_ALLOC_CONF", "value": "expandable_segments:True"},
        ]
    return env + plain + _secret_env(launch)


def resources(launch: LaunchParams, job: StepJob) -> dict[str, Any]:
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if launch.accelerator:
        # extended resources must have request == limit
        requests[launch.accelerator] = limits[launch.accelerator] = job.devices_per_pod
    if launch.cpu:
        requests["cpu"] = launch.cpu
    if launch.memory:
        requests["memory"] = limits["memory"] = launch.memory
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def pod_template(launch: LaunchParams, params: Params, job: StepJob, script: str, grace: int,
                 container_name: str = "") -> dict[str, Any]:
    """The restricted pod running `script` (torchrun_script's) with the workspace, /dev/shm and /tmp."""
    container: dict[str, Any] = {
        "name": container_name or job.step,
        "image": launch.image,
        "imagePullPolicy": launch.image_pull_policy,
        # args, not command: the image's entrypoint stays (the CANN image's sources set_env.sh)
        "args": ["/bin/sh", "-c", script],
        "workingDir": launch.mount_path,
        "env": container_env(launch, params, job),
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
        "volumeMounts": [
            {"name": "workspace", "mountPath": launch.mount_path},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "scratch", "mountPath": SCRATCH},
        ],
    }
    needs = resources(launch, job)
    if needs:
        container["resources"] = needs
    spec: dict[str, Any] = {
        # a failed container must fail the pod, so the launcher restarts the whole gang
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": grace,
        "automountServiceAccountToken": False,  # training never calls the Kubernetes API
        "securityContext": copy.deepcopy(POD_SECURITY),
        "containers": [container],
        "volumes": [
            {"name": "workspace", "persistentVolumeClaim": {"claimName": launch.pvc}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": launch.shm_size}},
            {"name": "scratch", "emptyDir": {}},
        ],
    }
    if launch.node_selector:
        spec["nodeSelector"] = dict(launch.node_selector)
    if launch.tolerations:
        spec["tolerations"] = [dict(t) for t in launch.tolerations]
    return {"metadata": {"labels": {**labels(job), **MLFLOW_CLIENT_LABEL}}, "spec": spec}


def labels(job: StepJob) -> dict[str, str]:
    return {**LABELS, "app.kubernetes.io/component": job.step}


def _strings(node: Any, where: str, skip: set[str]) -> Any:
    """(where, text) of every string in a rendered job, but the env entries named in `skip`; an env
    entry's value is where its name says."""
    if isinstance(node, str):
        yield where, node
    elif isinstance(node, dict):
        if isinstance(node.get("name"), str) and isinstance(node.get("value"), str):
            if node["name"] in skip:
                return
            where = node["name"]
        for value in node.values():
            yield from _strings(value, where, skip)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value, where, skip)


def refuse_secret_values(objects: list[dict[str, Any]], env: list[dict[str, Any]], not_secret: list[str],
                         kind: str) -> None:
    """No secret value the launcher knows (its environment's, URI passwords) may be in what it creates
    (`kind`, e.g. "the Volcano job"): a params or env value holding one must come from a Secret instead.
    `env` is the step container's, to name the entry that holds one."""
    text = manifests_yaml(objects)
    # by value shape: every string of the spec but the launch.env values launch.env_not_secret lets through
    strings = _strings(objects, "the spec", set(not_secret))
    found = ((where, shape) for where, value in strings if (shape := value_shape(value)))
    where, shape = next(found, (None, None))
    if shape:
        raise StepError(
            f"{kind} would carry a secret in {where} by the shape of a value ({shape}): anyone who can "
            "read it would see it. Pass secrets only by reference (launch.secret_env, "
            "docs/security.md), never in params; a launch.env value that only looks like one goes in "
            "launch.env_not_secret.")
    for value in secret_values(texts=[text]):
        if value in text:
            where = next((e["name"] for e in env if value in e.get("value", "")), "the spec")
            raise StepError(
                f"{kind} would carry a secret value in {where} (a password in a URI, or the value of a "
                "secret environment variable of this process): anyone who can read it would see it. "
                "Pass secrets only by reference (launch.secret_env, docs/security.md), never in params."
            )


class _BlockStrDumper(yaml.SafeDumper):
    """Multi-line strings (the embedded params) as `|` blocks, readable in a dry run and a golden file."""


_BlockStrDumper.add_representer(
    str,
    lambda dumper, s: dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None),
)


def job_yaml(job: dict[str, Any]) -> str:
    return yaml.dump(job, Dumper=_BlockStrDumper, sort_keys=False, width=1000)


def manifests_yaml(objects: list[dict[str, Any]]) -> str:
    """The objects a launcher creates, in order, as one multi-document YAML (`kubectl apply -f -`)."""
    return "---\n".join(job_yaml(obj) for obj in objects)

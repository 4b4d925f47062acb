"""The `trainjob` launcher: the step as a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1).

Trainer turns a TrainJob and the (Cluster)TrainingRuntime it references into a JobSet: one Indexed
Job of `numNodes` pods, whose `node` container gets PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
PET_MASTER_ADDR and PET_MASTER_PORT from its torch plugin; the pod's torchrun reads them. Trainer
counts only "gpu" resources when it works out the processes per node, so an Ascend pod would get its
CPU count: numProcPerNode is always set, to the devices per pod.

voxpipe renders its own TrainingRuntime (the restricted pod of voxpipe/launch/pod.py, the workspace
volume, Volcano gang scheduling through podGroupPolicy.volcano, a whole-gang restart policy), named
after its content so that runs with the same pod shape share one; the run's own parts (image,
command, env with the params, node count, resources) are in the TrainJob. The TrainJob has no
annotations of its own, so the Volcano queue travels in a runtimePatches annotation, which also
reaches a named ClusterTrainingRuntime (launch.runtime) that uses Volcano.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from voxpipe.errors import StepError
from voxpipe.launch.base import Resource, State
from voxpipe.launch.followed import Followed
from voxpipe.launch.grace import grace_seconds
from voxpipe.launch.kube_rules import check_launch, check_objects
from voxpipe.launch.pod import (
    Owner,
    StepJob,
    check_paths,
    check_signing_key,
    labels,
    metadata,
    pod_template,
    refuse_secret_values,
    torchrun_script,
)
from voxpipe.params import Params
from voxpipe.steps.launch import LaunchParams
from voxpipe.train.trainer_status import EVERY_ENV, NAME_ENV, NAMESPACE_ENV

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
INSTALL_HINT = f"is Kubeflow Trainer v2 installed (the {GROUP}/{VERSION} CRDs), does the namespace exist?"
TRAINJOB = Resource(
    group=GROUP, version=VERSION, plural="trainjobs", kind="TrainJob", kubectl="trainjob",
    pod_label="jobset.sigs.k8s.io/jobset-name",  # the JobSet is named after the TrainJob
    first_pod=("batch.kubernetes.io/job-completion-index", "0"),  # PET_NODE_RANK 0
    missing_hint=INSTALL_HINT,
)
RUNTIME = Resource(
    group=GROUP, version=VERSION, plural="trainingruntimes", kind="TrainingRuntime",
    kubectl="trainingruntime", missing_hint=INSTALL_HINT,
)
NODE = "node"  # the replicated job and container Trainer configures
ANCESTOR = {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
PATCH_MANAGER = "voxpipe.io/launch"
RENDEZVOUS = ("--nnodes=$PET_NNODES --node_rank=$PET_NODE_RANK --nproc_per_node=$PET_NPROC_PER_NODE "
              "--master_addr=$PET_MASTER_ADDR --master_port=$PET_MASTER_PORT")
REPORTER = "voxpipe-trainer"  # the service account that may patch trainjobs/status (manifests/namespaced)
# launch keys that shape voxpipe's own TrainingRuntime, which a named ClusterTrainingRuntime replaces
RUNTIME_KEYS = ("max_retry", "ttl_seconds")


def _refuse_runtime_keys(launch: LaunchParams) -> None:
    default = LaunchParams()
    changed = [k for k in RUNTIME_KEYS if getattr(launch, k) != getattr(default, k)]
    if changed:
        key = changed[0]
        raise StepError(
            f"launch.{key}={getattr(launch, key)} cannot apply with launch.runtime={launch.runtime!r}: it "
            "sets the restart policy or TTL of voxpipe's own TrainingRuntime, and the JobSet policy of the "
            f"ClusterTrainingRuntime applies instead. Leave launch.{key} at its default "
            f"({getattr(default, key)}), or set launch.runtime= (empty) to train on voxpipe's runtime."
        )


def progress_env(launch: LaunchParams) -> list[dict[str, Any]]:
    """What the pod needs to report its progress: its TrainJob (the JobSet's name, from the pod's label),
    its namespace, and launch.progress_every_s."""
    def field(path: str) -> dict[str, Any]:
        return {"fieldRef": {"fieldPath": path}}

    return [
        {"name": NAME_ENV, "valueFrom": field(f"metadata.labels['{TRAINJOB.pod_label}']")},
        {"name": NAMESPACE_ENV, "valueFrom": field("metadata.namespace")},
        {"name": EVERY_ENV, "value": f"{launch.progress_every_s:g}"},
    ]


def _runtime(launch: LaunchParams, pod: dict[str, Any], job: StepJob, namespace: str) -> dict[str, Any]:
    """voxpipe's TrainingRuntime around the restricted pod; its name is a digest of its spec."""
    spec = {
        "mlPolicy": {"numNodes": job.pods, "torch": {}},
        "podGroupPolicy": {"volcano": {}},  # gang: all pods start together or none does
        "template": {"spec": {
            # a failed pod fails its Job (no per-pod retry: FSDP cannot go on with a rank missing), and
            # the JobSet restarts the whole gang up to launch.max_retry times
            "failurePolicy": {"maxRestarts": launch.max_retry},
            "ttlSecondsAfterFinished": launch.ttl_seconds,
            "replicatedJobs": [{
                "name": NODE,
                "template": {"metadata": {"labels": dict(ANCESTOR)},
                             "spec": {"backoffLimit": 0, "template": pod}},
            }],
        }},
    }
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingRuntime",
        "metadata": {"name": f"voxpipe-{job.step}-{digest}", "namespace": namespace, "labels": labels(job)},
        "spec": spec,
    }


def render_trainjob(
    params: Params, namespace: str, owner: Owner | None = None, job: StepJob | None = None
) -> list[dict[str, Any]]:
    """The TrainingRuntime (none with launch.runtime) and the TrainJob for one run of `job` (train by
    default); the server names the TrainJob (generateName)."""
    launch = params.launch
    job = job or StepJob.train(launch)
    check_launch(launch, namespace)
    check_paths(params, job)
    meta = metadata(job, namespace, owner)
    grace = grace_seconds(params, job.step, job.pods * job.devices_per_pod)
    pod = pod_template(launch, params, job, torchrun_script(launch, job, RENDEZVOUS, grace), grace,
                       container_name=NODE)
    check_signing_key(params, job)
    container = pod["spec"]["containers"][0]
    env = container.pop("env")
    if job.step == "train":
        env += progress_env(launch)
        # rank 0 patches its TrainJob's status.trainerStatus (voxpipe/train/trainer_status.py) as this
        # account, which may do nothing else; a named ClusterTrainingRuntime's pods need it too
        pod["spec"].update(serviceAccountName=REPORTER, automountServiceAccountToken=True)
    trainer: dict[str, Any] = {
        "image": launch.image,
        "args": container.pop("args"),
        "env": env,
        "numNodes": job.pods,
        "numProcPerNode": job.devices_per_pod,
    }
    if "resources" in container:
        trainer["resourcesPerNode"] = container.pop("resources")
    objects = []
    if launch.runtime:
        _refuse_runtime_keys(launch)
        ref = {"apiGroup": GROUP, "kind": "ClusterTrainingRuntime", "name": launch.runtime}
    else:
        runtime = _runtime(launch, pod, job, namespace)
        objects.append(runtime)
        ref = {"apiGroup": GROUP, "kind": "TrainingRuntime", "name": runtime["metadata"]["name"]}
    queue = {"template": {"metadata": {"annotations": {QUEUE_ANNOTATION: launch.queue}}}}
    objects.append({
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": meta,
        "spec": {
            "runtimeRef": ref,
            "trainer": trainer,
            "runtimePatches": [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": queue}],
        },
    })
    refuse_secret_values(objects, env, launch.env_not_secret, "the TrainJob")
    check_objects(objects, "the TrainJob")
    return objects


class TrainJobLauncher(Followed):
    resource = TRAINJOB

    def render(self, params: Params, namespace: str, owner: Owner | None,
               job: StepJob) -> list[dict[str, Any]]:
        return render_trainjob(params, namespace, owner, job)

    def submit(self, api: Any, objects: list[dict[str, Any]]) -> str:
        """The runtime first (one an earlier run made under the same digest name is the same), then
        the job."""
        from voxpipe.launch import watch

        for runtime in objects[:-1]:
            watch.create(api, RUNTIME, runtime, exists_ok=True)
        return watch.create(api, TRAINJOB, objects[-1])

    def state(self, status: dict[str, Any]) -> State:
        """The TrainJob's conditions (Created, Suspended, Complete, Failed) and its jobs' active pods."""
        true = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
        for phase in ("Failed", "Complete"):
            if phase in true:
                c = true[phase]
                detail = "; ".join(x for x in (c.get("reason"), c.get("message")) if x)
                return State(phase, None, done=phase == "Complete", failed=phase == "Failed",
                             reason=c.get("reason") or "", detail=detail)
        if "Suspended" in true:
            return State("Suspended", None, reason=true["Suspended"].get("reason") or "")
        if any((j.get("active") or 0) > 0 for j in status.get("jobsStatus") or []):
            return State("Running", None)
        return State("Created" if "Created" in true else "Pending", None)

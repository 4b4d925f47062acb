"""The `volcano` launcher: the step as a gang-scheduled Volcano Job (batch.volcano.sh/v1alpha1).

Volcano's pytorch plugin gives every pod MASTER_ADDR (the master task's pod, resolvable through the
svc plugin's headless service), MASTER_PORT, WORLD_SIZE (= pods) and RANK (master 0, workers 1..);
torchrun turns them into one process per device. PodEvicted / PodFailed restart the whole job, up to
launch.max_retry times. The pod itself is voxpipe/launch/pod.py's.
"""

from __future__ import annotations

import copy
from typing import Any

from voxpipe.launch.base import Resource, State
from voxpipe.launch.followed import Followed
from voxpipe.launch.grace import grace_seconds
from voxpipe.launch.kube_rules import check_launch, check_objects
from voxpipe.launch.pod import (
    Owner,
    StepJob,
    check_paths,
    check_signing_key,
    metadata,
    pod_template,
    refuse_secret_values,
    torchrun_script,
)
from voxpipe.params import Params

MASTER_PORT = 23456
FAILED_PHASES = frozenset({"Failed", "Aborted", "Terminated"})
JOB = Resource(
    group="batch.volcano.sh", version="v1alpha1", plural="jobs", kind="Volcano job", kubectl="vcjob",
    pod_label="volcano.sh/job-name",  # Volcano puts it on every pod of a job
    first_pod=("volcano.sh/task-spec", "master"),  # the pod's task name (master / worker)
    missing_hint="is Volcano installed (the batch.volcano.sh/v1alpha1 Job CRD), does the namespace exist?",
)
RENDEZVOUS = "--nnodes=$WORLD_SIZE --node_rank=$RANK --nproc_per_node={n} --master_addr=$MASTER_ADDR " \
             "--master_port=$MASTER_PORT"


def render_job(
    params: Params, namespace: str, owner: Owner | None = None, job: StepJob | None = None
) -> dict[str, Any]:
    """The Volcano Job for one run of `job` (train by default); the server picks the name (generateName)."""
    launch = params.launch
    job = job or StepJob.train(launch)
    check_launch(launch, namespace)
    check_paths(params, job)
    meta = metadata(job, namespace, owner)
    grace = grace_seconds(params, job.step, job.pods * job.devices_per_pod)
    script = torchrun_script(launch, job, RENDEZVOUS.format(n=job.devices_per_pod), grace)
    template = pod_template(launch, params, job, script, grace)
    check_signing_key(params, job)
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
    if job.pods > 1:
        tasks.append({"name": "worker", "replicas": job.pods - 1, "template": copy.deepcopy(template)})
    rendered = {
        "apiVersion": f"{JOB.group}/{JOB.version}",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "schedulerName": "volcano",
            "queue": launch.queue,
            "minAvailable": job.pods,  # gang: all pods start together or none does
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
    env = template["spec"]["containers"][0]["env"]
    refuse_secret_values([rendered], env, launch.env_not_secret, "the Volcano job")
    check_objects([rendered], "the Volcano job")
    return rendered


class VolcanoLauncher(Followed):
    resource = JOB

    def render(self, params: Params, namespace: str, owner: Owner | None,
               job: StepJob) -> list[dict[str, Any]]:
        return [render_job(params, namespace, owner, job)]

    def state(self, status: dict[str, Any]) -> State:
        """Volcano's `status.state.phase` (Pending, Running, Restarting, Completed, Failed...) and
        retryCount."""
        state = status.get("state") or {}
        phase = state.get("phase") or "Pending"
        detail = "; ".join(x for x in (state.get("reason"), state.get("message")) if x and x != phase)
        return State(phase, int(status.get("retryCount") or 0), done=phase == "Completed",
                     failed=phase in FAILED_PHASES, reason=state.get("reason") or "", detail=detail)

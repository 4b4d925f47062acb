"""`launch`'s section and the launch-train / launch-encode steps: a step run on a cluster.

The launchers' own settings (launch.runtime, ...) are composed in from voxpipe/launchers.py."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from voxpipe.launchers import LAUNCHERS, launcher_settings, listed
from voxpipe.section import Section
from voxpipe.steps import Step

# MLflow's credentials (manifests/namespaced/mlflow-deployment.yaml) and the checkpoint signing key
# (voxpipe/integrity.py): the Secrets docs/cluster.md has you create
# the sizes a Job may ask for: a typo (pods=100000000) is refused, not rendered
MAX_PODS = 1024
MAX_DEVICES_PER_POD = 64
# a Kubernetes resource quantity (apimachinery's resource.Quantity): a decimal number with an optional
# binary (Ki..Ei), decimal (n, u, m, k, M, G, T, P, E) or exponent suffix; "" = not set
QUANTITY = re.compile(r"^$|^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$")

DEFAULT_SECRET_ENV = {
    "MLFLOW_TRACKING_USERNAME": "voxpipe-mlflow/username",
    "MLFLOW_TRACKING_PASSWORD": "voxpipe-mlflow/password",
    "VOXPIPE_CHECKPOINT_KEY": "voxpipe-checkpoint/key",
}


class LaunchCore(Section):
    """launch's own settings: each launcher's are its settings model's (voxpipe/launchers.py)."""

    backend: Literal[*LAUNCHERS] = Field(  # type: ignore[valid-type]
        "volcano", description=f"what runs the pods: {listed()}", json_schema_extra={"wired": True},
    )
    namespace: str = Field("", description='"" = the launcher pod\'s own namespace ("default" outside a pod)')
    queue: str = Field("voxpipe", description="Volcano queue (manifests/queue.yaml), for both backends: the "
                       "Job's spec.queue, the TrainJob's PodGroup (through a runtimePatches annotation)")
    image: str = Field("voxpipe:0.1.0-npu", description="training image (images/Dockerfile.npu, .cuda, .cpu)",
                       json_schema_extra={"wired": True})
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="the pods' imagePullPolicy"
    )
    pods: int = Field(2, ge=1, le=MAX_PODS, description="pods (nodes): one master + pods-1 workers, "
                      f"scheduled all or none (at most {MAX_PODS})")
    devices_per_pod: int = Field(8, ge=1, le=MAX_DEVICES_PER_POD, description="accelerators per pod = "
                                 f"torchrun processes per pod (at most {MAX_DEVICES_PER_POD})")
    encode_devices: int = Field(
        1, ge=1, le=MAX_PODS * MAX_DEVICES_PER_POD, description="accelerators for `launch-encode` (one "
        "encode process each): one pod when they fit in devices_per_pod, else whole pods of "
        "devices_per_pod. `pods` is train's"
    )
    accelerator: str = Field(
        "huawei.com/Ascend910",
        description='device resource: huawei.com/Ascend910 (adds the HCCL env), nvidia.com/gpu, "" = CPU',
        json_schema_extra={"wired": True},
    )
    cpu: str = Field("", description='CPU request per pod, a Kubernetes quantity, e.g. "32" or "500m" '
                     '("" = none)')
    memory: str = Field("", description='memory request = limit per pod, a Kubernetes quantity, e.g. '
                        '"512Gi" ("" = none)')
    shm_size: str = Field("64Gi", min_length=1, description="size limit of the memory-backed /dev/shm (a "
                          "Kubernetes quantity)")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="the pods' nodeSelector, e.g. {accelerator-type: module-910b-8}",
        json_schema_extra={"wired": True},
    )
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="as in a pod spec",
                                              json_schema_extra={"wired": True})
    pvc: str = Field("voxpipe-workspace", description="ReadWriteMany PVC: data, checkpoints, exports",
                     json_schema_extra={"wired": True})
    mount_path: str = Field(
        "/workspace", description="PVC mount and working directory: relative train paths land on the PVC",
        json_schema_extra={"wired": True},
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="extra env, e.g. MLFLOW_TRACKING_URI; no secrets: see secret_env"
    )
    env_not_secret: list[str] = Field(
        default_factory=list,
        description="names of launch.env entries whose values only look like secrets (a public certificate, "
        "a random-looking build id): launch-train does not refuse them by value shape, and MLflow params "
        "keep them; a secret-shaped name or a URI password is refused all the same (docs/security.md)",
    )
    secret_env: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_SECRET_ENV),
        description="env from Kubernetes Secrets, by reference: {ENV_NAME: secret-name/key} (never a value)",
    )
    max_retry: int = Field(3, ge=0, description="whole-job restarts after an evicted or failed pod (Volcano "
                           "Job maxRetry; with trainjob, the JobSet failurePolicy.maxRestarts of voxpipe's "
                           "own TrainingRuntime: refused with launch.runtime, whose own policy applies)")
    ttl_seconds: int = Field(
        86400, ge=60, description="a finished job (and its pods) is deleted after this; >= 60 so the watcher "
        "still reads the final phase and the failed pod's log (Volcano Job, or the JobSet of voxpipe's own "
        "TrainingRuntime: refused with launch.runtime)"
    )
    grace_seconds: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        "auto", description="SIGTERM-to-SIGKILL grace in seconds: time for a last checkpoint. auto = the "
        "plan's per-rank checkpoint save time (plan.checkpoint_write_gbps, launch's world) x 1.5 + 120 s, "
        "at least 120; a number wins as it is"
    )
    timeout_seconds: int = Field(7 * 86400, gt=0, description="then the watcher deletes the job and fails")
    poll_seconds: float = Field(15.0, gt=0, description="job status poll interval")
    log_tail_lines: int = Field(50, gt=0, description="lines of the failing pod's log put in the error")
    hccl_connect_timeout: int = Field(1200, gt=0, description="HCCL_CONNECT_TIMEOUT seconds (Ascend)")
    hccl_exec_timeout: int = Field(1800, gt=0, description="HCCL_EXEC_TIMEOUT seconds (Ascend)")
    dry_run: bool = Field(False, description="print the YAML of what would be created, submit nothing",
                          json_schema_extra={"wired": True})

    @field_validator("cpu", "memory", "shm_size")
    @classmethod
    def _quantity(cls, value: str) -> str:
        if not QUANTITY.match(value):
            raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 512Gi, 64Gi, 500m, 32)")
        return value


# the core's fields, then every launcher's settings (voxpipe/launchers.py): a launcher with a setting is
# registered there and named nowhere here
class LaunchParams(*launcher_settings(), LaunchCore):  # type: ignore[misc]
    """`launch-train` / `launch-encode`: the step run on a cluster as gang-scheduled pods, torchrun in every
    pod, through launch.backend (a Volcano Job or a Kubeflow Trainer TrainJob)."""


# what `launch.grace_seconds: auto` plans a rank's checkpoint save from (voxpipe/launch/grace.py)
GRACE_PLAN = ("model.base", "model.preset", "plan.checkpoint_write_gbps", "plan.device", "train.dtype",
              "train.lora")


ORDER = 80
SECTIONS = {"launch": LaunchParams}

STEPS = (
    Step("launch-train", "run the train section on a cluster as gang-scheduled pods (launch.backend: a "
         "Volcano Job or a Kubeflow Trainer TrainJob; torchrun per pod) and watch it",
         target="voxpipe.launch.step:launch_train", reads=("launch", "train.out", *GRACE_PLAN),
         hide=("train.out",)),
    Step("launch-encode", "run the encode section on a cluster (launch.backend) on launch.encode_devices "
         "accelerators (torchrun per pod) and watch it", target="voxpipe.launch.step:launch_encode",
         reads=("launch", "encode.out", *GRACE_PLAN), hide=("encode.out",)),
)

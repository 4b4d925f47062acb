"""The `trainjob` launcher: a Kubeflow Trainer v2 TrainJob and its TrainingRuntime, checked against
Trainer's own CRD schemas (tests/data/trainer-crds, SOURCE.md), rendered for every recipe, and
followed through its conditions against tests/kube_fake.py."""

from __future__ import annotations

import copy
import os
import stat
import subprocess
import typing
from functools import cache
from pathlib import Path

import crds
import jsonschema
import kubernetes_validate
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kube_fake import FakeCluster, pod
from kubernetes import client

from voxpipe.cli import main
from voxpipe.errors import StepError
from voxpipe.launch.pod import PARAMS_ENV, StepJob
from voxpipe.launch.trainjob import QUEUE_ANNOTATION, TrainJobLauncher, render_trainjob
from voxpipe.launch.watch import run_job
from voxpipe.params import Params, load_params, recipe_names
from voxpipe.steps.launch import LaunchParams

ROOT = Path(__file__).resolve().parents[1]
# today's CRDs (main, SOURCE.md) and the v2.3.0 release's (its TrainJob has status.trainerStatus)
RELEASES = {"main": Path(__file__).parent / "data" / "trainer-crds",
            "v2.3.0": Path(__file__).parent / "data" / "trainer-crds-v2.3.0"}
K8S_VERSION = kubernetes_validate.latest_version()
NAME = "voxpipe-train-00000"
FAST = {"timeout_s": 30, "poll_s": 0.01, "tail_lines": 5}


@cache
def crd_schema(kind: str, release: str = "main") -> dict:
    plural = {"TrainJob": "trainjobs", "TrainingRuntime": "trainingruntimes"}[kind]
    return crds.crd_schema(RELEASES[release] / f"trainer.kubeflow.org_{plural}.yaml", kind, "v1alpha1")


@cache
def _validator(kind: str, release: str) -> jsonschema.protocols.Validator:
    return crds.validator(crd_schema(kind, release))


def validate(obj: dict, release: str = "main") -> None:
    _validator(obj["kind"], release).validate(obj)


def node_pod(runtime: dict, trainjob: dict) -> dict:
    """The `node` pod as Trainer makes it: the runtime's pod, the TrainJob's image, args, env, resources."""
    (replicated,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    spec = copy.deepcopy(replicated["template"]["spec"]["template"]["spec"])
    trainer = trainjob["spec"]["trainer"]
    container = spec["containers"][0]
    container.update(image=trainer["image"], args=trainer["args"], env=trainer["env"])
    if "resourcesPerNode" in trainer:
        container["resources"] = trainer["resourcesPerNode"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "j-node-0-0"}, "spec": spec}


@pytest.mark.parametrize("name", recipe_names())
def test_every_recipe_renders_a_trainjob_and_runtime_that_trainer_accepts(name):
    params = load_params(ROOT / "params.yaml", recipe=name, overrides=["launch.backend=trainjob"])
    launch = params.launch
    runtime, trainjob = render_trainjob(params, "ml")
    for release in RELEASES:
        validate(runtime, release)
        validate(trainjob, release)
    kubernetes_validate.validate(node_pod(runtime, trainjob), K8S_VERSION, strict=True)
    trainer = trainjob["spec"]["trainer"]
    # Trainer counts only "gpu" resources: numProcPerNode always explicit, an int, the devices per pod
    assert type(trainer["numProcPerNode"]) is int and trainer["numProcPerNode"] == launch.devices_per_pod
    assert trainer["numNodes"] == launch.pods
    assert trainjob["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime",
                                              "name": runtime["metadata"]["name"]}
    assert runtime["spec"]["podGroupPolicy"] == {"volcano": {}} and "torch" in runtime["spec"]["mlPolicy"]
    (patch,) = trainjob["spec"]["runtimePatches"]
    annotations = patch["trainingRuntimeSpec"]["template"]["metadata"]["annotations"]
    assert annotations == {QUEUE_ANNOTATION: launch.queue}
    if launch.accelerator:
        assert trainer["resourcesPerNode"]["limits"][launch.accelerator] == launch.devices_per_pod
    env = {e["name"]: e for e in trainer["env"]}
    assert ("HCCL_IF_IP" in env) == launch.accelerator.startswith("huawei.com/Ascend")
    assert env[PARAMS_ENV]["value"]  # the params travel with the job
    assert all("value" not in e for e in trainer["env"] if "valueFrom" in e)
    assert env["VOXPIPE_CHECKPOINT_KEY"]["valueFrom"]["secretKeyRef"]  # secrets by reference


def test_npu_recipes_carry_an_integer_process_count_and_a_volcano_gang():
    for name in ("voxcpm2-full-npu16", "voxcpm2-lora-npu8"):
        params = load_params(ROOT / "params.yaml", recipe=name, overrides=["launch.backend=trainjob"])
        runtime, trainjob = render_trainjob(params, "ml")
        assert trainjob["spec"]["trainer"]["numProcPerNode"] == params.launch.devices_per_pod == 8
        assert "volcano" in runtime["spec"]["podGroupPolicy"]


def test_the_crd_check_would_catch_a_broken_trainjob():
    _, trainjob = render_trainjob(Params(launch=LaunchParams(backend="trainjob")), "ml")
    validate(trainjob)
    for breakage in ({"numProcPerNode": "auto"}, {"numProcsPerNode": 8}):  # a string; a misspelt key
        broken = copy.deepcopy(trainjob)
        broken["spec"]["trainer"].pop("numProcPerNode")
        broken["spec"]["trainer"].update(breakage)
        with pytest.raises(jsonschema.ValidationError):
            validate(broken)
    broken = copy.deepcopy(trainjob)
    broken["spec"]["annotations"] = {QUEUE_ANNOTATION: "voxpipe"}  # TrainJob has no spec.annotations
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)


def test_same_pod_shape_same_runtime_name_and_encode_renders_too():
    a, _ = render_trainjob(Params(launch=LaunchParams(backend="trainjob")), "ml")
    b, _ = render_trainjob(Params(launch=LaunchParams(backend="trainjob"), train={"lr": 3e-5}), "ml")
    c, _ = render_trainjob(Params(launch=LaunchParams(backend="trainjob", shm_size="32Gi")), "ml")
    assert a["metadata"]["name"] == b["metadata"]["name"] != c["metadata"]["name"]
    encode = LaunchParams(backend="trainjob", encode_devices=16)
    runtime, trainjob = render_trainjob(Params(launch=encode), "ml", job=StepJob.encode(encode))
    validate(runtime)
    validate(trainjob)
    assert (trainjob["spec"]["trainer"]["numNodes"], trainjob["spec"]["trainer"]["numProcPerNode"]) == (2, 8)


def test_a_named_cluster_runtime_gets_only_the_trainjob_and_refuses_runtime_keys():
    launch = LaunchParams(backend="trainjob", runtime="torch-distributed")
    (trainjob,) = render_trainjob(Params(launch=launch), "ml")
    validate(trainjob)
    assert trainjob["spec"]["runtimeRef"]["kind"] == "ClusterTrainingRuntime"
    refused = r"launch\.max_retry=7 cannot apply with launch\.runtime='torch-distributed'"
    with pytest.raises(StepError, match=refused):
        render_trainjob(Params(launch=launch.model_copy(update={"max_retry": 7})), "ml")


def test_volcano_refuses_a_cluster_training_runtime(capsys):
    code = main(["launch-train", "--dry-run", "--set", "launch.runtime=torch-distributed"])
    assert code != 0
    assert "launch.runtime='torch-distributed' is a setting of launch.backend=trainjob, which " \
        "launch.backend=volcano does not use" in capsys.readouterr().err


def test_volcano_refuses_the_trainjob_progress_interval(capsys):
    code = main(["launch-train", "--dry-run", "--set", "launch.progress_every_s=12"])
    assert code != 0
    assert "launch.progress_every_s=12.0 is a setting of launch.backend=trainjob" in capsys.readouterr().err


def test_dry_run_prints_the_runtime_then_the_trainjob(capsys):
    assert main(["launch-train", "--dry-run", "--recipe", "voxcpm2-full-npu16",
                 "--set", "launch.backend=trainjob"]) == 0
    runtime, trainjob = yaml.safe_load_all(capsys.readouterr().out)
    assert (runtime["kind"], trainjob["kind"]) == ("TrainingRuntime", "TrainJob")
    validate(runtime)
    validate(trainjob)


def test_the_pod_script_runs_torchrun_from_trainers_env(tmp_path):
    _, trainjob = render_trainjob(Params(launch=LaunchParams(backend="trainjob", devices_per_pod=4)), "ml")
    fake = tmp_path / "bin" / "torchrun"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$RECORD"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    trainer = trainjob["spec"]["trainer"]
    env = {e["name"]: e["value"] for e in trainer["env"] if "value" in e}
    env |= {"PATH": f"{fake.parent}:{os.environ['PATH']}", "RECORD": str(tmp_path / "argv"),
            # what Trainer's torch plugin sets on the node container
            "PET_NNODES": "2", "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]), "PET_NODE_RANK": "1",
            "PET_MASTER_ADDR": "voxpipe-train-x-node-0-0.voxpipe-train-x", "PET_MASTER_PORT": "29500"}
    script = trainer["args"][-1].replace("/tmp/voxpipe-params.yaml", str(tmp_path / "params.yaml"))
    subprocess.run(["/bin/sh", "-c", script], env=env, check=True)
    argv = (tmp_path / "argv").read_text().split()
    assert argv[:5] == ["--nnodes=2", "--node_rank=1", "--nproc_per_node=4",
                        "--master_addr=voxpipe-train-x-node-0-0.voxpipe-train-x", "--master_port=29500"]
    assert yaml.safe_load((tmp_path / "params.yaml").read_text())["train"]


# --- the watch, against tests/kube_fake.py ----------------------------------------------------------

def objects() -> list[dict]:
    return render_trainjob(Params(launch=LaunchParams(backend="trainjob")), "ml")


def condition(kind: str, reason: str = "", message: str = "") -> dict:
    return {"type": kind, "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": "2026-12-02T04:00:00Z"}


def api_for(cluster: FakeCluster) -> client.ApiClient:
    return client.ApiClient(client.Configuration(host=cluster.url))


def test_completed_trainjob_creates_its_runtime_and_follows_the_conditions():
    statuses = [{}, {"conditions": [condition("Created")]},
                {"conditions": [condition("Created")], "jobsStatus": [{"name": "node", "active": 2}]},
                {"conditions": [condition("Created"), condition("Complete", "JobSetCompleted")]}]
    logged = []
    rendered = objects()
    with FakeCluster(statuses=statuses) as cluster:
        outcome = run_job(api_for(cluster), TrainJobLauncher(), rendered, log=logged.append, **FAST)
        assert list(cluster.runtimes) == [rendered[0]["metadata"]["name"]]
        assert cluster.jobs[NAME]["spec"] == rendered[1]["spec"]
    assert (outcome.name, outcome.phase, outcome.restarts) == (NAME, "Complete", None)
    assert [line.split(": ")[1].split(",")[0].split(" ")[0] for line in logged[1:]] == \
        ["Pending", "Created", "Running", "Complete"]


def test_a_second_run_reuses_the_runtime_of_the_same_shape():
    rendered = objects()
    with FakeCluster(statuses=[{"conditions": [condition("Complete")]}]) as cluster:
        cluster.runtimes[rendered[0]["metadata"]["name"]] = rendered[0]
        assert run_job(api_for(cluster), TrainJobLauncher(), rendered, **FAST).phase == "Complete"


def test_failed_trainjob_names_the_pod_that_failed_first_and_shows_its_log_tail():
    pods = [
        pod(f"{NAME}-node-0-0-a", "master", "Failed", exit_code=1, finished="2026-12-02T04:05:00Z"),
        pod(f"{NAME}-node-0-1-b", "worker", "Failed", exit_code=1, finished="2026-12-02T04:01:00Z"),
    ]
    logs = {f"{NAME}-node-0-0-a": "NCCL timeout\n",
            f"{NAME}-node-0-1-b": "".join(f"line {i}\n" for i in range(50)) + "RuntimeError: CUDA OOM\n"}
    failed = {"conditions": [condition("Created"), condition("Failed", "JobSetFailed", "jobset failed")]}
    statuses = [{"conditions": [condition("Created")]}, failed]
    with FakeCluster(statuses=statuses, pods=pods, logs=logs) as cluster:
        with pytest.raises(StepError) as err:
            run_job(api_for(cluster), TrainJobLauncher(), objects(), **FAST)
        assert cluster.deleted == []  # kept for `kubectl describe`
    message = str(err.value)
    assert f"TrainJob ml/{NAME} ended Failed (JobSetFailed; jobset failed)." in message
    assert f"pod {NAME}-node-0-1-b (exit code 1, Error)" in message and "RuntimeError: CUDA OOM" in message
    assert "line 44" not in message  # tail only


def test_a_timeout_deletes_the_trainjob():
    with FakeCluster(statuses=[{"conditions": [condition("Created")]}]) as cluster:
        with pytest.raises(StepError, match=f"TrainJob ml/{NAME} timed out .*; deleted it"):
            run_job(api_for(cluster), TrainJobLauncher(), objects(), timeout_s=0.1, poll_s=0.01, tail_lines=5)
        assert cluster.deleted == [NAME]


def test_a_missing_trainer_says_so():
    with FakeCluster(create_error=404) as cluster:
        with pytest.raises(StepError, match="is Kubeflow Trainer v2 installed"):
            run_job(api_for(cluster), TrainJobLauncher(), objects(), **FAST)


# -- issue 41 part 5: what renders is what the API server and Trainer's CRDs accept ------------------------
def test_the_runtime_name_limit_is_the_crds_own():
    from voxpipe.launch.kube_rules import RUNTIME_NAME_MAX

    schema = crd_schema("TrainJob")
    name = schema["properties"]["spec"]["properties"]["runtimeRef"]["properties"]["name"]
    assert name["maxLength"] == RUNTIME_NAME_MAX


@cache
def crd_validator(kind: str, release: str = "main") -> typing.Any:
    return crds.validator(crd_schema(kind, release))


# Kubernetes' published patterns, written out here independently of voxpipe/launch/kube_rules.py
DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
LABEL_VALUE = r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?"
NAME_PART = r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]"
QUALIFIED = rf"({DNS_LABEL}(\.{DNS_LABEL})*/)?{NAME_PART}"
HOSTILE_TEXT = st.text(alphabet="aZ9-_./ ~", min_size=0, max_size=70) | st.sampled_from(
    ["-ml", "ML", "a" * 63, "a" * 64, "Bogus", "NoWay", "", "kubernetes.io/Arch_", "x/y/z", "8Gx"])


def hostile_or(*ordinary: str) -> st.SearchStrategy[str]:
    """A hostile value one time in eight, else an ordinary one: about half the examples render and are
    checked, the others are refused for one or more keys."""
    return st.integers(0, 7).flatmap(lambda i: HOSTILE_TEXT if i == 0 else st.sampled_from(ordinary))


def accepted(objects: list[dict]) -> None:
    """What the API server and Trainer's CRDs would accept: the CRD schemas, the node pod's schema, and
    the name, label and toleration rules the schemas do not hold."""
    import re

    for obj in objects:
        for release in RELEASES:
            crd_validator(obj["kind"], release).validate(obj)
        assert re.fullmatch(DNS_LABEL, obj["metadata"]["namespace"])
    runtime = objects[0]
    (replicated,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    pod_spec = replicated["template"]["spec"]["template"]["spec"]
    kubernetes_validate.validate(node_pod(runtime, objects[-1]), K8S_VERSION, strict=True)
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        assert re.fullmatch(QUALIFIED, key) and re.fullmatch(LABEL_VALUE, value)
    for toleration in pod_spec.get("tolerations") or []:
        assert toleration.get("operator", "Equal") in ("Exists", "Equal")
        assert toleration.get("effect", "") in ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
        assert not toleration.get("key") or re.fullmatch(QUALIFIED, toleration["key"])
    queue = objects[-1]["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["metadata"]
    assert re.fullmatch(DNS_LABEL, queue["annotations"][QUEUE_ANNOTATION])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(namespace=hostile_or("ml", "team-a"), queue=hostile_or("voxpipe", "q1"),
       selector_key=hostile_or("zone", "kubernetes.io/arch"), selector_value=hostile_or("a", "module-910b-8"),
       tol_key=hostile_or("huawei.com/Ascend910"), operator=hostile_or("Exists"),
       effect=hostile_or("NoSchedule", "NoExecute"))
def test_hostile_values_are_refused_in_one_paragraph_or_render_what_is_accepted(
        namespace, queue, selector_key, selector_value, tol_key, operator, effect):
    """Any mix of hostile and ordinary values: a one-paragraph StepError, or objects the server accepts."""
    toleration = {"key": tol_key, "operator": operator, "effect": effect}
    launch = {"queue": queue, "node_selector": {selector_key: selector_value}, "tolerations": [toleration],
              "backend": "trainjob"}
    params = Params.model_validate({"launch": launch})
    try:
        objects = render_trainjob(params, namespace)
    except StepError as e:
        assert "\n" not in str(e)
        return
    accepted(objects)

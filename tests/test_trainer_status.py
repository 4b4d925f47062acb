"""Issue 47 part 2: train's progress in its TrainJob's `status.trainerStatus`, through the Kubernetes API
(the local fake, tests/kube_fake.py) with the official client, and validated against Kubeflow Trainer
v2.3.0's own TrainJob CRD (tests/data/trainer-crds-v2.3.0)."""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path

import crds
import jsonschema
import pytest
import yaml
from kube_fake import FakeCluster
from kubernetes import client

from voxpipe.launch.trainjob import REPORTER, render_trainjob
from voxpipe.params import Params, load_params
from voxpipe.steps.launch import LaunchParams
from voxpipe.train.trainer_status import (
    EVERY_ENV,
    NAME_ENV,
    NAMESPACE_ENV,
    TrainerStatusReporter,
    reporter_from_env,
)

ROOT = Path(__file__).resolve().parents[1]
V23 = Path(__file__).parent / "data" / "trainer-crds-v2.3.0" / "trainer.kubeflow.org_trainjobs.yaml"


@cache
def trainjob_schema() -> dict:
    return crds.crd_schema(V23, "TrainJob", "v1alpha1")


def check_v23(trainjob: dict) -> None:
    """The TrainJob, status included, as Trainer v2.3.0's CRD takes it (the CEL rule written out)."""
    crds.validator(trainjob_schema()).validate(trainjob)
    status = trainjob.get("status", {}).get("trainerStatus")
    assert status is None or "lastUpdatedTime" in status  # has(self.lastUpdatedTime)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def submitted(cluster: FakeCluster) -> str:
    """A rendered TrainJob created in the fake; its server-given name."""
    trainjob = render_trainjob(Params(launch=LaunchParams(backend="trainjob")), "ml")[-1]
    api = client.CustomObjectsApi(client.ApiClient(client.Configuration(host=cluster.url)))
    created = api.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", "ml", "trainjobs",
                                                  trainjob)
    return created["metadata"]["name"]


def reporter(cluster: FakeCluster, name: str, clock: Clock, every: float = 30.0) -> TrainerStatusReporter:
    api = client.ApiClient(client.Configuration(host=cluster.url))
    return TrainerStatusReporter(api, "ml", name, every, first_step=0, clock=clock)


RECORD = {"loss": 1.2345678, "tokens_per_s": 5120.5, "mfu": 0.41, "grad_norm": 3.0}


def test_progress_reaches_the_trainjob_status_at_most_every_interval_and_at_the_end():
    clock = Clock()
    with FakeCluster() as cluster:
        name = submitted(cluster)
        status = reporter(cluster, name, clock)
        sent = []
        for step in range(1, 101):  # 100 steps, 2 s each: 200 s, so a patch at steps 1, 16, 31, ... and 100
            clock.now += 2.0
            sent.append(status.update(step, 100, RECORD, final=step == 100))
        patches = cluster.status_patches
        job = cluster.jobs[name]
    assert [i + 1 for i, ok in enumerate(sent) if ok] == [1, 16, 31, 46, 61, 76, 91, 100]
    assert len(patches) == 8
    first, last = patches[0]["status"]["trainerStatus"], patches[-1]["status"]["trainerStatus"]
    assert first["progressPercentage"] == 1 and first["estimatedRemainingSeconds"] == 198
    assert last["progressPercentage"] == 100 and last["estimatedRemainingSeconds"] == 0
    assert {m["name"]: m["value"] for m in last["metrics"]} == {"loss": "1.23457", "tokens_per_s": "5120.5",
                                                               "mfu": "0.41"}
    assert job["status"]["trainerStatus"] == last
    check_v23(job)
    for patch in patches:
        check_v23({**job, "status": patch["status"]})


def test_an_unknown_figure_is_left_out_not_written_as_a_guess():
    """Before a step of this run has finished there is no pace (no remaining time); a non-finite loss or
    a missing MFU peak is no metric."""
    clock = Clock()
    with FakeCluster() as cluster:
        name = submitted(cluster)
        record = {"loss": float("nan"), "tokens_per_s": 10.0, "mfu": None}
        reporter(cluster, name, clock).update(0, 10, record)
        (patch,) = cluster.status_patches
    status = patch["status"]["trainerStatus"]
    assert "estimatedRemainingSeconds" not in status
    assert status["metrics"] == [{"name": "tokens_per_s", "value": "10"}]
    check_v23({**cluster.jobs[name], "status": patch["status"]})


def test_the_v23_crd_refuses_what_the_status_must_not_be():
    """The check can fail: a percentage over 100, a float, a metric without a value."""
    with FakeCluster() as cluster:
        name = submitted(cluster)
        job = cluster.jobs[name]
    good = {"progressPercentage": 5, "lastUpdatedTime": "2026-12-05T07:00:00Z"}
    check_v23({**job, "status": {"trainerStatus": good}})
    for bad in ({"progressPercentage": 101}, {"progressPercentage": 5.5}, {"metrics": [{"name": "loss"}]},
                {"estimatedRemainingSeconds": -1}, {"progress": 5}):
        with pytest.raises(jsonschema.ValidationError):
            check_v23({**job, "status": {"trainerStatus": {**good, **bad}}})


def test_a_refused_patch_never_stops_training_and_is_said_once_with_the_way_out(caplog):
    clock = Clock()
    with FakeCluster(patch_error=403) as cluster:
        name = submitted(cluster)
        status = reporter(cluster, name, clock, every=5)
        with caplog.at_level(logging.WARNING):
            results = []
            for step in range(1, 4):
                clock.now += 10
                results.append(status.update(step, 3, RECORD))
    assert results == [False, False, False]
    warnings = [r.getMessage() for r in caplog.records if "trainerStatus" in r.getMessage()]
    assert len(warnings) == 1 and "rbac.yaml" in warnings[0] and "403" in warnings[0]


def test_outside_a_trainjob_nothing_is_reported_and_without_a_token_it_says_so(caplog):
    assert reporter_from_env({}, 0) is None
    with caplog.at_level(logging.WARNING):  # the env of a TrainJob pod, but no service account token here
        assert reporter_from_env({NAME_ENV: "voxpipe-train-x", NAMESPACE_ENV: "ml"}, 0) is None
    assert "voxpipe-trainer" in caplog.text


def test_the_trainjob_pod_knows_its_job_and_runs_as_the_account_that_may_patch_its_status():
    params = load_params(ROOT / "params.yaml",
                         overrides=["launch.backend=trainjob", "launch.progress_every_s=12"])
    runtime, trainjob = render_trainjob(params, "ml")
    env = {e["name"]: e for e in trainjob["spec"]["trainer"]["env"]}
    assert env[NAME_ENV]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['jobset.sigs.k8s.io/jobset-name']"  # the JobSet is named after the TrainJob
    assert env[NAMESPACE_ENV]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env[EVERY_ENV]["value"] == "12"
    (replicated,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    pod = replicated["template"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == REPORTER and pod["automountServiceAccountToken"] is True
    rbac = list(yaml.safe_load_all((ROOT / "manifests" / "namespaced" / "rbac.yaml").read_text()))
    (role,) = [d for d in rbac if d["kind"] == "Role" and d["metadata"]["name"] == REPORTER]
    assert role["rules"] == [{"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs/status"],
                              "verbs": ["patch"]}]
    (binding,) = [d for d in rbac if d["kind"] == "RoleBinding" and d["metadata"]["name"] == REPORTER]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": REPORTER}]


def test_encode_pods_and_volcano_pods_keep_no_api_token():
    from voxpipe.launch.pod import StepJob
    from voxpipe.launch.volcano import render_job

    params = Params(launch=LaunchParams(backend="trainjob"))
    runtime, trainjob = render_trainjob(params, "ml", job=StepJob.encode(params.launch))
    (replicated,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert replicated["template"]["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert NAME_ENV not in {e["name"] for e in trainjob["spec"]["trainer"]["env"]}
    job = render_job(Params(), "ml")
    assert job["spec"]["tasks"][0]["template"]["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize("every", ["4.9", "0"])
def test_an_interval_under_trainers_floor_is_refused(every):
    from voxpipe.errors import StepError

    floor = "launch.progress_every_s: Input should be greater than or equal to 5"
    with pytest.raises(StepError, match=floor):
        load_params(ROOT / "params.yaml", overrides=[f"launch.progress_every_s={every}"])

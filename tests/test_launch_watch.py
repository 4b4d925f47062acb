"""Submit and watch through the official kubernetes client against tests/kube_fake.py (see its docstring)."""

import os
import signal
import threading

import pytest
import yaml
from kube_fake import FakeCluster, pod
from kubernetes import client

from voxpipe.cli import main
from voxpipe.errors import StepError
from voxpipe.launch.volcano import VolcanoLauncher, render_job
from voxpipe.launch.watch import run_job
from voxpipe.params import Params
from voxpipe.steps.launch import LaunchParams

VOLCANO = VolcanoLauncher()
NAME = "voxpipe-train-00000"  # the fake names generateName'd jobs with a counter
FAST = {"timeout_s": 30, "poll_s": 0.01, "tail_lines": 5}


def api_for(cluster: FakeCluster) -> client.ApiClient:
    return client.ApiClient(client.Configuration(host=cluster.url))


def job(pods: int = 2) -> dict:
    return render_job(Params(launch=LaunchParams(pods=pods)), "ml")


def phase(name: str, retries: int = 0, **state) -> dict:
    return {"state": {"phase": name, **state}, "retryCount": retries}


def test_completed_job_returns_its_outcome_and_logs_each_transition():
    statuses = [phase("Pending"), phase("Pending"), phase("Running"), phase("Running"), phase("Completed")]
    logged = []
    with FakeCluster(statuses=statuses) as cluster:
        outcome = run_job(api_for(cluster), VOLCANO, [job()], log=logged.append, **FAST)
        assert cluster.jobs[NAME]["spec"] == job()["spec"]  # submitted as rendered
    assert (outcome.name, outcome.namespace, outcome.phase, outcome.restarts) == (NAME, "ml", "Completed", 0)
    assert [line.split(": ")[1].split(",")[0] for line in logged[1:]] == ["Pending", "Running", "Completed"]


def test_failed_job_names_the_pod_that_failed_first_and_shows_its_log_tail():
    # the worker hit the real error first; the master then died of a collective timeout
    pods = [
        pod(f"{NAME}-master-0", "master", "Failed", exit_code=1, finished="2026-11-29T10:05:00Z"),
        pod(f"{NAME}-worker-0", "worker", "Failed", exit_code=1, finished="2026-11-29T10:01:00Z"),
        pod(f"{NAME}-worker-1", "worker", "Running"),
    ]
    logs = {
        f"{NAME}-master-0": "step 10\nHCCL timeout waiting for rank 1\n",
        f"{NAME}-worker-0": "".join(f"line {i}\n" for i in range(1, 200)) + "RuntimeError: NPU OOM\n",
    }
    statuses = [phase("Running"), phase("Restarting", 1), phase("Running", 1), phase("Failed", 3)]
    with FakeCluster(statuses=statuses, pods=pods, logs=logs) as cluster:
        with pytest.raises(StepError) as err:
            run_job(api_for(cluster), VOLCANO, [job(3)], **FAST)
        assert cluster.deleted == []  # a failed job is kept for `kubectl describe`; its TTL cleans up
    message = str(err.value)
    assert f"Volcano job ml/{NAME} ended Failed" in message and "after 3 restart(s)" in message
    assert f"pod {NAME}-worker-0 (exit code 1, Error)" in message
    assert message.endswith("line 196\nline 197\nline 198\nline 199\nRuntimeError: NPU OOM")
    assert "line 195" not in message and "HCCL timeout" not in message


def test_aborted_job_without_a_failed_container_reports_the_master():
    pods = [pod(f"{NAME}-worker-0", "worker", "Running"), pod(f"{NAME}-master-0", "master", "Running")]
    logs = {f"{NAME}-master-0": "step 1\nstep 2\n"}
    aborted = phase("Aborted", reason="Aborted", message="suspended by vcctl")
    expected = rf"(?s)ended Aborted \(suspended by vcctl\).*{NAME}-master-0 .*step 2"
    with FakeCluster(statuses=[aborted], pods=pods, logs=logs) as cluster:
        with pytest.raises(StepError, match=expected):
            run_job(api_for(cluster), VOLCANO, [job()], **FAST)


def test_evicted_pod_is_blamed_with_its_reason():
    pods = [
        pod(f"{NAME}-master-0", "master", "Running"),
        pod(f"{NAME}-worker-0", "worker", "Failed", reason="Evicted"),
    ]
    blamed = rf"(?s)pod {NAME}-worker-0 \(Evicted\).*log unavailable: HTTP 404"
    with FakeCluster(statuses=[phase("Terminated")], pods=pods) as cluster:
        with pytest.raises(StepError, match=blamed):
            run_job(api_for(cluster), VOLCANO, [job()], **FAST)


def test_a_pod_that_cannot_start_fails_fast_and_deletes_the_job():
    """A missing Secret leaves the container waiting forever: fail now, not after timeout_seconds."""
    pods = [pod(f"{NAME}-master-0", "master", "Pending",
                waiting=("CreateContainerConfigError", 'secret "voxpipe-mlflow" not found')),
            pod(f"{NAME}-worker-0", "worker", "Pending", waiting=("ContainerCreating", ""))]
    with FakeCluster(statuses=[phase("Pending")], pods=pods) as cluster:
        with pytest.raises(StepError) as err:
            run_job(api_for(cluster), VOLCANO, [job()], **FAST)
        assert cluster.deleted == [NAME]  # no half-started gang keeps holding accelerators
    message = str(err.value)
    assert f'pod {NAME}-master-0: CreateContainerConfigError: secret "voxpipe-mlflow" not found' in message
    assert "docs/cluster.md" in message and "Traceback" not in message


def test_timeout_deletes_the_job():
    with FakeCluster(statuses=[phase("Running")]) as cluster:
        with pytest.raises(StepError, match=f"ml/{NAME} timed out .*still Running.*deleted it"):
            run_job(api_for(cluster), VOLCANO, [job()], timeout_s=0.1, poll_s=0.01, tail_lines=5)
        assert cluster.deleted == [NAME]


def test_sigterm_from_a_cancelled_run_deletes_the_job():
    before = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    with FakeCluster(statuses=[phase("Running")]) as cluster:
        timer.start()
        with pytest.raises(StepError, match=f"cancelled by SIGTERM: Volcano job ml/{NAME}: deleted it"):
            run_job(api_for(cluster), VOLCANO, [job()], **FAST)
        assert cluster.deleted == [NAME]
    assert signal.getsignal(signal.SIGTERM) is before


def test_transient_api_errors_are_ridden_out_but_a_lost_server_fails():
    flaky = [{"http_error": 503}, {"http_error": 500}, phase("Completed")]
    with FakeCluster(statuses=flaky) as cluster:
        assert run_job(api_for(cluster), VOLCANO, [job()], **FAST).phase == "Completed"
    with FakeCluster(statuses=[{"http_error": 503}]) as cluster:
        with pytest.raises(StepError, match="lost the API server"):
            run_job(api_for(cluster), VOLCANO, [job()], **FAST)


@pytest.mark.parametrize(
    "code, hint", [(403, "manifests/namespaced/rbac.yaml"), (404, "is Volcano installed")]
)
def test_create_failures_say_what_to_fix(code, hint):
    with FakeCluster(create_error=code) as cluster:
        with pytest.raises(StepError, match=f"HTTP {code}.*{hint}"):
            run_job(api_for(cluster), VOLCANO, [job()], **FAST)


def test_cli_submits_with_the_kubeconfig_and_prints_the_outcome(tmp_path, monkeypatch, capsys):
    with FakeCluster(statuses=[phase("Running"), phase("Completed", 1)]) as cluster:
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": cluster.url}}],
            "users": [{"name": "me", "user": {"token": "t"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}],
            "current-context": "fake",
        }
        (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
        monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        code = main(["launch-train", "--namespace", "ml", "--pods", "2", "--set", "launch.poll_seconds=0.01"])
        submitted = cluster.jobs[NAME]
    assert code == 0
    assert f"Volcano job ml/{NAME} Completed after 1 restart(s)" in capsys.readouterr().out
    assert submitted["spec"]["minAvailable"] == 2 and submitted["metadata"]["namespace"] == "ml"

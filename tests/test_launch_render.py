"""The Volcano Job `voxpipe launch-train` renders: golden files, Kubernetes schemas, the pod's command.

Regenerate the golden files after an intended change with `make generate` (it runs the golden tests with
VOXPIPE_UPDATE_GOLDEN=1, writing into VOXPIPE_GOLDEN_DIR).
"""

import copy
import os
import re
import stat
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from voxpipe.cli import main
from voxpipe.errors import StepError
from voxpipe.launch.pod import PARAMS_ENV, Owner, StepJob, job_yaml
from voxpipe.launch.volcano import render_job
from voxpipe.params import Params, load_params
from voxpipe.steps.launch import LaunchParams
from voxpipe.steps.train import TrainParams

GOLDEN = Path(os.environ.get("VOXPIPE_GOLDEN_DIR") or Path(__file__).parent / "golden")
K8S_VERSION = kubernetes_validate.latest_version()


def ascend_variant():
    launch = LaunchParams(
        pods=4,
        devices_per_pod=8,
        image="registry.example.com/voxpipe:0.1.0-npu",
        cpu="64",
        memory="900Gi",
        node_selector={"accelerator-type": "module-910b-8"},
        tolerations=[{"key": "huawei.com/Ascend910", "operator": "Exists", "effect": "NoSchedule"}],
        env={"MLFLOW_TRACKING_URI": "http://mlflow:5000"},
    )
    train = TrainParams(out="runs/ft-001", max_steps=20000, lr=2e-5, activation_checkpointing=True)
    owner = Owner("finetune-abc12-system-container-impl", "0b0e5d1c-4b8e-4f0a-9d55-2f3c1e0a7b61", "kubeflow")
    return launch, train, "kubeflow", owner


def gpu_variant():
    launch = LaunchParams(
        pods=2, devices_per_pod=8, accelerator="nvidia.com/gpu", image="registry.example.com/voxpipe:0.1.0-cu"
    )
    return launch, TrainParams(), "ml", None


VARIANTS = {"ascend": ascend_variant, "gpu": gpu_variant}


def rendered(launch: LaunchParams, train: TrainParams, namespace: str, owner: Owner | None = None) -> dict:
    return render_job(Params(launch=launch, train=train), namespace, owner)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_job_matches_golden_file(variant):
    text = job_yaml(rendered(*VARIANTS[variant]()))
    path = GOLDEN / f"volcano-{variant}.yaml"
    if os.environ.get("VOXPIPE_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.read_text() == text, f"{path} is stale: run `make generate` if the change is intended"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_pod_template_passes_the_kubernetes_pod_schema(variant):
    job = rendered(*VARIANTS[variant]())
    for task in job["spec"]["tasks"]:
        template = task["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**template["metadata"], "name": f"job-{task['name']}-0"},
            "spec": template["spec"],
        }
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_schema_check_would_catch_a_broken_template():
    job = rendered(*gpu_variant())
    spec = job["spec"]["tasks"][0]["template"]["spec"]
    spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = [8]  # not a quantity
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": spec}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_gang_tasks_plugins_and_policies():
    launch, train, namespace, owner = ascend_variant()
    job = rendered(launch, train, namespace, owner)
    spec = job["spec"]
    assert (job["apiVersion"], job["kind"]) == ("batch.volcano.sh/v1alpha1", "Job")
    assert spec["schedulerName"] == "volcano" and spec["queue"] == "voxpipe"
    tasks = {t["name"]: t for t in spec["tasks"]}
    assert tasks["master"]["replicas"] == 1 and tasks["worker"]["replicas"] == 3
    assert spec["minAvailable"] == sum(t["replicas"] for t in spec["tasks"]) == 4  # gang: all or nothing
    assert spec["plugins"] == {"pytorch": ["--master=master", "--worker=worker", "--port=23456"], "svc": []}
    assert spec["policies"] == [{"events": ["PodEvicted", "PodFailed"], "action": "RestartJob"}]
    assert tasks["master"]["policies"] == [{"event": "TaskCompleted", "action": "CompleteJob"}]
    assert "policies" not in tasks["worker"]  # a worker finishing first must not complete the job
    assert spec["maxRetry"] == 3 and spec["ttlSecondsAfterFinished"] == 86400
    assert job["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": owner.name, "uid": owner.uid}
    ]
    pod = tasks["worker"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["restartPolicy"] == "Never"
    assert container["resources"]["limits"]["huawei.com/Ascend910"] == 8
    env = {e["name"]: e for e in container["env"]}
    assert env["HCCL_IF_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["HCCL_CONNECT_TIMEOUT"]["value"] == "1200" and env["HCCL_EXEC_TIMEOUT"]["value"] == "1800"
    assert env["PYTORCH_NPU_ALLOC_CONF"]["value"] == "expandable_segments:True"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["workspace"]["persistentVolumeClaim"]["claimName"] == "voxpipe-workspace"
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert container["workingDir"] == "/workspace"


def test_gpu_job_has_no_hccl_env_and_one_pod_has_no_worker_task():
    launch, train, namespace, _ = gpu_variant()
    env = {e["name"] for e in rendered(launch, train, namespace)["spec"]["tasks"][0]["template"]["spec"]
           ["containers"][0]["env"]}
    assert not any(name.startswith(("HCCL", "PYTORCH_NPU")) for name in env)
    single = rendered(launch.model_copy(update={"pods": 1}), train, namespace)
    assert [t["name"] for t in single["spec"]["tasks"]] == ["master"] and single["spec"]["minAvailable"] == 1


def _run_pod_script(job, tmp_path, rank, world):
    """Run the container's shell command with the env the pytorch plugin sets; torchrun is a recorder."""
    fake = tmp_path / "bin" / "torchrun"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$RECORD"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    container = job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env |= {
        "PATH": f"{fake.parent}:{os.environ['PATH']}",
        "RECORD": str(tmp_path / "argv"),
        "MASTER_ADDR": "voxpipe-train-x-master-0.voxpipe-train-x",
        "MASTER_PORT": "23456",
        "WORLD_SIZE": str(world),
        "RANK": str(rank),
    }
    subprocess.run(container["args"], env=env, check=True, cwd=tmp_path)
    return (tmp_path / "argv").read_text().splitlines()


def test_pod_command_runs_torchrun_on_voxpipe_train_with_the_exact_train_params(tmp_path):
    launch, train, namespace, owner = ascend_variant()
    job = rendered(launch, train, namespace, owner)
    argv = _run_pod_script(job, tmp_path, rank=2, world=4)
    grace = job["spec"]["tasks"][0]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert argv[:6] == [
        "--nnodes=4",
        "--node_rank=2",
        "--nproc_per_node=8",
        "--master_addr=voxpipe-train-x-master-0.voxpipe-train-x",
        "--master_port=23456",
        f"--shutdown_timeout={grace}",  # SIGTERM -> SIGKILL of the workers: the pod's grace, not 30 s
    ]
    assert argv[6:10] == ["-m", "voxpipe.cli", "train", "--params"]
    # what `voxpipe train` will read in the pod: the launcher's train section, unchanged
    assert load_params(argv[10]).train == train


def test_params_travel_in_the_job_not_in_the_image():
    launch, train, namespace, owner = ascend_variant()
    spec = rendered(launch, train, namespace, owner)["spec"]
    container = spec["tasks"][0]["template"]["spec"]["containers"][0]
    value = next(e["value"] for e in container["env"] if e["name"] == PARAMS_ENV)
    assert Params.model_validate(yaml.safe_load(value)).train == train


@pytest.mark.parametrize("key, path", [
    ("train.out", "/tmp/train"),  # absolute, off the volume
    ("train.out", "../../etc/escape"),  # relative, climbing out of the mount
    ("train.data", "runs/../../data"),
    ("model.base", "/workspace/../opt/voxpipe"),
    ("tracking.work", ".."),
])
def test_refuses_paths_that_escape_the_workspace(key, path, capsys, monkeypatch):
    monkeypatch.delenv("KFP_POD_NAME", raising=False)
    code = main(["launch-train", "--dry-run", "--set", f"{key}={path}"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert f"{key}={path!r}" in err and "outside the workspace volume mounted at /workspace" in err
    assert err.count("\n") == 1  # one paragraph


def test_workspace_paths_inside_the_mount_are_fine():
    launch = LaunchParams()
    for out in ("/workspace/runs/a", "runs/a/../b", "./runs/c"):
        rendered(launch, TrainParams(out=out), "ml")


def test_secrets_reach_the_pods_by_reference_only():
    launch = LaunchParams(secret_env={"HF_AUTH": "hf-credentials/token", "VOXPIPE_CHECKPOINT_KEY": "ck/key"})
    job = rendered(launch, TrainParams(), "ml")
    for task in job["spec"]["tasks"]:
        env = {e["name"]: e for e in task["template"]["spec"]["containers"][0]["env"]}
        assert env["HF_AUTH"] == {"name": "HF_AUTH", "valueFrom": {
            "secretKeyRef": {"name": "hf-credentials", "key": "token"}}}
        assert env["VOXPIPE_CHECKPOINT_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "ck", "key": "key"}
        assert env["VOXPIPE_REDACT_ENV"]["value"] == "HF_AUTH,VOXPIPE_CHECKPOINT_KEY"  # redaction in the pod
    defaults = {e["name"]: e for e in rendered(LaunchParams(), TrainParams(), "ml")["spec"]["tasks"][0]
                ["template"]["spec"]["containers"][0]["env"]}
    assert defaults["VOXPIPE_CHECKPOINT_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "voxpipe-checkpoint"
    assert defaults["MLFLOW_TRACKING_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "voxpipe-mlflow"


@pytest.mark.parametrize("launch, message", [
    (LaunchParams(env={"WANDB_KEY": "abc"}), "launch.env.WANDB_KEY holds a secret"),
    (LaunchParams(env={"HF_AUTH": "abc"}), "launch.secret_env.HF_AUTH=<secret-name>/<key>"),
    (LaunchParams(env={"MLFLOW_TRACKING_URI": "https://u:pw@mlflow.example"}), "URI password"),
    (LaunchParams(secret_env={"HF_AUTH": "hf_0123456789abcdef"}), "never its value"),
    (LaunchParams(secret_env={"HF_AUTH": "Upper/key"}), "not an environment variable name mapped"),
    (LaunchParams(env={"X": "1"}, secret_env={"X": "s/k"}), "both launch.env and launch.secret_env"),
])
def test_refuses_secret_values_in_the_job_spec(launch, message):
    with pytest.raises(StepError, match=re.escape(message)):
        rendered(launch, TrainParams(), "ml")


def test_refuses_a_secret_value_that_slipped_into_params(monkeypatch):
    """The launcher's own secrets (its pod's env) must not travel in the job, whichever param holds them."""
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "pw-Zx81-launcher")
    with pytest.raises(StepError, match="secret value in VOXPIPE_PARAMS"):
        rendered(LaunchParams(), TrainParams(out="runs/pw-Zx81-launcher"), "ml")
    with pytest.raises(StepError, match="secret value in LOG_DIR"):
        rendered(LaunchParams(env={"LOG_DIR": "/workspace/pw-Zx81-launcher"}), TrainParams(), "ml")


def test_refuses_env_that_would_break_the_rendezvous_and_cross_namespace_owners():
    with pytest.raises(StepError, match="MASTER_ADDR"):
        rendered(LaunchParams(env={"MASTER_ADDR": "x"}), TrainParams(), "ml")
    with pytest.raises(StepError, match="cannot cross namespaces"):
        rendered(LaunchParams(), TrainParams(), "ml", Owner("p", "u", "kubeflow"))


def test_cli_dry_run_prints_the_job(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("KFP_POD_NAME", raising=False)
    monkeypatch.chdir(tmp_path)  # no params.yaml: the schema's defaults, as `expected` renders them
    code = main(["launch-train", "--dry-run", "--pods", "3", "--namespace", "ml", "--set", "train.lr=0.0003"])
    assert code == 0
    job = yaml.safe_load(capsys.readouterr().out)
    expected = rendered(LaunchParams(pods=3, namespace="ml"), TrainParams(lr=0.0003), "ml")
    assert job == expected


def test_a_train_job_without_the_checkpoint_key_secret_is_refused():
    """Without VOXPIPE_CHECKPOINT_KEY from a Secret, the pods would sign with a key file on the volume."""
    launch = LaunchParams(secret_env={"MLFLOW_TRACKING_PASSWORD": "voxpipe-mlflow/password"})
    with pytest.raises(StepError) as err:
        rendered(launch, TrainParams(), "ml")
    message = str(err.value)
    assert "\n" not in message and "launch.secret_env has no VOXPIPE_CHECKPOINT_KEY" in message
    assert "launch.secret_env.VOXPIPE_CHECKPOINT_KEY=voxpipe-checkpoint/key" in message
    # encode signs nothing: its job needs no key
    render_job(Params(launch=launch), "ml", job=StepJob.encode(launch))


# -- issue 41 part 5: what the API server would refuse is refused before render and submit -------------------
GOOD_TOLERATION = {"key": "huawei.com/Ascend910", "operator": "Exists", "effect": "NoSchedule"}
HOSTILE = {  # launch values the API server refuses -> the params key the one-paragraph error names
    "namespace uppercase": ({"namespace": "ML"}, "launch.namespace="),
    "namespace underscore": ({"namespace": "Bad_NS"}, "launch.namespace="),
    "namespace leading dash": ({"namespace": "-ml"}, "launch.namespace="),
    "namespace 64 chars": ({"namespace": "n" * 64}, "launch.namespace="),
    "queue uppercase": ({"queue": "Voxpipe"}, "launch.queue="),
    "queue leading dash": ({"queue": "-q"}, "launch.queue="),
    "queue 64 chars": ({"queue": "q" * 64}, "launch.queue="),
    "pvc underscore": ({"pvc": "my_pvc"}, "launch.pvc="),
    "pvc 254 chars": ({"pvc": "p" * 254}, "launch.pvc="),
    "image with a space": ({"image": "voxpipe: 1"}, "launch.image="),
    "accelerator without a domain": ({"accelerator": "gpu"}, "launch.accelerator="),
    "accelerator with a bad name": ({"accelerator": "nvidia.com/-gpu"}, "launch.accelerator="),
    "mount path relative": ({"mount_path": "workspace"}, "launch.mount_path="),
    "env name with '='": ({"env": {"A=B": "1"}}, "launch.env.A=B="),
    "env name starting with a digit": ({"env": {"1X": "1"}}, "launch.env.1X="),
    "node selector key with a space": ({"node_selector": {"bad key": "x"}}, "launch.node_selector.bad key="),
    "node selector key 64 chars": ({"node_selector": {"k" * 64: "x"}}, f"launch.node_selector.{'k' * 64}="),
    "node selector key bad prefix": ({"node_selector": {"Bad_Prefix/k": "x"}}, "launch.node_selector.Bad"),
    "node selector value 64 chars": ({"node_selector": {"zone": "v" * 64}}, "launch.node_selector.zone="),
    "node selector value leading dash": ({"node_selector": {"zone": "-a"}}, "launch.node_selector.zone="),
    "toleration operator Bogus": ({"tolerations": [{**GOOD_TOLERATION, "operator": "Bogus"}]},
                                  "launch.tolerations[0].operator="),
    "toleration effect NoWay": ({"tolerations": [{**GOOD_TOLERATION, "effect": "NoWay"}]},
                                "launch.tolerations[0].effect="),
    "toleration key with a space": ({"tolerations": [{**GOOD_TOLERATION, "key": "bad key"}]},
                                    "launch.tolerations[0].key="),
    "toleration Exists with a value": ({"tolerations": [{**GOOD_TOLERATION, "value": "x"}]},
                                       "launch.tolerations[0].value="),
    "toleration Equal without a key": ({"tolerations": [{"operator": "Equal", "value": "x"}]},
                                       "launch.tolerations[0].operator="),
    "toleration value 64 chars": ({"tolerations": [{"key": "k", "operator": "Equal", "value": "v" * 64}]},
                                  "launch.tolerations[0].value="),
    "toleration seconds without NoExecute": ({"tolerations": [{**GOOD_TOLERATION, "tolerationSeconds": 60}]},
                                             "launch.tolerations[0].tolerationSeconds="),
    "toleration unknown field": ({"tolerations": [{**GOOD_TOLERATION, "efect": "NoSchedule"}]},
                                 "launch.tolerations[0].efect="),
    "secret name with '..'": ({"secret_env": {"VOXPIPE_CHECKPOINT_KEY": "a..b/key"}},
                              "launch.secret_env.VOXPIPE_CHECKPOINT_KEY"),
}
# refused by the params schema before any rendering (the CLI names the key the same way)
HOSTILE_PARAMS = {
    "image pull policy Sometimes": ({"image_pull_policy": "Sometimes"}, "launch.image_pull_policy"),
    "cpu 8Gx": ({"cpu": "8Gx"}, "launch.cpu"),
    "memory negative": ({"memory": "-1Gi"}, "launch.memory"),
    "shm size word": ({"shm_size": "lots"}, "launch.shm_size"),
    "memory two suffixes": ({"memory": "1GiB"}, "launch.memory"),
}


def dry_run(launch: dict, tmp_path, monkeypatch, capsys) -> tuple[int, str, str]:
    """`voxpipe launch-train --dry-run` on a params.yaml holding `launch`: (rc, stdout, stderr)."""
    monkeypatch.delenv("KFP_POD_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"launch": launch}))
    code = main(["launch-train", "--dry-run"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("backend", ["volcano", "trainjob"])
@pytest.mark.parametrize("case", sorted(HOSTILE) + sorted(HOSTILE_PARAMS))
def test_dry_run_refuses_what_the_api_server_would_refuse(case, backend, tmp_path, monkeypatch, capsys):
    """Each value the API server refuses ends the dry run (so the submit, which renders the same way, too)
    non-zero, in one paragraph naming the params key, with nothing rendered."""
    launch, key = {**HOSTILE, **HOSTILE_PARAMS}[case]
    code, out, err = dry_run({**launch, "backend": backend}, tmp_path, monkeypatch, capsys)
    assert code != 0 and out == "" and key in err, err
    if case in HOSTILE:
        message = err.split("error: ", 1)[1].rstrip("\n")
        assert "\n" not in message and "Traceback" not in message
        assert "would refuse" in message or "Name the Secret here" in message, message


def test_a_long_runtime_name_is_refused_by_the_crds_own_limit(tmp_path, monkeypatch, capsys):
    code, out, err = dry_run({"backend": "trainjob", "runtime": "r" * 260}, tmp_path, monkeypatch, capsys)
    assert code != 0 and out == ""
    assert "launch.runtime=" in err and "260 characters long" in err and "at most 253" in err
    assert "r" * 100 not in err  # a long value is quoted in part
    code, _, err = dry_run({"backend": "trainjob", "runtime": "Torch_Distributed"}, tmp_path, monkeypatch,
                           capsys)
    assert code != 0 and "launch.runtime=" in err and "DNS-1123 subdomain" in err


def test_valid_names_labels_and_tolerations_render(tmp_path, monkeypatch, capsys):
    """The other side: the values of the same kinds the API server accepts pass."""
    launch = {"namespace": "ml-team", "queue": "q1", "pvc": "ws.v2", "node_selector": {
        "kubernetes.io/arch": "amd64", "zone": "", "node.example.com/Pool_A": "A.b-c_1"},
        "tolerations": [GOOD_TOLERATION, {"key": "k", "operator": "Equal", "value": "v",
                                          "effect": "NoExecute", "tolerationSeconds": 30},
                        {"operator": "Exists"}],
        "env": {"my.setting": "1"}, "cpu": "1.5", "memory": "2G", "shm_size": "1Gi"}
    code, out, err = dry_run(launch, tmp_path, monkeypatch, capsys)
    assert code == 0, err
    job = yaml.safe_load(out)
    for task in job["spec"]["tasks"]:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {**task["template"]["metadata"], "name": "p"},
               "spec": task["template"]["spec"]}
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_the_rendered_object_check_would_catch_what_no_key_names():
    """The backstop behind the per-key checks: any rendered name, label, annotation, enum or quantity."""
    from voxpipe.launch.kube_rules import check_objects

    good = rendered(*VARIANTS["gpu"]())
    check_objects([good], "the Volcano job")
    for path, value, where in [
        (("metadata", "labels", "app.kubernetes.io/name"), "x" * 64,
         "metadata.labels.app.kubernetes.io/name"),
        (("metadata", "namespace"), "ML", "metadata.namespace"),
        (("spec", "tasks", 0, "template", "spec", "containers", 0, "imagePullPolicy"), "Sometimes",
         "spec.tasks[0].template.spec.containers[0].imagePullPolicy"),
        (("spec", "tasks", 0, "template", "spec", "volumes", 1, "emptyDir", "sizeLimit"), "8Gx",
         "spec.tasks[0].template.spec.volumes[1].emptyDir.sizeLimit"),
        (("spec", "tasks", 0, "template", "spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"),
         "1x", "spec.tasks[0].template.spec.containers[0].resources.limits.nvidia.com/gpu"),
    ]:
        job = copy.deepcopy(good)
        node = job
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = value
        with pytest.raises(StepError, match=re.escape(f"the Volcano job's {where}=")):
            check_objects([job], "the Volcano job")


@pytest.mark.parametrize("backend", ["volcano", "trainjob"])
@pytest.mark.parametrize("case", ["namespace uppercase", "queue leading dash", "toleration operator Bogus",
                                  "node selector value 64 chars"])
def test_submit_refuses_before_anything_is_sent(case, backend, tmp_path, monkeypatch, capsys):
    """The submit path renders (and so checks) before it creates anything: the cluster sees no object."""
    from kube_fake import FakeCluster

    with FakeCluster() as cluster:
        kubeconfig = {"apiVersion": "v1", "kind": "Config",
                      "clusters": [{"name": "fake", "cluster": {"server": cluster.url}}],
                      "users": [{"name": "me", "user": {"token": "t"}}],
                      "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}],
                      "current-context": "fake"}
        (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
        monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.delenv("KFP_POD_NAME", raising=False)
        monkeypatch.chdir(tmp_path)
        launch = {**HOSTILE[case][0], "backend": backend, "poll_seconds": 0.01}
        (tmp_path / "params.yaml").write_text(yaml.safe_dump({"launch": launch}))
        code = main(["launch-train"])
        assert code != 0 and HOSTILE[case][1] in capsys.readouterr().err
        assert cluster.jobs == {} and cluster.runtimes == {}

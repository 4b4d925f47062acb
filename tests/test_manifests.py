"""manifests/: every file wired into kustomize, core kinds schema-valid, and in step with the launcher;
every pod the project ships or creates meets the "restricted" Pod Security Standard."""

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from voxpipe.launch.pod import MLFLOW_CLIENT_LABEL, StepJob
from voxpipe.launch.trainjob import render_trainjob
from voxpipe.launch.volcano import render_job
from voxpipe.params import Params
from voxpipe.secrets import is_secret_name
from voxpipe.steps.launch import DEFAULT_SECRET_ENV, LaunchParams

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ROOT / "manifests"
PIPELINE = ROOT / "pipelines" / "finetune.yaml"
K8S_VERSION = kubernetes_validate.latest_version()
# CRD kinds: no schema in kubernetes-validate
CUSTOM_GROUPS = ("scheduling.volcano.sh/", "serving.kserve.io/")
# applied one file at a time, not by `kubectl apply -k manifests`: they need KServe, and each is one way
# to serve the voice (docs/serving.md); tests/test_kserve.py checks them against KServe's CRD
STANDALONE = MANIFESTS / "serving"


def documents(standalone: bool = True) -> list[tuple[Path, dict]]:
    out = []
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        if path.name != "kustomization.yaml" and (standalone or not path.is_relative_to(STANDALONE)):
            out += [(path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


def by_kind(kind: str) -> list[dict]:
    return [doc for _, doc in documents() if doc["kind"] == kind]


def test_every_file_and_folder_is_listed_by_its_kustomization():
    listed: set[Path] = set()
    for kustomization in MANIFESTS.rglob("kustomization.yaml"):
        for entry in yaml.safe_load(kustomization.read_text())["resources"]:
            target = kustomization.parent / entry
            assert target.exists(), f"{kustomization}: {entry} does not exist"
            listed.add(target.resolve())
    on_disk = {p.resolve() for p in MANIFESTS.rglob("*")
               if p.name != "kustomization.yaml" and not p.is_relative_to(STANDALONE)}
    assert on_disk - listed == set(), "files or folders that `kubectl apply -k manifests` would skip"


def test_core_kinds_pass_the_kubernetes_schemas():
    core = [(path, doc) for path, doc in documents() if not doc["apiVersion"].startswith(CUSTOM_GROUPS)]
    assert {doc["kind"] for _, doc in core} >= {
        "ServiceAccount", "Role", "RoleBinding", "PersistentVolumeClaim", "Deployment", "Service"
    }
    for path, doc in core:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = f"{path.relative_to(MANIFESTS)}: {doc['kind']} {doc['metadata']['name']}"
            pytest.fail(f"{where}: {e.message}", pytrace=False)


def test_volcano_queue_has_what_the_crd_requires_and_is_the_default_queue():
    (queue,) = by_kind("Queue")
    assert queue["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert queue["metadata"]["name"] == LaunchParams().queue
    assert "namespace" not in queue["metadata"]  # cluster-scoped
    spec = queue["spec"]
    assert isinstance(spec["weight"], int) and spec["weight"] >= 1
    assert isinstance(spec["reclaimable"], bool)
    assert set(spec) <= {"weight", "reclaimable", "capability", "deserved", "guarantee", "parent", "priority"}


def test_rbac_allows_exactly_what_the_launcher_calls():
    (role,) = [r for r in by_kind("Role") if r["metadata"]["name"] == "voxpipe-launcher"]
    allowed = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    # voxpipe/launch/watch.py: create/get/delete the job, list pods by label, read one pod's log
    needed = {
        ("batch.volcano.sh", "jobs", "create"),
        ("batch.volcano.sh", "jobs", "get"),
        ("batch.volcano.sh", "jobs", "delete"),
        ("", "pods", "list"),
        ("", "pods/log", "get"),
    }
    # voxpipe/launch/trainjob.py: the TrainJob as the Volcano job, and its TrainingRuntime, created only
    trainer = {
        ("trainer.kubeflow.org", "trainjobs", "create"),
        ("trainer.kubeflow.org", "trainjobs", "get"),
        ("trainer.kubeflow.org", "trainjobs", "delete"),
        ("trainer.kubeflow.org", "trainingruntimes", "create"),
    }
    assert needed <= allowed
    assert {x for x in allowed if x[0] == "trainer.kubeflow.org"} == trainer  # exactly those
    assert {r for g, r, _ in allowed} == {"jobs", "trainjobs", "trainingruntimes", "pods", "pods/log"}
    (binding,) = [b for b in by_kind("RoleBinding") if b["roleRef"]["name"] == role["metadata"]["name"]]
    assert "voxpipe-pipeline" in {s["name"] for s in binding["subjects"]}


def test_the_training_pods_account_may_patch_trainjob_status_and_nothing_else():
    """voxpipe/train/trainer_status.py: rank 0 merge-patches its TrainJob's status subresource."""
    (role,) = [r for r in by_kind("Role") if r["metadata"]["name"] == "voxpipe-trainer"]
    assert role["rules"] == [{"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs/status"],
                              "verbs": ["patch"]}]
    (binding,) = [b for b in by_kind("RoleBinding") if b["roleRef"]["name"] == "voxpipe-trainer"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "voxpipe-trainer"}]
    assert "voxpipe-trainer" in {a["metadata"]["name"] for a in by_kind("ServiceAccount")}


def test_workspace_pvc_is_the_one_training_mounts_and_is_shared():
    claims = {pvc["metadata"]["name"]: pvc for pvc in by_kind("PersistentVolumeClaim")}
    assert claims[LaunchParams().pvc]["spec"]["accessModes"] == ["ReadWriteMany"]


def test_mlflow_server_uses_a_database_store_on_its_volume():
    (deployment,) = by_kind("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = dict(a.removeprefix("--").split("=", 1) for a in container["args"] if "=" in a)
    mount = container["volumeMounts"][0]["mountPath"]
    assert args["backend-store-uri"] == f"sqlite:///{mount}/mlflow.db"  # the registry needs a database
    assert args["workers"] == "1" and deployment["spec"]["replicas"] == 1  # sqlite: one writer
    claims = {pvc["metadata"]["name"] for pvc in by_kind("PersistentVolumeClaim")}
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] in claims
    (service,) = by_kind("Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_mlflow_server_is_the_release_the_images_install_as_client():
    (deployment,) = by_kind("Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    constraints = (MANIFESTS.parent / "images" / "constraints.txt").read_text().splitlines()
    (client_version,) = [line.split("==")[1] for line in constraints if line.startswith("mlflow==")]
    # the -full variant: the plain one is `pip install mlflow` alone, without the auth extra basic-auth needs
    assert container["image"] == f"ghcr.io/mlflow/mlflow:v{client_version}-full"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (its built-in kustomize) not installed")
def test_kustomize_build_namespaces_everything_but_the_queue():
    built = subprocess.run(
        ["kubectl", "kustomize", str(MANIFESTS)], capture_output=True, text=True, check=True
    ).stdout
    docs = [d for d in yaml.safe_load_all(built) if d]
    assert len(docs) == len(documents(standalone=False))
    for doc in docs:
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "voxpipe"
        if doc["kind"] == "Queue":
            assert "namespace" not in doc["metadata"]
        else:
            assert doc["metadata"]["namespace"] == "kubeflow"
    for binding in [d for d in docs if d["kind"] == "RoleBinding"]:
        assert {s["namespace"] for s in binding["subjects"]} == {"kubeflow"}


# -- authenticated MLflow ---------------------------------------------------------------------------
def mlflow_container() -> dict:
    (deployment,) = by_kind("Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_mlflow_runs_the_basic_auth_app_with_credentials_from_a_secret():
    container = mlflow_container()
    assert "--app-name=basic-auth" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    secrets = ("MLFLOW_AUTH_ADMIN_USERNAME", "MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY")
    for name in secrets:
        assert set(env[name]) == {"name", "valueFrom"} and "secretKeyRef" in env[name]["valueFrom"], name
    # the pipeline's credentials are the admin account of that same Secret (launch.secret_env defaults)
    refs = {name: f"{e['valueFrom']['secretKeyRef']['name']}/{e['valueFrom']['secretKeyRef']['key']}"
            for name, e in env.items() if "valueFrom" in e}
    assert refs["MLFLOW_AUTH_ADMIN_USERNAME"] == DEFAULT_SECRET_ENV["MLFLOW_TRACKING_USERNAME"]
    assert refs["MLFLOW_AUTH_ADMIN_PASSWORD"] == DEFAULT_SECRET_ENV["MLFLOW_TRACKING_PASSWORD"]
    # the auth app's settings: from the ConfigMap, its user database on the volume, no credentials in it
    (config_map,) = by_kind("ConfigMap")
    ini = config_map["data"]["basic_auth.ini"]
    assert "database_uri = sqlite:////mlflow/basic_auth.db" in ini and "password" not in ini
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert env["MLFLOW_AUTH_CONFIG_PATH"]["value"] == f"{mounts['auth-config']}/basic_auth.ini"
    assert not by_kind("Secret")  # values are never shipped: docs/cluster.md has you create them


def test_network_policy_admits_only_the_pipeline_pods():
    (policy,) = by_kind("NetworkPolicy")
    (deployment,) = by_kind("Deployment")
    assert policy["spec"]["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": MLFLOW_CLIENT_LABEL}}]  # no namespaces, no IPs
    assert rule["ports"] == [{"protocol": "TCP", "port": "http"}]
    # who carries the label: the Volcano training pods and the pipeline's MLflow clients
    template = render_job(Params(), "ml")["spec"]["tasks"][0]["template"]
    assert MLFLOW_CLIENT_LABEL.items() <= template["metadata"]["labels"].items()
    executors = pipeline_platform()["executors"]
    labelled = {name for name, spec in executors.items()
                if MLFLOW_CLIENT_LABEL.items() <= spec.get("podMetadata", {}).get("labels", {}).items()}
    assert labelled == {"exec-train", "exec-register"}


# -- restricted pods ---------------------------------------------------------------------------------
def restricted_violations(spec: dict, read_only_root: bool = True) -> list[str]:
    """What keeps a pod spec from the "restricted" Pod Security Standard (and our own rules: no service
    account token but voxpipe-trainer's, which may only patch trainjobs/status; read-only root
    filesystem)."""
    problems = []
    pod_sc = spec.get("securityContext", {})
    reporter = spec.get("serviceAccountName") == "voxpipe-trainer"
    if spec.get("automountServiceAccountToken") is not False and not reporter:
        problems.append("automountServiceAccountToken is not false")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            problems.append(key)
    problems += [f"hostPath volume {v['name']}" for v in spec.get("volumes", []) if "hostPath" in v]
    for c in spec.get("initContainers", []) + spec["containers"]:
        sc, name = c.get("securityContext", {}), c["name"]
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            problems.append(f"{name}: runAsNonRoot")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            problems.append(f"{name}: runAsUser 0")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation")
        if sc.get("privileged"):
            problems.append(f"{name}: privileged")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            problems.append(f"{name}: capabilities.drop ALL")
        if set(sc.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: capabilities.add")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile")
        if read_only_root and sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{name}: readOnlyRootFilesystem")
    return problems


def volcano_pod_specs() -> dict[str, dict]:
    variants = {
        "ascend": LaunchParams(pods=4),
        "gpu": LaunchParams(accelerator="nvidia.com/gpu", pods=2),
        "cpu-one-pod": LaunchParams(accelerator="", pods=1, secret_env={"VOXPIPE_CHECKPOINT_KEY": "ck/key"}),
    }
    jobs = {name: render_job(Params(launch=launch), "ml") for name, launch in variants.items()}
    encode = LaunchParams(encode_devices=16)
    jobs["encode"] = render_job(Params(launch=encode), "ml", job=StepJob.encode(encode))
    return {f"volcano {name}/{task['name']}": task["template"]["spec"]
            for name, job in jobs.items() for task in job["spec"]["tasks"]}


def trainjob_pod_specs() -> dict[str, dict]:
    """The pod of voxpipe's TrainingRuntime for each backend variant (the TrainJob adds image, args, env)."""
    variants = {
        "ascend": LaunchParams(backend="trainjob", pods=4),
        "gpu": LaunchParams(backend="trainjob", accelerator="nvidia.com/gpu", pods=2),
    }
    specs = {}
    for name, launch in variants.items():
        runtime, _ = render_trainjob(Params(launch=launch), "ml")
        (replicated,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
        specs[f"trainjob {name}"] = replicated["template"]["spec"]["template"]["spec"]
    return specs


def manifest_pod_specs() -> dict[str, dict]:
    """Every pod spec in manifests/: a workload's template, a Pod's spec, an InferenceService's predictor
    (KServe's predictor is a pod spec with its own keys beside it)."""
    kinds = ("Deployment", "StatefulSet", "DaemonSet", "Job", "Pod", "InferenceService")

    def pod(doc: dict) -> dict:
        if doc["kind"] == "Pod":
            return doc["spec"]
        if doc["kind"] == "InferenceService":
            return doc["spec"]["predictor"]
        return doc["spec"]["template"]["spec"]

    return {f"{path.relative_to(MANIFESTS)}": pod(doc) for path, doc in documents() if doc["kind"] in kinds}


def pipeline_platform() -> dict:
    _, platform = yaml.safe_load_all(PIPELINE.read_text())
    return platform["platforms"]["kubernetes"]["deploymentSpec"]


def test_every_pod_meets_the_restricted_standard():
    specs = {**volcano_pod_specs(), **trainjob_pod_specs(), **manifest_pod_specs()}
    assert len(specs) >= 10 and any(name.startswith("namespaced/mlflow") for name in specs)
    assert {"serving/voxpipe-serve.yaml", "serving/vllm-omni.yaml"} <= set(specs)
    problems = {name: p for name, spec in specs.items() if (p := restricted_violations(spec))}
    assert problems == {}
    for name, spec in specs.items():  # a read-only root filesystem needs somewhere to write temporary files
        (container,) = spec["containers"]
        tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert tmp and "emptyDir" in volumes[tmp[0]["name"]], name
    # the KFP tasks: kfp-kubernetes sets runAsNonRoot (KFP's backend adds no-escalation, drop ALL and
    # RuntimeDefault itself); nothing in the compiled pipeline may grant more
    executors = pipeline_platform()["executors"]
    assert executors
    allowed = {"pvcMount", "secretAsEnv", "nodeSelector", "tolerations", "podMetadata", "securityContext"}
    for name, spec in executors.items():
        assert spec.get("securityContext") == {"runAsNonRoot": True}, name
        assert set(spec) <= allowed, f"{name}: {set(spec) - allowed}"


def test_the_restricted_check_can_fail():
    (spec,) = [s for n, s in volcano_pod_specs().items() if n.endswith("cpu-one-pod/master")]
    assert restricted_violations(spec) == []
    spec["containers"][0]["securityContext"].pop("capabilities")
    spec["securityContext"]["runAsUser"] = 0
    spec.pop("automountServiceAccountToken")
    spec["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    assert restricted_violations(spec) == [
        "automountServiceAccountToken is not false", "hostPath volume host", "train: runAsUser 0",
        "train: capabilities.drop ALL"]


def test_the_compiled_pipeline_holds_secrets_only_by_reference():
    pipeline, _ = yaml.safe_load_all(PIPELINE.read_text())
    for name, executor in pipeline["deploymentSpec"]["executors"].items():
        for env in executor["container"].get("env", []):
            assert not is_secret_name(env["name"]), f"{name}: {env['name']} as a literal value"
    executors = pipeline_platform()["executors"]
    wired = {(ref["secretName"], k["secretKey"], k["envVar"])
             for name in ("exec-train", "exec-register") for ref in executors[name]["secretAsEnv"]
             for k in ref["keyToEnv"]}
    expected = {(*ref.split("/"), env) for env, ref in DEFAULT_SECRET_ENV.items()}
    assert expected <= wired
    # evaluate verifies the exports' signed run identities (issue 34): the checkpoint key, nothing else
    evaluate = {k["envVar"] for ref in executors["exec-evaluate"]["secretAsEnv"] for k in ref["keyToEnv"]}
    assert evaluate == {"VOXPIPE_CHECKPOINT_KEY"}

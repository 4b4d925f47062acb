"""manifests/: every file wired into kustomize, core kinds schema-valid, and in step with the launcher."""

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from voxpipe.params import LaunchParams

MANIFESTS = Path(__file__).resolve().parents[1] / "manifests"
K8S_VERSION = kubernetes_validate.latest_version()
CUSTOM_GROUPS = ("scheduling.volcano.sh/",)  # CRD kinds: no schema in kubernetes-validate


def documents() -> list[tuple[Path, dict]]:
    out = []
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        if path.name != "kustomization.yaml":
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
    on_disk = {p.resolve() for p in MANIFESTS.rglob("*") if p.name != "kustomization.yaml"}
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
    (role,) = by_kind("Role")
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
    assert needed <= allowed
    assert {r for g, r, _ in allowed} == {"jobs", "pods", "pods/log"}  # nothing beyond that
    (binding,) = by_kind("RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert "voxpipe-pipeline" in {s["name"] for s in binding["subjects"]}


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
    assert container["image"] == f"ghcr.io/mlflow/mlflow:v{client_version}"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (its built-in kustomize) not installed")
def test_kustomize_build_namespaces_everything_but_the_queue():
    built = subprocess.run(
        ["kubectl", "kustomize", str(MANIFESTS)], capture_output=True, text=True, check=True
    ).stdout
    docs = [d for d in yaml.safe_load_all(built) if d]
    assert len(docs) == len(documents())
    for doc in docs:
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "voxpipe"
        if doc["kind"] == "Queue":
            assert "namespace" not in doc["metadata"]
        else:
            assert doc["metadata"]["namespace"] == "kubeflow"
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding"]
    assert {s["namespace"] for s in binding["subjects"]} == {"kubeflow"}

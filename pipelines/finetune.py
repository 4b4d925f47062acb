"""The fine-tuning pipeline for Kubeflow Pipelines: the voxpipe steps wired by their artifacts.

    python -m pipelines.finetune [OUT.yaml]     # `make compile`: pipelines/finetune.yaml

Its parameters mirror params.yaml: one dict per section, defaulting to params.yaml's values, minus
the paths the pipeline wires between steps. Bulk data lives on the workspace PVC, mounted by every
task at the same path as in the Volcano training pods. The data version (the dataset's DVC md5) is a
required parameter and `ingest` checks it against the files, so KFP's cache, which sees parameters
and not the files behind a path, reruns the pipeline when the data changes.
"""

import ast
import re
import sys
from pathlib import Path
from typing import Any

from kfp import compiler, dsl, kubernetes

from components import steps
from components.shared import CPU_IMAGE
from voxpipe.params import LaunchParams, Params

LAUNCH = LaunchParams()
WORKSPACE = LAUNCH.mount_path  # where every task mounts the workspace PVC
MLFLOW_SERVICE = "http://mlflow:5000"  # manifests/namespaced/mlflow-service.yaml
# keys each component sets itself, from the previous steps' artifacts and the cluster parameters
WIRED = {
    "ingest": {"out"},
    "manifest": {"input", "out"},
    "model": {"out"},
    "encode": {"manifest", "model", "out"},
    "train": {"data", "model", "out"},
    "evaluate": {"model", "baseline", "data", "out"},
    "mfu": {"model", "train_report", "metrics", "out"},
    "register": {"model", "eval", "mfu", "train", "ingest", "out", "work", "tracking_uri"},
    "launch": {"image", "accelerator", "node_selector", "tolerations", "pvc", "mount_path", "dry_run"},
}


def section_defaults(section: str, **changes: Any) -> dict[str, Any]:
    """params.yaml's defaults of a section, without the wired keys and the nulls (a KFP struct has no
    null; a missing key takes the schema's default)."""
    values = {**Params().model_dump(by_alias=True)[section], **changes}
    return {k: v for k, v in values.items() if k not in WIRED[section] and v is not None}


SECTIONS = ("ingest", "manifest", "model", "encode", "train", "evaluate", "mfu", "launch")
INGEST, MANIFEST, MODEL, ENCODE, TRAIN, EVALUATE, MFU, LAUNCH_SECTION = map(section_defaults, SECTIONS)
REGISTER = section_defaults("register")
HEADER_DICT = re.compile(r"^(#\s+\w+: (?:dict|list) \[Default: )(.*)\]$")
NODE_SELECTOR: dict[str, str] = dict(LAUNCH.node_selector)
TOLERATIONS: list[dict[str, Any]] = list(LAUNCH.tolerations)


@dsl.pipeline(
    name="voxpipe-finetune",
    description="Fine-tune VoxCPM2: ingest, manifest, base model, encode, FSDP2 training (a Volcano job), "
    "evaluate, MFU, MLflow registration.",
)
def finetune(
    data_version: str,
    workspace: str = WORKSPACE,
    pvc_name: str = LAUNCH.pvc,
    base_model: str = "",
    accelerator: str = LAUNCH.accelerator,
    accelerator_image: str = LAUNCH.image,
    cpu_image: str = CPU_IMAGE,
    node_selector: dict = NODE_SELECTOR,
    tolerations: list = TOLERATIONS,
    volcano: bool = True,
    mlflow_tracking_uri: str = MLFLOW_SERVICE,
    ingest: dict = INGEST,
    manifest: dict = MANIFEST,
    model: dict = MODEL,
    encode: dict = ENCODE,
    train: dict = TRAIN,
    evaluate: dict = EVALUATE,
    mfu: dict = MFU,
    launch: dict = LAUNCH_SECTION,
    register: dict = REGISTER,
) -> dsl.Artifact:
    """data_version: the DVC md5 of ingest.input (`dvc add` records it); workspace: where the tasks
    see the PVC (change it only for kfp.local); base_model: a checkpoint folder on the workspace
    ("" = init-model); accelerator: `huawei.com/Ascend910` or `nvidia.com/gpu`, requested by encode
    and evaluate (one each) and by every training pod; node_selector / tolerations: for those pods;
    volcano: false trains inside the train task (kfp.local, a small CPU cluster); mlflow_tracking_uri:
    where register logs (credentials: the MLFLOW_TRACKING_* env of the pod, never a parameter)."""
    data = steps.ingest(workspace=workspace, data_version=data_version, params=ingest)
    rows = steps.manifest(workspace=workspace, params=manifest, data=data.outputs["data"])
    base = steps.init_model(workspace=workspace, params=model, base_model=base_model)
    encoded = steps.encode(workspace=workspace, params=encode, manifest=rows.outputs["manifest"],
                           base_model=base.outputs["model"])
    tuned = steps.train(
        workspace=workspace, params=train, launch=launch, volcano=volcano, image=accelerator_image,
        accelerator=accelerator, node_selector=node_selector, tolerations=tolerations, pvc_name=pvc_name,
        encoded=encoded.outputs["encoded"], base_model=base.outputs["model"],
    )
    evaluation = steps.evaluate(workspace=workspace, params=evaluate, model=tuned.outputs["model"],
                                base_model=base.outputs["model"], encoded=encoded.outputs["encoded"])
    utilisation = steps.mfu(workspace=workspace, params=mfu, model=tuned.outputs["model"],
                            base_model=base.outputs["model"])
    registered = steps.register(
        workspace=workspace, params=register, tracking_uri=mlflow_tracking_uri,
        kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        data=data.outputs["data"], model=tuned.outputs["model"], evaluation=evaluation.outputs["results"],
        mfu=utilisation.outputs["results"],
    )
    registered.set_caching_options(False)  # a new pipeline run is a new MLflow run and model version

    for task in (data, rows, base, encoded, tuned, evaluation, utilisation, registered):
        task.set_container_image(cpu_image)
        kubernetes.mount_pvc(task, pvc_name=pvc_name, mount_path=WORKSPACE)
    for task in (encoded, evaluation):  # the AudioVAE and generation run on one accelerator
        task.set_container_image(accelerator_image)
        task.set_accelerator_type(accelerator).set_accelerator_limit(1)
        kubernetes.add_node_selector_json(task, node_selector)
        kubernetes.add_toleration_json(task, tolerations)
    return registered.outputs["registered"]


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    return [_sorted(v) for v in value] if isinstance(value, list) else value


def compile_pipeline(path: str) -> None:
    """Compile to `path`. KFP prints dict defaults into the header comment in protobuf map order,
    which changes from process to process; sorted here so the committed YAML only changes with the
    pipeline."""
    compiler.Compiler().compile(finetune, path)
    out = Path(path)
    lines = out.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        if not line.startswith("#"):
            break
        if match := HEADER_DICT.match(line):
            lines[i] = f"{match[1]}{_sorted(ast.literal_eval(match[2]))}]\n"
    out.write_text("".join(lines))


if __name__ == "__main__":
    compile_pipeline(sys.argv[1] if len(sys.argv) > 1 else "pipelines/finetune.yaml")

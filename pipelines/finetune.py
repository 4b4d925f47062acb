"""The fine-tuning pipeline for Kubeflow Pipelines: the voxpipe steps wired by their artifacts.

    python -m pipelines.finetune [--recipe NAME] [OUT.yaml]   # `make compile`: pipelines/finetune.yaml

Its parameters mirror params.yaml: one dict per section, defaulting to params.yaml's values, minus
the paths the pipeline wires between steps. Bulk data lives on the workspace PVC, mounted by every
task at the same path as in the launched training pods. The data version (the dataset's DVC md5) is a
required parameter and `ingest` checks it against the files, so KFP's cache, which sees parameters
and not the files behind a path, reruns the pipeline when the data changes.
"""

import argparse
import ast
import functools
import re
from pathlib import Path
from typing import Any

import yaml
from kfp import compiler, dsl, kubernetes
from kfp.dsl.graph_component import GraphComponent

from components import steps
from components.shared import CPU_IMAGE
from voxpipe import paramspec
from voxpipe.integrity import KEY_ENV
from voxpipe.launch.pod import MLFLOW_CLIENT_LABEL
from voxpipe.params import Params, file_values, load_params
from voxpipe.secrets import SECRET_ENV_NAMES
from voxpipe.steps.launch import LaunchParams

LAUNCH = LaunchParams()
WORKSPACE = LAUNCH.mount_path  # where every task mounts the workspace PVC
MLFLOW_SERVICE = "http://mlflow:5000"  # manifests/namespaced/mlflow-service.yaml
# keys each component sets itself, from the previous steps' artifacts and the cluster parameters (the
# schema marks them `wired`; model.base comes from the base_model parameter)
WIRED = {section: {k.key.split(".", 1)[1] for k in paramspec.keys(section) if k.wired}
         for section in paramspec.sections()}


def section_defaults(section: str, params: Params | None = None) -> dict[str, Any]:
    """params.yaml's defaults of a section (or those of `params`), without the wired keys and the nulls
    (a KFP struct has no null; a missing key takes the schema's default)."""
    values = file_values(params or Params())[section]  # train.lr / lora.alpha left out: they follow LoRA / r
    return {k: v for k, v in values.items() if k not in WIRED[section] and v is not None}


SECTIONS = ("ingest", "manifest", "model", "encode", "train", "evaluate", "mfu", "launch")
INGEST, MANIFEST, MODEL, ENCODE, TRAIN, EVALUATE, MFU, LAUNCH_SECTION = map(section_defaults, SECTIONS)
REGISTER, TRACKING = section_defaults("register"), section_defaults("tracking")
DICT_DEFAULTS = {name: section_defaults(name) for name in (*SECTIONS, "register", "tracking")}
HEADER_DICT = re.compile(r"^(#\s+(\w+): (?:dict|list) \[Default: )(.*)\]$")
NODE_SELECTOR: dict[str, str] = dict(LAUNCH.node_selector)
TOLERATIONS: list[dict[str, Any]] = list(LAUNCH.tolerations)


def with_secrets(task: dsl.PipelineTask) -> None:
    """The default launch.secret_env (voxpipe/steps/launch.py) as env from the Secrets (by reference), their
    names for voxpipe's redaction, and the label the MLflow NetworkPolicy admits."""
    by_secret: dict[str, dict[str, str]] = {}
    for env, ref in LAUNCH.secret_env.items():
        secret, _, key = ref.partition("/")
        by_secret.setdefault(secret, {})[key] = env
    for secret, keys in sorted(by_secret.items()):
        kubernetes.use_secret_as_env(task, secret, keys)
    task.set_env_variable(SECRET_ENV_NAMES, ",".join(sorted(LAUNCH.secret_env)))
    for key, value in MLFLOW_CLIENT_LABEL.items():
        kubernetes.add_pod_label(task, key, value)


def with_signing_key(task: dsl.PipelineTask) -> None:
    """The checkpoint signing key alone (launch.secret_env's VOXPIPE_CHECKPOINT_KEY), by reference: evaluate
    verifies the signed run identity of the exports it scores (voxpipe/train/identity.py)."""
    secret, _, key = LAUNCH.secret_env[KEY_ENV].partition("/")
    kubernetes.use_secret_as_env(task, secret, {key: KEY_ENV})
    task.set_env_variable(SECRET_ENV_NAMES, KEY_ENV)


def fan_out_ingest(workspace: Any, data_version: Any, ingest: Any) -> tuple[Any, Any, Any]:
    """The ingest tasks: a plan, one task per shard of it (`ingest.shards` of them) in a
    `dsl.ParallelFor`, and a merge over their folders (`dsl.Collected`). Returns the three tasks."""
    planned = steps.ingest_plan(workspace=workspace, data_version=data_version, params=ingest)
    with dsl.ParallelFor(planned.outputs["Output"]) as index:
        shard = steps.ingest_shard(workspace=workspace, params=ingest, plan=planned.outputs["plan"],
                                   index=index)
    merged = steps.ingest_merge(workspace=workspace, params=ingest, plan=planned.outputs["plan"],
                                shards=dsl.Collected(shard.outputs["shard"]))
    return planned, shard, merged


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
    launch_backend: str = LAUNCH.backend,
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
    tracking: dict = TRACKING,
) -> dsl.Artifact:
    """data_version: the DVC md5 of ingest.input (`dvc add` records it); workspace: where the tasks
    see the PVC (change it only for kfp.local); base_model: a checkpoint folder on the workspace
    ("" = init-model); accelerator: `huawei.com/Ascend910` or `nvidia.com/gpu`, requested by evaluate
    (one) and by every pod of the encode and train jobs; node_selector / tolerations: for those pods;
    launch_backend: what runs encode and train, launch.backend's `volcano` (a Volcano Job) or `trainjob`
    (a Kubeflow Trainer TrainJob), or `in-task`: inside their own tasks (kfp.local, a small CPU cluster);
    mlflow_tracking_uri: where register logs (credentials: the MLFLOW_TRACKING_* env of the pod, never
    a parameter)."""
    planned, shard, data = fan_out_ingest(workspace, data_version, ingest)
    rows = steps.manifest(workspace=workspace, params=manifest, data=data.outputs["data"])
    checked = steps.validate(workspace=workspace, ingest=ingest, manifest=rows.outputs["manifest"])
    base = steps.init_model(workspace=workspace, params=model, base_model=base_model)
    encoded = steps.encode(
        workspace=workspace, params=encode, launch=launch, backend=launch_backend, image=accelerator_image,
        accelerator=accelerator, node_selector=node_selector, tolerations=tolerations, pvc_name=pvc_name,
        manifest=rows.outputs["manifest"], base_model=base.outputs["model"],
    ).after(checked)
    tuned = steps.train(
        workspace=workspace, params=train, launch=launch, tracking=tracking, tracking_uri=mlflow_tracking_uri,
        backend=launch_backend, image=accelerator_image,
        accelerator=accelerator, node_selector=node_selector, tolerations=tolerations, pvc_name=pvc_name,
        encoded=encoded.outputs["encoded"], base_model=base.outputs["model"],
    )
    evaluation = steps.evaluate(workspace=workspace, params=evaluate, train=train,
                                model=tuned.outputs["model"], base_model=base.outputs["model"],
                                encoded=encoded.outputs["encoded"])
    utilisation = steps.mfu(workspace=workspace, params=mfu, model=tuned.outputs["model"],
                            base_model=base.outputs["model"])
    registered = steps.register(
        workspace=workspace, params=register, ingest=ingest, tracking=tracking,
        tracking_uri=mlflow_tracking_uri, kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        data=data.outputs["data"], model=tuned.outputs["model"], evaluation=evaluation.outputs["results"],
        mfu=utilisation.outputs["results"],
    )
    registered.set_caching_options(False)  # a new pipeline run is a new MLflow run and model version

    tasks = (planned, shard, data, rows, checked, base, encoded, tuned, evaluation, utilisation, registered)
    for task in tasks:
        task.set_container_image(cpu_image)
        kubernetes.mount_pvc(task, pvc_name=pvc_name, mount_path=WORKSPACE)
        # the rest of "restricted" (no escalation, drop ALL, RuntimeDefault seccomp) is KFP's default
        kubernetes.set_security_context(task, run_as_non_root=True)
    for task in (tuned, registered):  # MLflow clients; train also signs checkpoints when in-task
        with_secrets(task)
    with_signing_key(evaluation)  # verifies the exports' signed identities
    for task in (evaluation,):  # generation runs on one accelerator (encode's run in its launched job)
        task.set_container_image(accelerator_image)
        task.set_accelerator_type(accelerator).set_accelerator_limit(1)
        kubernetes.add_node_selector_json(task, node_selector)
        kubernetes.add_toleration_json(task, tolerations)
    return registered.outputs["registered"]


@functools.cache
def finetune_pipeline() -> GraphComponent:
    """The pipeline, built on first use rather than at import: KFP builds the graph when it decorates,
    calling `inspect.stack()` for every task, which takes seconds in a process that has torch and mlflow
    loaded; whoever imports this module for its defaults or `fan_out_ingest` does not need the graph."""
    return dsl.pipeline(
        name="voxpipe-finetune",
        description="Fine-tune VoxCPM2: ingest, manifest, validate, base model, encode, FSDP2 training (a "
        "Volcano Job or Kubeflow TrainJob), evaluate, MFU, MLflow registration.",
    )(finetune)


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    return [_sorted(v) for v in value] if isinstance(value, list) else value


def recipe_arguments(recipe: str) -> dict[str, Any]:
    """The pipeline's parameter defaults for a recipe: params.yaml with recipes/<recipe>.yaml layered on,
    as `voxpipe <step> --recipe` reads it."""
    params = load_params(recipe=recipe)
    arguments: dict[str, Any] = {name: section_defaults(name, params) for name in (*SECTIONS, "register",
                                                                                   "tracking")}
    launch = params.launch
    arguments.update(accelerator=launch.accelerator, accelerator_image=launch.image,
                     launch_backend=launch.backend, node_selector=dict(launch.node_selector),
                     tolerations=list(launch.tolerations))
    if params.model.base != params.model.out:  # a real checkpoint, not init-model's
        arguments["base_model"] = params.model.base
    return arguments


def compile_pipeline(path: str, recipe: str | None = None, graph: GraphComponent | None = None) -> None:
    """Compile to `path` (with a recipe's values as the parameter defaults; `graph`: another pipeline
    with these parameters, pipelines/sweep.py's). KFP prints dict defaults into the header comment in
    protobuf map order, which changes from process to process; sorted here so the committed YAML only
    changes with the pipeline."""
    arguments = recipe_arguments(recipe) if recipe else None
    compiler.Compiler().compile(graph or finetune_pipeline(), path, pipeline_parameters=arguments)
    out = Path(path)
    lines = out.read_text().splitlines(keepends=True)
    header = [line for line in lines if line.startswith("#")]
    typed = {**DICT_DEFAULTS, **(arguments or {})}
    for i, line in enumerate(header):
        if match := HEADER_DICT.match(line):
            value = typed.get(match[2], ast.literal_eval(match[3]))
            header[i] = f"{match[1]}{_sorted(value)}]\n"
    documents = list(yaml.safe_load_all("".join(lines[len(header):])))
    for name, spec in documents[0]["root"]["inputDefinitions"]["parameters"].items():
        if spec["parameterType"] == "STRUCT" and name in typed:
            spec["defaultValue"] = typed[name]  # the schema's ints, not protobuf's 40.0
    out.write_text("".join(header) + yaml.dump_all(documents, sort_keys=True))


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description="compile the pipeline (`make compile [RECIPE=NAME]`)")
    cli.add_argument("out", nargs="?", default="pipelines/finetune.yaml")
    cli.add_argument("--recipe", default=None, help="recipes/NAME.yaml's values as the parameter defaults")
    args = cli.parse_args()
    compile_pipeline(args.out, args.recipe)

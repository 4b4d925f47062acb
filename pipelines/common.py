"""What the fine-tuning and sweep pipelines share: their parameters, their first steps, their task setup.

The parameters mirror params.yaml: one dict per section, defaulting to params.yaml's values, minus the
paths the pipeline wires between steps, plus the cluster's settings. They are declared once, in
PARAMETERS; `pipeline_function` gives a pipeline body that signature (KFP reads a pipeline's
parameters from its function's signature). Bulk data lives on the workspace PVC, mounted by every
task at the same path as in the launched training pods.
"""

import ast
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml
from kfp import compiler, dsl, kubernetes
from kfp.dsl.graph_component import GraphComponent

from components import steps
from components.generic import step_task
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
SECTIONS = ("ingest", "manifest", "model", "encode", "train", "evaluate", "mfu", "launch", "register",
            "tracking")
HEADER_DICT = re.compile(r"^(#\s+(\w+): (?:dict|list) \[Default: )(.*)\]$")


def section_defaults(section: str, params: Params | None = None) -> dict[str, Any]:
    """params.yaml's defaults of a section (or those of `params`), without the wired keys and the nulls
    (a KFP struct has no null; a missing key takes the schema's default)."""
    values = file_values(params or Params())[section]  # train.lr / lora.alpha left out: they follow LoRA / r
    return {k: v for k, v in values.items() if k not in WIRED[section] and v is not None}


DICT_DEFAULTS = {name: section_defaults(name) for name in SECTIONS}
# every pipeline's parameters, in one place: name -> (type, default; inspect.Parameter.empty: required)
PARAMETERS: dict[str, tuple[type, Any]] = {
    "data_version": (str, inspect.Parameter.empty),
    "workspace": (str, WORKSPACE),
    "pvc_name": (str, LAUNCH.pvc),
    "base_model": (str, ""),
    "accelerator": (str, LAUNCH.accelerator),
    "accelerator_image": (str, LAUNCH.image),
    "cpu_image": (str, CPU_IMAGE),
    "node_selector": (dict, dict(LAUNCH.node_selector)),
    "tolerations": (list, list(LAUNCH.tolerations)),
    "launch_backend": (str, LAUNCH.backend),
    "mlflow_tracking_uri": (str, MLFLOW_SERVICE),
    **{name: (dict, DICT_DEFAULTS[name]) for name in SECTIONS},
}
PARAMETERS_DOC = """\
data_version: the DVC md5 of ingest.input (`dvc add` records it; `ingest` checks it against the files, so
KFP's cache, which sees parameters and not the files behind a path, reruns the pipeline when the data
changes); workspace: where the tasks see the PVC (change it only for kfp.local); base_model: a checkpoint
folder on the workspace ("" = init-model); accelerator: `huawei.com/Ascend910` or `nvidia.com/gpu`,
requested by evaluate (one) and by every pod of the encode and train jobs; node_selector / tolerations:
for those pods; launch_backend: what runs encode and train, launch.backend's `volcano` (a Volcano Job) or
`trainjob` (a Kubeflow Trainer TrainJob), or `in-task`: inside their own tasks (kfp.local, a small CPU
cluster); mlflow_tracking_uri: where register logs (credentials: the MLFLOW_TRACKING_* env of the pod,
never a parameter); the section dicts: params.yaml's sections."""


def pipeline_function(name: str, body: Callable[[SimpleNamespace], Any],
                      extra: dict[str, tuple[type, Any]] | None = None) -> Callable[..., Any]:
    """`body(p)` as a function with PARAMETERS (and `extra`, after data_version) as its signature, `p`
    holding their values (KFP's channels when it builds the graph)."""
    declared = dict(PARAMETERS)
    required = {k: v for k, v in declared.items() if v[1] is inspect.Parameter.empty}
    declared = {**required, **(extra or {}), **{k: v for k, v in declared.items() if k not in required}}
    signature = inspect.Signature(
        [inspect.Parameter(k, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=kind, default=default)
         for k, (kind, default) in declared.items()], return_annotation=dsl.Artifact)

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return body(SimpleNamespace(**bound.arguments))

    pipeline.__name__ = pipeline.__qualname__ = name
    pipeline.__signature__ = signature  # type: ignore[attr-defined]
    pipeline.__doc__ = body.__doc__
    return pipeline


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


def first_steps(p: SimpleNamespace) -> SimpleNamespace:
    """ingest (fanned out) -> manifest -> validate, the base model, and encode once the manifest is valid:
    what every pipeline starts with. Returns the tasks by name (`all`: in order)."""
    planned, shard, data = fan_out_ingest(p.workspace, p.data_version, p.ingest)
    rows = step_task("manifest", p.workspace, {"manifest": p.manifest}, {"data": data.outputs["data"]},
                     {"manifest.input": ["{data}/raw.jsonl"], "manifest.out": "{out}"},
                     output=("manifest", dsl.Dataset))
    checked = step_task("validate", p.workspace, {"ingest": p.ingest},
                        {"manifest": rows.outputs["manifest"]},
                        {"validate.manifest": "{manifest}/train.jsonl", "validate.out": "{out}"},
                        output=("report", dsl.Artifact), report="validate.json")
    base = steps.init_model(workspace=p.workspace, params=p.model, base_model=p.base_model)
    encoded = steps.encode(
        workspace=p.workspace, params=p.encode, launch=p.launch, backend=p.launch_backend,
        image=p.accelerator_image, accelerator=p.accelerator, node_selector=p.node_selector,
        tolerations=p.tolerations, pvc_name=p.pvc_name, manifest=rows.outputs["manifest"],
        base_model=base.outputs["model"],
    ).after(checked)
    return SimpleNamespace(data=data, rows=rows, checked=checked, base=base, encoded=encoded,
                           all=[planned, shard, data, rows, checked, base, encoded])


def mfu_task(p: SimpleNamespace, tuned: dsl.PipelineTask, base: dsl.PipelineTask,
             part: Any = None) -> dsl.PipelineTask:
    """Model FLOPs utilisation of a train task; mfu.md shown in the UI (`report_md`)."""
    return step_task("mfu", p.workspace, {"mfu": p.mfu},
                     {"model": tuned.outputs["model"], "base_model": base.outputs["model"]},
                     {"mfu.train_report": "{model}/report.json", "mfu.metrics": None, "mfu.out": "{out}",
                      "model.base": "{base_model}"},
                     output=("results", dsl.Dataset), report="mfu.json",
                     views={"report_md": ("mfu.md", dsl.Markdown)}, metrics=True, part=part)


def set_up(p: SimpleNamespace, tasks: list[dsl.PipelineTask], mlflow_clients: list[dsl.PipelineTask],
           evaluation: dsl.PipelineTask) -> None:
    """Every task on the CPU image with the workspace PVC, as a non-root user; the MLflow clients with
    the secrets; evaluate (generation) on one accelerator, with the signing key to verify the exports
    it scores (encode's and train's accelerators are requested by their launched jobs)."""
    for task in tasks:
        task.set_container_image(p.cpu_image)
        kubernetes.mount_pvc(task, pvc_name=p.pvc_name, mount_path=WORKSPACE)
        # the rest of "restricted" (no escalation, drop ALL, RuntimeDefault seccomp) is KFP's default
        kubernetes.set_security_context(task, run_as_non_root=True)
    for task in mlflow_clients:
        with_secrets(task)
    with_signing_key(evaluation)
    evaluation.set_container_image(p.accelerator_image)
    evaluation.set_accelerator_type(p.accelerator).set_accelerator_limit(1)
    kubernetes.add_node_selector_json(evaluation, p.node_selector)
    kubernetes.add_toleration_json(evaluation, p.tolerations)


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    return [_sorted(v) for v in value] if isinstance(value, list) else value


def recipe_arguments(recipe: str) -> dict[str, Any]:
    """The pipeline's parameter defaults for a recipe: params.yaml with recipes/<recipe>.yaml layered on,
    as `voxpipe <step> --recipe` reads it."""
    params = load_params(recipe=recipe)
    arguments: dict[str, Any] = {name: section_defaults(name, params) for name in SECTIONS}
    launch = params.launch
    arguments.update(accelerator=launch.accelerator, accelerator_image=launch.image,
                     launch_backend=launch.backend, node_selector=dict(launch.node_selector),
                     tolerations=list(launch.tolerations))
    if params.model.base != params.model.out:  # a real checkpoint, not init-model's
        arguments["base_model"] = params.model.base
    return arguments


def compile_pipeline(graph: GraphComponent, path: str, recipe: str | None = None) -> None:
    """Compile `graph` to `path` (with a recipe's values as the parameter defaults). KFP prints dict
    defaults into the header comment in protobuf map order, which changes from process to process;
    sorted here so the committed YAML only changes with the pipeline."""
    arguments = recipe_arguments(recipe) if recipe else None
    compiler.Compiler().compile(graph, path, pipeline_parameters=arguments)
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

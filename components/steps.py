"""The voxpipe steps that do more than components/generic.py's run_step, as KFP components of their own.

Each takes its params.yaml section as a dict (minus the paths the pipeline wires between steps),
its inputs as artifacts whose metadata names their folder on the workspace PVC, and runs
`voxpipe <step>` into a folder of its own there, as run_step does; what each adds is in its
docstring: the ingest fan-out (the data version check, the shard indices it returns, the collected
shards), init-model (a given checkpoint instead), encode and train (a launched job), evaluate (the
summary and page it renders for the UI), register and the sweep's (the KFP run id, the registry's
answer in the metadata, the grid's points). No `from __future__ import annotations` here:
KFP reads the Input/Output annotations at import time.
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Markdown, Metrics, Model, Output

# the helpers are shipped inside each component (additional_funcs); imported here for the reader and ruff
from components.shared import (
    COMPONENT,
    HELPERS,
    log_numbers,
    publish,
    run_here_or_launch,
    run_step,
    run_voxpipe,
    step_folder,
    wire,
)


def component(func):
    return dsl.component(func, additional_funcs=HELPERS, **COMPONENT)


@component
def ingest_plan(workspace: str, data_version: str, params: dict, plan: Output[Dataset]) -> list:
    """Sharded ingest, 1/3: the inputs split into `params["shards"]` shards of about equal audio volume;
    returns the shard indices, one fan-out task each. `data_version` must be the DVC md5 of
    `params["input"]` (what `dvc add` records): KFP's cache sees parameters, not the files behind a path."""
    from pathlib import Path

    from voxpipe.launch.workspace import inside_workspace
    from voxpipe.lineage import dvc_md5
    from voxpipe.steps.ingest import IngestParams

    folder = step_folder(workspace, "ingest-plan", plan.uri)
    section = wire("ingest", params, out=folder)
    inputs = section.get("input", IngestParams().input)
    for p in inputs:  # a StepError naming the key when a path climbs out of the workspace volume
        inside_workspace(workspace, "ingest.input", p)
    missing = [p for p in inputs if not (Path(workspace) / p).exists()]
    if missing:
        raise FileNotFoundError(f"ingest.input {missing}: not on the workspace {workspace}")
    actual = ",".join(dvc_md5(Path(workspace) / p) for p in inputs)
    if data_version != actual:
        raise ValueError(
            f"data_version {data_version!r} does not match the data: ingest.input {inputs} has DVC md5 "
            f"{actual!r}. Pass data_version={actual!r} (KFP caches on it)."
        )
    run_voxpipe("ingest-plan", workspace, {"ingest": section})
    return list(range(len(publish(plan, folder, report="plan.json", data_version=data_version)["shards"])))


@component
def ingest_shard(workspace: str, params: dict, plan: Input[Dataset], index: int, shard: Output[Dataset]):
    """Sharded ingest, 2/3: one shard of the plan → its own folder (FLAC clips, raw.jsonl, quarantine)."""
    import os

    folder = step_folder(workspace, "ingest-shard", shard.uri, part=str(index))
    plan_file = os.path.join(plan.metadata["path"], "plan.json")
    run_voxpipe("ingest-shard", workspace, {"ingest": wire("ingest", params, plan=plan_file, shard=index,
                                                           out=folder)})
    publish(shard, folder)


@component
def ingest_merge(workspace: str, params: dict, plan: Input[Dataset], shards: Input[list[Dataset]],
                 data: Output[Dataset], report: Output[HTML]):
    """Sharded ingest, 3/3: the shards merged (duplicates across shards, global accounting) into the
    raw.jsonl + audio/ a single `voxpipe ingest` writes, byte for byte. The UI shows `report`, the
    data report (speakers, durations, loudness, quality, quarantine reasons, the extreme rows)."""
    import os
    import shutil

    folder = step_folder(workspace, "ingest", data.uri)
    section = wire("ingest", params, plan=os.path.join(plan.metadata["path"], "plan.json"),
                   shard_dirs=[s.metadata["path"] for s in shards], out=folder)
    run_voxpipe("ingest-merge", workspace, {"ingest": section})
    publish(data, folder, data_version=plan.metadata["data_version"])
    os.makedirs(os.path.dirname(report.path), exist_ok=True)
    shutil.copyfile(os.path.join(folder, "data-report.html"), report.path)


@component
def init_model(workspace: str, params: dict, base_model: str, model: Output[Model]):
    """The base model: `base_model` (a checkpoint folder on the workspace, upstream VoxCPM2 layout)
    when given, else a random-init checkpoint of `params["preset"]`."""
    import json
    import os

    from voxpipe.launch.workspace import inside_workspace
    from voxpipe.voxcpm2_format import is_checkpoint

    if base_model:
        folder = inside_workspace(workspace, "base_model", base_model)
        if not is_checkpoint(folder):
            raise FileNotFoundError(f"base_model {base_model}: no config.json in {folder}")
        os.makedirs(os.path.dirname(model.path), exist_ok=True)
        with open(model.path, "w", encoding="utf-8") as f:
            json.dump({"base_model": base_model}, f)
        model.metadata.update({"path": folder, "source": base_model})
        return
    folder = step_folder(workspace, "init-model", model.uri)
    run_voxpipe("init-model", workspace, {"model": wire("model", params, out=folder)})
    publish(model, folder, source=f"init-model:{params.get('preset', 'tiny')}")


@component
def encode(workspace: str, params: dict, launch: dict, backend: str, image: str, accelerator: str,
           node_selector: dict, tolerations: list, pvc_name: str, manifest: Input[Dataset],
           base_model: Input[Model], encoded: Output[Dataset]):
    """Manifests → AudioVAE latents + token ids (safetensors shards). `backend` volcano / trainjob: as a
    job on launch.encode_devices accelerators (`voxpipe launch-encode`), torchrun in every pod; in-task:
    in this process (kfp.local, a one-node CPU cluster)."""
    spec = {"step": "encode", "inputs": ["manifest", "base_model"], "output": "encoded",
            "wiring": {"encode.manifest": ["{manifest}/train.jsonl", "{manifest}/val.jsonl"],
                       "encode.out": "{out}", "model.base": "{base_model}"}}

    def launched(step, workspace, sections):
        run_here_or_launch(step, workspace, sections, backend, launch, image, accelerator, node_selector,
                           tolerations, pvc_name)

    run_step(spec, workspace, {"encode": params}, run=launched, manifest=manifest, base_model=base_model,
             encoded=encoded)


@component
def train(workspace: str, params: dict, launch: dict, tracking: dict, tracking_uri: str, backend: str,
          image: str, accelerator: str, node_selector: dict, tolerations: list, pvc_name: str,
          encoded: Input[Dataset], base_model: Input[Model], model: Output[Model], metrics: Output[Metrics],
          part: str = ""):
    """FSDP2 fine-tuning. `backend` volcano / trainjob: as a gang-scheduled Volcano Job or Kubeflow
    Trainer TrainJob (`voxpipe launch-train`: submit, watch, fail with the failing pod's log), torchrun
    in every pod; in-task: in this process (kfp.local, a one-node CPU cluster). `part`: a sweep's point
    (the iterations of a ParallelFor share the artifact URI its folder is named from)."""
    import os

    folder = step_folder(workspace, "train", model.uri, part)
    sections = {
        "train": wire("train", params, data=encoded.metadata["path"], out=folder),
        "model": {"base": base_model.metadata["path"]},
        "tracking": wire("tracking", tracking, uri=tracking_uri, work=folder),
    }
    run_here_or_launch("train", workspace, sections, backend, launch, image, accelerator, node_selector,
                       tolerations, pvc_name)
    report = publish(model, folder, export=os.path.join(folder, "export"))
    val = report["val_curve"][-1] if report["val_curve"] else {}
    log_numbers(metrics, {**report["final"], **val, "steps": report["steps"],
                          "tokens_per_s": report["tokens_per_s"]})


@component
def evaluate(workspace: str, params: dict, train: dict, model: Input[Model], base_model: Input[Model],
             encoded: Input[Dataset], results: Output[Dataset], metrics: Output[Metrics],
             summary: Output[Markdown], page: Output[HTML], part: str = ""):
    """Fixed-seed loss and voice metrics of the fine-tune against its base model, in the trainer's
    val batches (`train["max_tokens"]`). The UI shows `summary` (figures, promotion verdict) and `page`
    (plots and playable samples, embedded)."""
    from pathlib import Path

    from voxpipe.evaluate.pages import eval_page, summary_markdown

    spec = {"step": "evaluate", "inputs": ["model", "base_model", "encoded"], "output": "results",
            "report": "eval.json", "metrics": True,
            "wiring": {"evaluate.model": "{model}/export", "evaluate.data": "{encoded}",
                       "evaluate.out": "{out}", "model.base": "{base_model}"}}
    figures = run_step(spec, workspace, {"evaluate": params, "train": train}, part, model=model,
                       base_model=base_model, encoded=encoded, results=results, metrics=metrics)
    folder = results.metadata["path"]
    for artifact, text in ((summary, summary_markdown(figures)), (page, eval_page(Path(folder)))):
        Path(artifact.path).parent.mkdir(parents=True, exist_ok=True)
        Path(artifact.path).write_text(text, encoding="utf-8")


@component
def register(workspace: str, params: dict, ingest: dict, tracking: dict, tracking_uri: str, kfp_run_id: str,
             data: Input[Dataset], model: Input[Model], evaluation: Input[Dataset], mfu: Input[Dataset],
             registered: Output[Artifact], part: str = ""):
    """The run into MLflow and the export into its registry (@candidate; @champion when it wins).
    `kfp_run_id` (the pipeline passes KFP's run id) tags the MLflow run; `ingest`'s input names the voice's
    registered model when register.model_name is unset."""
    import os

    from voxpipe.steps.ingest import IngestParams

    os.environ["KFP_RUN_ID"] = kfp_run_id
    folder = step_folder(workspace, "register", registered.uri, part)
    section = wire(
        "register", params, model=model.metadata["export"], train=model.metadata["path"],
        eval=os.path.join(evaluation.metadata["path"], "eval.json"),
        mfu=os.path.join(mfu.metadata["path"], "mfu.json"), ingest=data.metadata["path"], out=folder,
    )
    cluster_tracking = wire("tracking", tracking, uri=tracking_uri, work=folder)
    voice = {"input": ingest.get("input", IngestParams().input)}
    run_voxpipe("register", workspace, {"register": section, "ingest": voice, "tracking": cluster_tracking})
    done = publish(registered, folder, report="registered.json")
    # a sweep's child (tracking.parent_run) has a run but no version: sweep_close registers the best
    registered.metadata.update({k: done[k] for k in ("name", "version", "aliases", "model_uri", "run_id")
                                if k in done})


# -- a sweep (pipelines/sweep.py): one parent run, the grid's points fanned out, the best registered -----
@component
def sweep_open(workspace: str, grid: list, ingest: dict, register: dict, tracking: dict, tracking_uri: str,
               sweep: Output[Artifact]) -> list:
    """`voxpipe sweep-open`: the sweep's MLflow parent run, the grid recorded on it. Returns the points,
    one ParallelFor iteration each: {"point": {key: value}, "part": its name, "parent_run": the id}. The
    swept keys are train's and evaluate's: the steps before train run once for every point."""
    import json

    from voxpipe.steps.ingest import IngestParams

    for entry in grid:
        if entry.split("=")[0].split(".")[0] not in ("train", "evaluate"):
            raise ValueError(f"sweep grid {entry!r}: the cluster sweep varies train.* and evaluate.* keys "
                             "(one ingest and encode serve every point); run another pipeline for other data")
    folder = step_folder(workspace, "sweep-open", sweep.uri)
    cluster_tracking = wire("tracking", tracking, uri=tracking_uri, work=folder)
    voice = {"input": ingest.get("input", IngestParams().input)}
    name = {k: v for k, v in register.items() if k == "model_name"}
    run_voxpipe("sweep-open", workspace, {"sweep": {"grid": list(grid), "out": folder}, "ingest": voice,
                                          "register": name, "tracking": cluster_tracking})
    record = publish(sweep, folder, report="sweep.json")
    sweep.metadata["parent_run"] = record["parent_run"]
    return [{"point": p, "part": json.dumps(p, sort_keys=True), "parent_run": record["parent_run"]}
            for p in record["points"]]


@component
def sweep_point(item: dict, train: dict, evaluate: dict, tracking: dict) -> NamedTuple(
        "Point", [("train", dict), ("evaluate", dict), ("tracking", dict), ("part", str)]):
    """One point's sections: the pipeline's train / evaluate with the point's values set, and tracking
    with the sweep's parent run (so its register logs a child and registers no version)."""
    import copy
    from collections import namedtuple

    sections = copy.deepcopy({"train": train, "evaluate": evaluate})
    for key, value in item["point"].items():
        node = sections
        *path, last = key.split(".")
        for name in path:
            node = node.setdefault(name, {})
        node[last] = value
    point = namedtuple("Point", ["train", "evaluate", "tracking", "part"])
    return point(sections["train"], sections["evaluate"], {**tracking, "parent_run": item["parent_run"]},
                 item["part"])


@component
def sweep_close(workspace: str, ingest: dict, register: dict, tracking: dict, tracking_uri: str,
                sweep: Input[Artifact], children: Input[list[Artifact]], best: Output[Artifact]):
    """`voxpipe sweep-close` once every point is registered (`children`): the best by the promotion rule
    and the loss is tagged on the parent and registered, @champion only by beating the current one."""
    from voxpipe.steps.ingest import IngestParams

    folder = step_folder(workspace, "sweep-close", best.uri)
    cluster_tracking = wire("tracking", tracking, uri=tracking_uri, work=folder,
                            parent_run=sweep.metadata["parent_run"])
    voice = {"input": ingest.get("input", IngestParams().input)}
    name = {k: v for k, v in register.items() if k == "model_name"}
    run_voxpipe("sweep-close", workspace, {"sweep": {"out": folder}, "ingest": voice, "register": name,
                                           "tracking": cluster_tracking})
    done = publish(best, folder, report="sweep.json")
    best.metadata.update({"best_run": done["best"], "children": len(children), **done["registered"]})

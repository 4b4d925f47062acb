"""What every voxpipe component does around its step, shipped into each one (`additional_funcs`).

A lightweight component runs only its own function source, so these helpers import inside
themselves. Bulk data (audio, latents, checkpoints) stays on the workspace PVC; KFP artifacts carry
the step's report.json and, in their metadata, the folder on the PVC.
"""

from __future__ import annotations

from typing import Any

# The project images (images/Dockerfile.*), with voxpipe and kfp installed: nothing is pip-installed
# when a component runs. The pipeline swaps in the registry's names (its image parameters).
CPU_IMAGE = "voxpipe:0.1.0-cpu"
COMPONENT = {"base_image": CPU_IMAGE, "install_kfp_package": False}


def step_folder(workspace: str, step: str, artifact_uri: str, part: str = "") -> str:
    """A folder of its own on the workspace for this task of this run, the same on every retry.

    Named from the task's output artifact URI (`<root>/<pipeline>/<run id>/<task>/<artifact>`), which
    is not part of KFP's cache key: a cached task hands on the folder of the execution that made it.
    KFP >= 2.5 puts a fresh uuid before `<artifact>` each time its driver runs, so a retried task
    would get a new URI; that uuid is left out, so a retry finds the checkpoints (and the reusable
    shards and audio) of the attempt before. Without it the iterations of a ParallelFor share one
    URI: `part` (the iteration's item) tells them apart.
    """
    import hashlib
    import os
    import re

    uuid = r"/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}(/[^/]+)$"
    stable = re.sub(uuid, r"\1", artifact_uri)
    digest = hashlib.sha256(f"{stable}#{part}".encode()).hexdigest()[:16]
    return os.path.join(workspace, "voxpipe", f"{step}-{digest}")


def wire(section: str, values: dict[str, Any], **paths: Any) -> dict[str, Any]:
    """The step's params section: the user's values plus the paths the pipeline wires between steps.

    KFP passes dict parameters through protobuf Struct, where every number is a float; integral
    floats become ints again (the schema is strict and float fields take ints).
    """

    def ints(value: Any) -> Any:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, dict):
            return {k: ints(v) for k, v in value.items()}
        if isinstance(value, list):
            return [ints(v) for v in value]
        return value

    taken = sorted(set(values) & set(paths))
    if taken:
        raise ValueError(f"{section}: {', '.join(taken)} are set by the pipeline (from the previous steps)")
    return {**ints(values), **paths}


def run_voxpipe(step: str, workspace: str, sections: dict[str, Any]) -> None:
    """`voxpipe <step>` in this process, in the workspace (relative paths land on the PVC, as in the
    launched pods), with a params file holding exactly these sections."""
    import os
    import tempfile

    import yaml

    from voxpipe.cli import main

    os.makedirs(workspace, exist_ok=True)
    os.chdir(workspace)
    with tempfile.TemporaryDirectory() as tmp:
        params = os.path.join(tmp, "params.yaml")
        with open(params, "w", encoding="utf-8") as f:
            yaml.safe_dump(sections, f, sort_keys=False)
        code = main([step, "--params", params])
    if code != 0:
        raise RuntimeError(f"voxpipe {step} failed with exit code {code} (its message is above)")


def run_here_or_launch(step: str, workspace: str, sections: dict[str, Any], backend: str,
                       launch: dict[str, Any], image: str, accelerator: str, node_selector: dict,
                       tolerations: list, pvc_name: str) -> None:
    """`voxpipe launch-<step>` through launch.backend=`backend` (`volcano`: a Volcano Job, `trainjob`: a
    Kubeflow Trainer TrainJob; gang-scheduled, torchrun in every pod, watched from here), or, for
    `in-task`, `voxpipe <step>` in this process (kfp.local, a one-node CPU cluster)."""
    if backend == "in-task":
        run_voxpipe(step, workspace, sections)
        return
    cluster = wire("launch", launch, backend=backend, image=image, accelerator=accelerator,
                   node_selector=node_selector, tolerations=tolerations, pvc=pvc_name, mount_path=workspace,
                   dry_run=False)
    run_voxpipe(f"launch-{step}", workspace, {**sections, "launch": cluster})


def publish(artifact: Any, folder: str, report: str = "report.json", **metadata: Any) -> dict[str, Any]:
    """Copy the step's report into the artifact, record the folder; returns the report."""
    import json
    import os
    import shutil

    os.makedirs(os.path.dirname(artifact.path), exist_ok=True)
    source = os.path.join(folder, report)
    shutil.copyfile(source, artifact.path)
    artifact.metadata.update({"path": folder, **metadata})
    with open(source, encoding="utf-8") as f:
        return json.load(f)


def run_step(spec: dict[str, Any], workspace: str, sections: dict[str, Any], part: str = "", run: Any = None,
             **artifacts: Any) -> dict[str, Any]:
    """Any `voxpipe <step>` as a task: what every generic component (components/generic.py) runs, and
    the step-specific ones that fit it (encode, evaluate).

    `spec` (the component's, compiled in): `step`; `wiring`, each wired `section.key` (the schema's
    `wired` mark) as a template, `{name}` standing for the folder of the input artifact `name` (its
    metadata["path"]) or, `{out}`, this task's own folder, a list of templates for a list key;
    `output`, the artifact the step's `report` is published into; `views`, further output artifacts
    copied from files of the folder (mfu.md shown in the UI); `metrics`, whether the report's flat
    numbers become KFP metrics (`report`, `views`, `metrics` optional). `sections`: the user's values
    of each params section the step reads. `run(step, workspace, sections)` runs it (run_voxpipe, in
    this process, unless given: encode's launches a job). Returns the report.
    """
    import os
    import shutil

    output = artifacts[spec["output"]]
    folder = step_folder(workspace, spec["step"], output.uri, part)
    folders = {name: a.metadata["path"] for name, a in artifacts.items() if name in spec["inputs"]}
    folders["out"] = folder

    def fill(template: Any) -> Any:
        if isinstance(template, list):
            return [fill(t) for t in template]
        return template.format_map(folders) if isinstance(template, str) else template

    wired: dict[str, dict[str, Any]] = {}
    for key, template in spec["wiring"].items():
        section, name = key.split(".", 1)
        wired.setdefault(section, {})[name] = fill(template)
    params = {name: wire(name, sections.get(name, {}), **wired.get(name, {}))
              for name in {**sections, **wired}}
    (run or run_voxpipe)(spec["step"], workspace, params)
    report = publish(output, folder, report=spec.get("report", "report.json"))
    for name, file in spec.get("views", {}).items():
        os.makedirs(os.path.dirname(artifacts[name].path), exist_ok=True)
        shutil.copyfile(os.path.join(folder, file), artifacts[name].path)
    if spec.get("metrics"):
        log_numbers(artifacts["metrics"], report)
    return report


def log_numbers(metrics: Any, figures: dict[str, Any]) -> None:
    """The flat numeric figures of a report as KFP metrics (shown in the run's UI)."""
    import math

    for key, value in figures.items():
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            metrics.log_metric(key, value)


HELPERS = [step_folder, wire, run_voxpipe, run_here_or_launch, publish, log_numbers, run_step]

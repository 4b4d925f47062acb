"""One component definition for every plain voxpipe step: `step_task` gives any `voxpipe <step>` a KFP task.

A plain step reads params sections, takes folders of earlier steps into its wired keys, writes into a
folder of its own and leaves a report there; `shared.run_step` does all of that from a spec. KFP
reads a component's typed signature (its inputs and outputs in the compiled pipeline and the UI) from
the function's source, so the factory writes that source: a signature with the step's own artifact
names and types, and a one-line body calling run_step with the spec. The step-specific components of
components/steps.py are the steps that do more than this (see its docstring).
"""

from __future__ import annotations

import functools
import json
import linecache
from typing import Any

from kfp import dsl

from components.shared import COMPONENT, HELPERS

ARTIFACTS = {cls.schema_title: cls for cls in (dsl.Artifact, dsl.Dataset, dsl.Model, dsl.Metrics, dsl.HTML,
                                                dsl.Markdown)}


def section_names(step: str, sections: tuple[str, ...]) -> list[str]:
    """The component parameter of each section: `params` for the step's own (as the step-specific
    components name it), the others' by their section names."""
    return ["params" if section == step else section for section in sections]


@functools.cache
def step_component(step: str, sections: tuple[str, ...], inputs: tuple[tuple[str, str], ...],
                   wiring: str, output: tuple[str, str], report: str, views: tuple[tuple[str, str, str], ...],
                   metrics: bool) -> Any:
    """The component of `voxpipe <step>` (see step_task; hashable arguments, so one component per shape:
    the compiled pipeline holds it once however many tasks use it). Its parameters: `workspace`, the
    sections (the step's own, named as the step, as `params`; the others by their names), the inputs,
    the outputs, `part`."""
    names = section_names(step, sections)
    artifacts = [name for name, _ in inputs] + [output[0]] + [name for name, _, _ in views]
    reserved = {*names, "workspace", "part", "run", *["metrics"] * metrics}
    clash = sorted(reserved & set(artifacts))
    if clash:
        raise ValueError(f"step {step}: artifact names {clash} are taken by its parameters")
    signature = ["workspace: str", *(f"{name}: dict" for name in names)]
    signature += [f"{name}: Input[{ARTIFACTS[kind].__name__}]" for name, kind in inputs]
    signature += [f"{output[0]}: Output[{ARTIFACTS[output[1]].__name__}]"]
    signature += [f"{name}: Output[{ARTIFACTS[kind].__name__}]" for name, _, kind in views]
    signature += ["metrics: Output[Metrics]"] * metrics + ['part: str = ""']
    spec = {"step": step, "inputs": [name for name, _ in inputs], "wiring": json.loads(wiring),
            "output": output[0], "report": report, "views": {name: file for name, file, _ in views},
            "metrics": metrics}
    given = ", ".join(f"{name}={name}" for name in artifacts + ["metrics"] * metrics)
    sections_arg = ", ".join(f"{section!r}: {name}" for section, name in zip(sections, names, strict=True))
    function = step.replace("-", "_")
    source = (f"def {function}({', '.join(signature)}):\n"
              f"    run_step({spec!r}, workspace, {{{sections_arg}}}, part, {given})\n")
    # inspect.getsource (what KFP ships) finds the text of a function made here in linecache
    filename = f"<voxpipe step component {function}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace: dict[str, Any] = {"Input": dsl.Input, "Output": dsl.Output, **{c.__name__: c for c in
                                                                             ARTIFACTS.values()}}
    # dont_inherit: real annotations, not this module's lazy ones (KFP reads their types)
    exec(compile(source, filename, "exec", dont_inherit=True), namespace)
    return dsl.component(namespace[function], additional_funcs=HELPERS, **COMPONENT)


def step_task(step: str, workspace: Any, sections: dict[str, Any], inputs: dict[str, Any] | None = None,
              wiring: dict[str, Any] | None = None, output: tuple[str, type] = ("out", dsl.Dataset),
              report: str = "report.json", views: dict[str, tuple[str, type]] | None = None,
              metrics: bool = False, part: Any = None) -> dsl.PipelineTask:
    """A task running `voxpipe <step>`, in a pipeline (or alone under kfp.local).

    sections: each params section the step reads -> the pipeline's dict for it (a section holding only
    wired keys is made from `wiring`); inputs: name -> an earlier task's output artifact; wiring:
    `section.key` -> a template of its value, `{name}` for an input's folder, `{out}` for this task's own
    (`{"mfu.out": "{out}"}`); output: the artifact (name, type) that gets `report`, a file of the step's
    folder; views: further output artifacts, name -> (a file of the folder, type); metrics: the report's
    numbers as KFP metrics; part: what tells the iterations of a ParallelFor apart.
    """
    inputs, views = inputs or {}, views or {}
    kinds = tuple((name, channel.channel_type.split("@")[0]) for name, channel in inputs.items())
    component = step_component(
        step, tuple(sections), kinds, json.dumps(wiring or {}, sort_keys=True),
        (output[0], output[1].schema_title), report,
        tuple((name, file, kind.schema_title) for name, (file, kind) in views.items()), metrics)
    arguments = dict(zip(section_names(step, tuple(sections)), sections.values(), strict=True))
    if part is not None:
        arguments["part"] = part
    return component(workspace=workspace, **arguments, **inputs)

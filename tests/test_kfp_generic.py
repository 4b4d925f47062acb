"""A new step gets a KFP task with no component code: a toy step, declared as voxpipe/steps/ modules are,
runs twice under kfp.local through components/generic.py's step_task, the second task reading the
first one's folder through a wired key."""

# no `from __future__ import annotations`: KFP reads the pipeline's annotations at import time
import json
import os
from pathlib import Path

import pytest
from kfp import dsl

from components.generic import step_task

pytestmark = [
    pytest.mark.slow,  # a pipeline under kfp.local
    pytest.mark.filterwarnings("ignore:You may be attemping to run a task:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:.*have no effect in the current local runner:UserWarning"),
]
# the toy step's module, what a new step adds to voxpipe/steps/: its section, its descriptor, its function
TOY = '''
import json
from pathlib import Path

from pydantic import Field

from voxpipe.section import Section
from voxpipe.steps import Step


class ToyParams(Section):
    """`toy`: adds `step` to the count in the report of the step before."""

    input: str = Field("", description="report.json of the step before ('' = start at 0)",
                       json_schema_extra={"result": False, "wired": True})
    out: str = Field("work/toy", description="output folder: report.json",
                     json_schema_extra={"result": False, "wired": True})
    step: int = Field(1, description="what is added")


def count(params: ToyParams) -> None:
    before = json.loads(Path(params.input).read_text())["count"] if params.input else 0
    Path(params.out).mkdir(parents=True, exist_ok=True)
    Path(params.out, "report.json").write_text(json.dumps({"count": before + params.step, "note": "toy"}))


ORDER = 1000
SECTIONS = {"toy": ToyParams}
STEPS = (Step("toy", "add to a count", target="voxpipe.steps.toy:count", reads=("toy",), section="toy"),)
'''
# voxpipe/steps/ finds its modules on the package's path: the tasks' interpreters get the toy's folder there
SITECUSTOMIZE = '''
import os
import voxpipe.steps
voxpipe.steps.__path__.append(os.environ["VOXPIPE_TEST_TOY_STEPS"])
'''


def test_a_toy_step_runs_as_kfp_tasks_through_the_generic_component(local_runner, monkeypatch):
    toy, site = local_runner / "toy_steps", local_runner / "site"
    toy.mkdir()
    site.mkdir()
    (toy / "toy.py").write_text(TOY)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("VOXPIPE_TEST_TOY_STEPS", str(toy))
    monkeypatch.setenv("PYTHONPATH", f"{site}:{os.environ.get('PYTHONPATH', '')}")
    workspace = local_runner / "workspace"

    @dsl.pipeline
    def toy_pipeline(workspace: str, toy: dict) -> dsl.Dataset:
        first = step_task("toy", workspace, {"toy": toy}, wiring={"toy.out": "{out}"}, metrics=True)
        second = step_task("toy", workspace, {"toy": toy}, {"before": first.outputs["out"]},
                           {"toy.input": "{before}/report.json", "toy.out": "{out}"}, metrics=True)
        return second.outputs["out"]

    run = toy_pipeline(workspace=str(workspace), toy={"step": 3})
    folder = Path(run.output.metadata["path"])
    assert json.loads((folder / "report.json").read_text()) == {"count": 6, "note": "toy"}
    assert folder.parent == workspace / "voxpipe" and folder.name.startswith("toy-")
    assert len(list((workspace / "voxpipe").glob("toy-*"))) == 2  # a folder of its own for each task
    outputs = [json.loads(p.read_text()) for p in (local_runner / "kfp").rglob("executor_output.json")]
    metrics = [o["artifacts"]["metrics"]["artifacts"][0]["metadata"] for o in outputs]
    assert sorted(metrics, key=str) == [{"count": 3}, {"count": 6}]  # the report's numbers, not its text

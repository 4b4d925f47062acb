"""The sweep pipeline for Kubeflow Pipelines: one ingest / manifest / encode, the grid's points fanned out.

    python -m pipelines.sweep [OUT.yaml]   # `make generate`: pipelines/sweep.yaml

`sweep_open` makes the sweep's MLflow parent run and returns the grid's points; a `dsl.ParallelFor` over
them runs train (through the same launcher as pipelines/finetune.py: a Volcano Job or a Kubeflow
TrainJob, or in-task under kfp.local) -> evaluate + mfu -> register, each register logging a child of
the parent and registering no version; `sweep_close`, after every point (`dsl.Collected`), registers
only the best (voxpipe/track/sweep.py). The parameters, the data steps and the task setup are
pipelines/common.py's, as finetune's, so KFP's cache and the data version check work as there. The
grid varies train.* and evaluate.* keys.
"""

import argparse
import functools
from types import SimpleNamespace

from kfp import dsl
from kfp.dsl.graph_component import GraphComponent

from components import steps
from pipelines.common import (
    PARAMETERS_DOC,
    compile_pipeline,
    first_steps,
    mfu_task,
    pipeline_function,
    set_up,
)

GRID = ["train.lr=5e-5,1e-4"]  # the default grid: two learning rates


def sweep(p: SimpleNamespace) -> dsl.Artifact:
    first = first_steps(p)
    base, encoded = first.base.outputs["model"], first.encoded.outputs["encoded"]
    opened = steps.sweep_open(workspace=p.workspace, grid=p.grid, ingest=p.ingest, register=p.register,
                              tracking=p.tracking, tracking_uri=p.mlflow_tracking_uri)
    with dsl.ParallelFor(opened.outputs["Output"]) as item:
        point = steps.sweep_point(item=item, train=p.train, evaluate=p.evaluate, tracking=p.tracking)
        part = point.outputs["part"]
        tuned = steps.train(
            workspace=p.workspace, params=point.outputs["train"], launch=p.launch,
            tracking=point.outputs["tracking"], tracking_uri=p.mlflow_tracking_uri, backend=p.launch_backend,
            image=p.accelerator_image, accelerator=p.accelerator, node_selector=p.node_selector,
            tolerations=p.tolerations, pvc_name=p.pvc_name, encoded=encoded, base_model=base, part=part,
        )
        evaluation = steps.evaluate(workspace=p.workspace, params=point.outputs["evaluate"],
                                    train=point.outputs["train"], model=tuned.outputs["model"],
                                    base_model=base, encoded=encoded, part=part)
        utilisation = mfu_task(p, tuned, first.base, part)
        child = steps.register(
            workspace=p.workspace, params=p.register, ingest=p.ingest, tracking=point.outputs["tracking"],
            tracking_uri=p.mlflow_tracking_uri, kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            data=first.data.outputs["data"], model=tuned.outputs["model"],
            evaluation=evaluation.outputs["results"], mfu=utilisation.outputs["results"], part=part,
        )
        child.set_caching_options(False)  # a new pipeline run is a new child run
    closed = steps.sweep_close(workspace=p.workspace, ingest=p.ingest, register=p.register,
                               tracking=p.tracking, tracking_uri=p.mlflow_tracking_uri,
                               sweep=opened.outputs["sweep"],
                               children=dsl.Collected(child.outputs["registered"]))
    for task in (opened, closed):
        task.set_caching_options(False)  # a new sweep is a new parent run
    set_up(p, [*first.all, opened, point, tuned, evaluation, utilisation, child, closed],
           [opened, tuned, child, closed], evaluation)
    return closed.outputs["best"]


sweep.__doc__ = ("grid: the swept settings, `section.key=A,B` each (train.* and evaluate.*; every "
                 "combination runs); " + PARAMETERS_DOC)


@functools.cache
def sweep_pipeline() -> GraphComponent:
    """Built on first use, as finetune_pipeline is (KFP's decoration is slow in a process with torch)."""
    return dsl.pipeline(
        name="voxpipe-sweep",
        description="Sweep VoxCPM2 fine-tunes: one ingest and encode, train -> evaluate -> MLflow child run "
        "per grid point (ParallelFor), then only the best registered.",
    )(pipeline_function("sweep", sweep, {"grid": (list, GRID)}))


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description="compile the sweep pipeline (`make generate`)")
    cli.add_argument("out", nargs="?", default="pipelines/sweep.yaml")
    compile_pipeline(sweep_pipeline(), cli.parse_args().out)

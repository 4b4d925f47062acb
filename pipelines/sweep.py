"""The sweep pipeline for Kubeflow Pipelines: one ingest / manifest / encode, the grid's points fanned out.

    python -m pipelines.sweep [OUT.yaml]   # `make generate`: pipelines/sweep.yaml

`sweep_open` makes the sweep's MLflow parent run and returns the grid's points; a `dsl.ParallelFor` over
them runs train (through the same launcher as pipelines/finetune.py: a Volcano Job or a Kubeflow
TrainJob, or in-task under kfp.local) -> evaluate + mfu -> register, each register logging a child of
the parent and registering no version; `sweep_close`, after every point (`dsl.Collected`), registers
only the best (voxpipe/track/sweep.py). The data steps are finetune's own tasks, so KFP's cache and the
data version check work as there. The grid varies train.* and evaluate.* keys.
"""

import argparse
import functools

from kfp import dsl, kubernetes
from kfp.dsl.graph_component import GraphComponent

from components import steps
from components.shared import CPU_IMAGE
from pipelines.finetune import (
    ENCODE,
    EVALUATE,
    INGEST,
    LAUNCH,
    LAUNCH_SECTION,
    MANIFEST,
    MFU,
    MLFLOW_SERVICE,
    MODEL,
    NODE_SELECTOR,
    REGISTER,
    TOLERATIONS,
    TRACKING,
    TRAIN,
    WORKSPACE,
    compile_pipeline,
    fan_out_ingest,
    with_secrets,
    with_signing_key,
)

GRID = ["train.lr=5e-5,1e-4"]  # the default grid: two learning rates


def sweep(
    data_version: str,
    grid: list = GRID,
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
    """grid: the swept settings, `section.key=A,B` each (train.* and evaluate.*; every combination
    runs); the other parameters as pipelines/finetune.py's."""
    planned, shard, data = fan_out_ingest(workspace, data_version, ingest)
    rows = steps.manifest(workspace=workspace, params=manifest, data=data.outputs["data"])
    checked = steps.validate(workspace=workspace, ingest=ingest, manifest=rows.outputs["manifest"])
    base = steps.init_model(workspace=workspace, params=model, base_model=base_model)
    encoded = steps.encode(
        workspace=workspace, params=encode, launch=launch, backend=launch_backend, image=accelerator_image,
        accelerator=accelerator, node_selector=node_selector, tolerations=tolerations, pvc_name=pvc_name,
        manifest=rows.outputs["manifest"], base_model=base.outputs["model"],
    ).after(checked)
    opened = steps.sweep_open(workspace=workspace, grid=grid, ingest=ingest, register=register,
                              tracking=tracking, tracking_uri=mlflow_tracking_uri)
    with dsl.ParallelFor(opened.outputs["Output"]) as item:
        point = steps.sweep_point(item=item, train=train, evaluate=evaluate, tracking=tracking)
        part = point.outputs["part"]
        tuned = steps.train(
            workspace=workspace, params=point.outputs["train"], launch=launch,
            tracking=point.outputs["tracking"], tracking_uri=mlflow_tracking_uri, backend=launch_backend,
            image=accelerator_image,
            accelerator=accelerator, node_selector=node_selector, tolerations=tolerations, pvc_name=pvc_name,
            encoded=encoded.outputs["encoded"], base_model=base.outputs["model"], part=part,
        )
        evaluation = steps.evaluate(workspace=workspace, params=point.outputs["evaluate"],
                                    train=point.outputs["train"], model=tuned.outputs["model"],
                                    base_model=base.outputs["model"], encoded=encoded.outputs["encoded"],
                                    part=part)
        utilisation = steps.mfu(workspace=workspace, params=mfu, model=tuned.outputs["model"],
                                base_model=base.outputs["model"], part=part)
        child = steps.register(
            workspace=workspace, params=register, ingest=ingest, tracking=point.outputs["tracking"],
            tracking_uri=mlflow_tracking_uri, kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            data=data.outputs["data"], model=tuned.outputs["model"], evaluation=evaluation.outputs["results"],
            mfu=utilisation.outputs["results"], part=part,
        )
        child.set_caching_options(False)  # a new pipeline run is a new child run
    closed = steps.sweep_close(workspace=workspace, ingest=ingest, register=register, tracking=tracking,
                               tracking_uri=mlflow_tracking_uri, sweep=opened.outputs["sweep"],
                               children=dsl.Collected(child.outputs["registered"]))
    for task in (opened, closed):
        task.set_caching_options(False)  # a new sweep is a new parent run

    tasks = (planned, shard, data, rows, checked, base, encoded, opened, point, tuned, evaluation,
             utilisation, child, closed)
    for task in tasks:
        task.set_container_image(cpu_image)
        kubernetes.mount_pvc(task, pvc_name=pvc_name, mount_path=WORKSPACE)
        kubernetes.set_security_context(task, run_as_non_root=True)
    for task in (opened, tuned, child, closed):  # MLflow clients
        with_secrets(task)
    with_signing_key(evaluation)
    evaluation.set_container_image(accelerator_image)
    evaluation.set_accelerator_type(accelerator).set_accelerator_limit(1)
    kubernetes.add_node_selector_json(evaluation, node_selector)
    kubernetes.add_toleration_json(evaluation, tolerations)
    return closed.outputs["best"]


@functools.cache
def sweep_pipeline() -> GraphComponent:
    """Built on first use, as finetune_pipeline is (KFP's decoration is slow in a process with torch)."""
    return dsl.pipeline(
        name="voxpipe-sweep",
        description="Sweep VoxCPM2 fine-tunes: one ingest and encode, train -> evaluate -> MLflow child run "
        "per grid point (ParallelFor), then only the best registered.",
    )(sweep)


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description="compile the sweep pipeline (`make generate`)")
    cli.add_argument("out", nargs="?", default="pipelines/sweep.yaml")
    compile_pipeline(cli.parse_args().out, graph=sweep_pipeline())

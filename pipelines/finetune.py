"""The fine-tuning pipeline for Kubeflow Pipelines: the voxpipe steps wired by their artifacts.

    python -m pipelines.finetune [--recipe NAME] [OUT.yaml]   # `make compile`: pipelines/finetune.yaml

Its parameters and first steps (ingest, manifest, validate, base model, encode) are pipelines/common.py's,
shared with the sweep; then train, evaluate, mfu and register.
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


def finetune(p: SimpleNamespace) -> dsl.Artifact:
    first = first_steps(p)
    base, encoded = first.base.outputs["model"], first.encoded.outputs["encoded"]
    tuned = steps.train(
        workspace=p.workspace, params=p.train, launch=p.launch, tracking=p.tracking,
        tracking_uri=p.mlflow_tracking_uri, backend=p.launch_backend, image=p.accelerator_image,
        accelerator=p.accelerator, node_selector=p.node_selector, tolerations=p.tolerations,
        pvc_name=p.pvc_name, encoded=encoded, base_model=base,
    )
    evaluation = steps.evaluate(workspace=p.workspace, params=p.evaluate, train=p.train,
                                model=tuned.outputs["model"], base_model=base, encoded=encoded)
    utilisation = mfu_task(p, tuned, first.base)
    registered = steps.register(
        workspace=p.workspace, params=p.register, ingest=p.ingest, tracking=p.tracking,
        tracking_uri=p.mlflow_tracking_uri, kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        data=first.data.outputs["data"], model=tuned.outputs["model"],
        evaluation=evaluation.outputs["results"], mfu=utilisation.outputs["results"],
    )
    registered.set_caching_options(False)  # a new pipeline run is a new MLflow run and model version
    # train also signs checkpoints when in-task
    set_up(p, [*first.all, tuned, evaluation, utilisation, registered], [tuned, registered], evaluation)
    return registered.outputs["registered"]


finetune.__doc__ = PARAMETERS_DOC


@functools.cache
def finetune_pipeline() -> GraphComponent:
    """The pipeline, built on first use rather than at import: KFP builds the graph when it decorates,
    calling `inspect.stack()` for every task, which takes seconds in a process that has torch and mlflow
    loaded; whoever imports this module for its defaults does not need the graph."""
    return dsl.pipeline(
        name="voxpipe-finetune",
        description="Fine-tune VoxCPM2: ingest, manifest, validate, base model, encode, FSDP2 training (a "
        "Volcano Job or Kubeflow TrainJob), evaluate, MFU, MLflow registration.",
    )(pipeline_function("finetune", finetune))


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description="compile the pipeline (`make compile [RECIPE=NAME]`)")
    cli.add_argument("out", nargs="?", default="pipelines/finetune.yaml")
    cli.add_argument("--recipe", default=None, help="recipes/NAME.yaml's values as the parameter defaults")
    args = cli.parse_args()
    compile_pipeline(finetune_pipeline(), args.out, args.recipe)

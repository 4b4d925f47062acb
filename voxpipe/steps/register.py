"""`register`'s section and the registry-init and register steps (register is a stage)."""

from __future__ import annotations

from pydantic import Field

from voxpipe.section import Section
from voxpipe.steps import Out, Stage, Step


class RegisterParams(Section):
    """`register`: the pipeline run into MLflow, the export as a registered pyfunc model version."""

    model: str | None = Field(
        None, description="exported checkpoint folder (upstream layout); None: the one evaluate chose "
        "(eval.json `chosen.path`). Given, it must be the checkpoint eval.json judged",
        json_schema_extra={"result": False, "wired": True},
    )
    eval: str = Field("work/eval/eval.json", description="evaluate's eval.json (samples/ next to it)",
                      json_schema_extra={"result": False, "wired": True})
    mfu: str = Field("work/mfu/mfu.json", description="the mfu step's mfu.json",
                     json_schema_extra={"result": False, "wired": True})
    train: str = Field("work/train", description="the train step's folder: report.json, metrics.jsonl",
                       json_schema_extra={"result": False, "wired": True})
    ingest: str | None = Field("work/ingest", description="ingest folder: the data version (None: none)",
                               json_schema_extra={"result": False, "wired": True})
    out: str = Field("work/register", description="output folder: registered.json",
                     json_schema_extra={"result": False, "wired": True})
    run_name: str | None = Field(
        None, description="the MLflow run's name; None: what the run is (`voxpipe-sample · full · 40 steps · "
        "lr 0.0001`)")
    model_name: str | None = Field(
        None, description="registered model name; None: `voxpipe-<voice>`, named after the data "
        "(ingest.input's folders or files: `voxpipe-sample` for the demo's data/sample), so each voice is a "
        "model of its own with its own @champion, and a new voice's first run is judged against its base only"
    )
    lock_timeout_s: float = Field(
        600.0, gt=0, le=86400, description="longest wait for the registry-wide register lock (another "
        "register holding it) before register stops", json_schema_extra={"result": False}
    )


ORDER = 110
SECTIONS = {"register": RegisterParams}

STEPS = (
    Step("registry-init", "create the MLflow experiment and registered model as the pipeline's account, "
         "others READ only (once per deployment, before the first register)",
         target="voxpipe.track.registry_init:registry_init",
         reads=("register.model_name", "ingest.input", "tracking"),
         out_folder=False),
    Step("register", "log the pipeline run to MLflow, register the export (@candidate; @champion when the "
         "promotion rule passes)", target="voxpipe.track.register:register",
         reads=("register", "ingest.input", "tracking", "model.base", "synthesize.watermark",
                "synthesize.watermark_off_reason", "launch.env", "launch.secret_env",
                "launch.env_not_secret"),
         # the launch environment's values are scrubbed from what is logged: set with --set, no DVC param
         hide=("launch.env", "launch.secret_env", "launch.env_not_secret"),
         untracked=("launch.env", "launch.secret_env", "launch.env_not_secret"),
         stage=Stage(
             deps=("${evaluate.model}", "${register.eval}", "${evaluate.out}/samples", "${register.mfu}",
                   "${register.train}/report.json", "${register.train}/metrics.jsonl", "${register.ingest}"),
             outs=(Out("${register.out}", cache=False,
                       note="MLflow's version numbers: a record of this registration"),),
             plots=(("${register.out}/loss_curve.png", {}),),
             note="also writes the MLflow store (work/mlflow.db, work/mlruns): kept across runs, not an "
                  "output",
             notes=(("${evaluate.model}", "register.model: null = the export evaluate chose"),
                    ("tracking.uri",
                     "where the model is registered: changing it registers again, never retrains"),
                    ("${register.out}/loss_curve.png",
                     "training loss per step, fixed-seed val loss and learning rate")))),
)

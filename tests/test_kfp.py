"""The Kubeflow pipeline: the committed YAML is current, its cluster settings, and a whole run under
kfp.local (SubprocessRunner in this venv) on a few rows per speaker of the sample, training in the
train task instead of a Volcano job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from small_sample import write_small_sample

from components import steps
from components.shared import step_folder
from pipelines import common
from pipelines import finetune as pipeline
from voxpipe.lineage import dvc_md5

# kfp.local runs the components in this venv: the images and the accelerator requests are for the cluster
pytestmark = [
    pytest.mark.filterwarnings("ignore:You may be attemping to run a task:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:.*have no effect in the current local runner:UserWarning"),
]
ROOT = Path(__file__).resolve().parents[1]
COMPILED = ROOT / "pipelines" / "finetune.yaml"
SMALL = {
    "train": {"max_steps": 3, "warmup_steps": 1, "val_every": 0, "checkpoint_every": 0, "device": "cpu"},
    "evaluate": {"seeds": [0], "texts_per_speaker": 1, "max_len": 8, "inference_timesteps": 2, "asr": False,
                 "device": "cpu"},
}


def test_committed_yaml_is_the_compiled_pipeline(tmp_path):
    # `make compile`'s command, in a process of its own (in this one, with torch loaded, KFP's graph build
    # takes seconds longer)
    subprocess.run([sys.executable, "-m", "pipelines.finetune", str(tmp_path / "finetune.yaml")], cwd=ROOT,
                   check=True)
    assert (tmp_path / "finetune.yaml").read_text() == COMPILED.read_text(), (
        "pipelines/finetune.yaml is stale: run `make generate` and commit it"
    )


def test_a_retried_task_finds_the_folder_of_the_attempt_before():
    """KFP >= 2.5 salts each driver run's output URI with a uuid; the workspace folder (checkpoints,
    reusable shards) must not change with it, but must with the run, the task and a ParallelFor item."""
    uri = "minio://mlpipeline/v2/artifacts/finetune/{run}/train/{salt}/model"
    first = uri.format(run="7f3a", salt="0b7e0e5e-3c55-4a9e-9d43-5a6f61a2c3b1")
    retry = uri.format(run="7f3a", salt="5d2c9a10-8e1b-4f7a-a0c2-39d4e5f6a7b8")
    folder = step_folder("/ws", "train", first)
    assert step_folder("/ws", "train", retry) == folder
    assert step_folder("/ws", "train", first.replace("7f3a", "8e4b")) != folder
    assert step_folder("/ws", "train", first.replace("/train/", "/encode/")) != folder
    shards = {step_folder("/ws", "ingest-shard", first, part=str(i)) for i in range(2)}
    assert len(shards) == 2


def test_compiled_pipeline_places_tasks_on_the_cluster():
    spec, platform = yaml.safe_load_all(COMPILED.read_text())
    inputs = spec["root"]["inputDefinitions"]["parameters"]
    assert "defaultValue" not in inputs["data_version"], "the data version must be given"
    assert inputs["accelerator"]["defaultValue"] == "huawei.com/Ascend910"
    assert inputs["launch_backend"]["defaultValue"] == "volcano"  # the choice is compiled in (launch.backend)
    assert inputs["train"]["defaultValue"] == common.DICT_DEFAULTS["train"]  # params.yaml's, unwired keys
    executors = spec["deploymentSpec"]["executors"]
    assert len(executors) == 11  # ingest is three: plan, shard (fanned out), merge
    for name, executor in executors.items():
        container = executor["container"]
        assert "pip install" not in " ".join(container["command"]), name  # nothing installed at run time
        accelerated = name == "exec-evaluate"  # encode and train request theirs in their launched jobs
        image = "accelerator_image" if accelerated else "cpu_image"
        assert container["image"] == f"{{{{$.inputs.parameters['pipelinechannel--{image}']}}}}", name
        if accelerated:
            accelerator = container["resources"]["accelerator"]
            assert accelerator["resourceType"] == "{{$.inputs.parameters['pipelinechannel--accelerator']}}"
            assert accelerator["resourceCount"] == "1"
    kubernetes = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert sorted(kubernetes) == sorted(executors)
    for name, config in kubernetes.items():
        assert config["pvcMount"][0]["mountPath"] == common.WORKSPACE
        pvc = config["pvcMount"][0]["pvcNameParameter"]["componentInputParameter"]
        in_loop = name == "exec-ingest-shard"  # inside the ParallelFor: the loop's copy of the parameter
        assert pvc == ("pipelinechannel--pvc_name" if in_loop else "pvc_name"), name
        placed = "nodeSelector" in config and "tolerations" in config
        assert placed == (name == "exec-evaluate"), name


def test_ingest_refuses_a_data_version_that_is_not_the_data(local_runner, capfd):
    workspace = local_runner / "workspace"
    write_small_sample(workspace / "datasets" / "mine", per_speaker=2)
    with pytest.raises(RuntimeError, match="ingest"):
        steps.ingest_plan(workspace=str(workspace), data_version="0123.dir",
                          params={"input": ["datasets/mine"]})
    assert f"has DVC md5 '{dvc_md5(workspace / 'datasets' / 'mine')}'" in capfd.readouterr().out


def test_init_model_hands_on_a_given_checkpoint(local_runner, capfd):
    workspace = local_runner / "workspace"
    (workspace / "models" / "voxcpm2").mkdir(parents=True)
    (workspace / "models" / "voxcpm2" / "config.json").write_text("{}")
    task = steps.init_model(workspace=str(workspace), params={}, base_model="models/voxcpm2")
    assert task.output.metadata["path"] == str(workspace / "models" / "voxcpm2")
    assert not (workspace / "voxpipe").exists()  # nothing initialised
    with pytest.raises(RuntimeError, match="init-model"):
        steps.init_model(workspace=str(workspace), params={}, base_model="models/missing")
    assert "no config.json" in capfd.readouterr().out


def small_run(root: Path, experiment: str) -> dict:
    """The arguments of a kfp.local run (finetune's, which the sweep pipeline shares) on a few rows per
    speaker of the sample under root/workspace, training in the task, tracked in root/mlflow.db."""
    workspace = root / "workspace"
    data = write_small_sample(workspace / "datasets" / "sample", per_speaker=6)
    return {
        "data_version": dvc_md5(data),
        "workspace": str(workspace),
        "launch_backend": "in-task",
        "ingest": {**common.DICT_DEFAULTS["ingest"], "input": ["datasets/sample"], "workers": 1},
        "encode": {**common.DICT_DEFAULTS["encode"], "device": "cpu"},
        "train": {**common.DICT_DEFAULTS["train"], **SMALL["train"]},
        "evaluate": {**common.DICT_DEFAULTS["evaluate"], **SMALL["evaluate"]},
        "tracking": {**common.DICT_DEFAULTS["tracking"], "experiment": experiment},
        "mlflow_tracking_uri": f"sqlite:///{root / 'mlflow.db'}",
    }


def test_pipeline_runs_under_kfp_local_and_registers_the_model(local_runner):
    args = small_run(local_runner, "kfp-local")
    workspace, tracking = Path(args["workspace"]), args["mlflow_tracking_uri"]
    run = pipeline.finetune_pipeline()(**args)
    registered = run.output.metadata
    assert registered["name"] == "voxpipe-sample"  # the voice's own model, named after ingest.input
    assert {"candidate"} <= set(registered["aliases"])
    client = MlflowClient(tracking)
    version = client.get_model_version_by_alias(registered["name"], "candidate")
    assert int(version.version) == int(registered["version"])
    assert client.get_run(version.run_id).data.tags["voxpipe.kfp_run_id"]  # KFP's run id reached the run
    # bulk data on the workspace, only reports in KFP's artifact store
    folders = {p.name.rsplit("-", 1)[0] for p in (workspace / "voxpipe").iterdir() if p.is_dir()}  # not locks
    assert folders == {"ingest-plan", "ingest-shard", "ingest", "manifest", "validate", "init-model",
                       "encode", "train", "evaluate", "mfu", "register"}
    assert not list((local_runner / "kfp").rglob("*.safetensors"))
    assert list((workspace / "voxpipe").rglob("*.safetensors"))
    # what the KFP UI shows: the eval summary (verdict table), the eval page (samples embedded), mfu.md
    ui = {p.name: p for p in (local_runner / "kfp").rglob("*") if p.name in ("summary", "page", "report_md")}
    assert "| fixed-seed val loss |" in ui["summary"].read_text()
    assert "<audio controls" in ui["page"].read_text() and "data:audio/wav;base64," in ui["page"].read_text()
    assert ui["report_md"].read_text().startswith("#")

"""manifests/serving/: the two InferenceService renderings (voxpipe serve; vLLM-Omni with the adapter) pass
KServe's own CRD schema (tests/data/kserve-crds, SOURCE.md) and say what serving needs; their pods'
restricted security is checked with every other pod in tests/test_manifests.py."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import crds
import jsonschema
import pytest
import yaml

from voxpipe.launch.pod import MLFLOW_CLIENT_LABEL
from voxpipe.secrets import is_secret_name
from voxpipe.steps.launch import LaunchParams
from voxpipe.steps.model import ModelParams
from voxpipe.steps.serve import ServeParams
from voxpipe.steps.train import LoraParams

ROOT = Path(__file__).resolve().parents[1]
SERVING = ROOT / "manifests" / "serving"
CRD = crds.DATA / "kserve-crds" / "serving.kserve.io_inferenceservices.yaml"


@cache
def validator():
    return crds.validator(crds.crd_schema(CRD, "InferenceService", "v1beta1"))


def rendering(name: str) -> dict:
    (doc,) = [d for d in yaml.safe_load_all((SERVING / name).read_text()) if d]
    return doc


def container(doc: dict, name: str = "kserve-container") -> dict:
    predictor = doc["spec"]["predictor"]
    (found,) = [c for c in predictor.get("initContainers", []) + predictor["containers"] if c["name"] == name]
    return found


def env(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


def registered_name() -> str:
    """The model name the registry-init Job creates (the pipeline's register.model_name in the cluster)."""
    job = yaml.safe_load((ROOT / "manifests" / "namespaced" / "registry-init-job.yaml").read_text())
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    return args[args.index("--model-name") + 1]


@pytest.mark.parametrize("name", ["voxpipe-serve.yaml", "vllm-omni.yaml"])
def test_each_rendering_passes_kserves_crd(name):
    doc = rendering(name)
    assert doc["apiVersion"] == "serving.kserve.io/v1beta1" and doc["kind"] == "InferenceService"
    validator().validate(doc)
    predictor = doc["spec"]["predictor"]
    assert MLFLOW_CLIENT_LABEL.items() <= predictor["labels"].items()  # through the mlflow NetworkPolicy
    main = container(doc)
    assert main["resources"]["limits"]["nvidia.com/gpu"] == 1 and main["ports"][0]["containerPort"] == 8080
    for c in predictor.get("initContainers", []) + predictor["containers"]:  # secrets by reference only
        for e in c.get("env", []):
            assert "valueFrom" in e or not is_secret_name(e["name"]), f"{name}: {e['name']} as a literal"


def test_the_crd_check_would_catch_a_broken_rendering():
    doc = rendering("voxpipe-serve.yaml")
    typo = copy.deepcopy(doc)
    probed = typo["spec"]["predictor"]["containers"][0]
    probed["readinesProbe"] = probed.pop("readinessProbe")
    with pytest.raises(jsonschema.ValidationError, match="readinesProbe"):
        validator().validate(typo)
    wrong = copy.deepcopy(doc)
    wrong["spec"]["predictor"]["minReplicas"] = "one"
    with pytest.raises(jsonschema.ValidationError):
        validator().validate(wrong)


def test_voxpipe_serve_pulls_the_registered_champion_with_its_key_and_probes():
    doc = rendering("voxpipe-serve.yaml")
    c = container(doc)
    assert c["command"] == ["voxpipe", "serve"]
    model = f"models:/{registered_name()}@champion"
    assert c["args"][:6] == ["--model", model, "--host", "0.0.0.0", "--port", "8080"]
    variables = env(c)
    assert variables["VOXPIPE_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "voxpipe-serve",
                                                                         "key": "api-key"}
    assert variables["MLFLOW_TRACKING_URI"]["value"] == "http://mlflow:5000"
    assert "secretKeyRef" in variables["MLFLOW_TRACKING_PASSWORD"]["valueFrom"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": 8080}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": 8080}


def test_the_concurrency_target_is_the_batch_size_the_server_runs():
    """Issue 46: the autoscaler's concurrency target is the server's batch size (serve.concurrency), so a
    replica counts as busy when its batch is full, not at its first request; the waiting room is pinned
    beside it. Both within the schema's bounds."""
    doc = rendering("voxpipe-serve.yaml")
    args = container(doc)["args"]
    flags = dict(zip(args[::2], args[1::2], strict=True))
    batch, room = int(flags["--concurrency"]), int(flags["--queue"])
    assert doc["metadata"]["annotations"]["autoscaling.knative.dev/target"] == str(batch)
    ServeParams(concurrency=batch, queue=room)  # the server would start with them
    assert batch > 1, "a batch of one serves one request at a time"


def test_vllm_omni_serves_the_base_with_the_adapter_at_startup():
    doc = rendering("vllm-omni.yaml")
    c = container(doc)
    script = c["args"][0]
    assert "vllm serve /workspace/work/base_model --omni --deploy-config /tmp/voxcpm2-lora.yaml" in script
    assert f"{LaunchParams().mount_path}/{ModelParams().base}" == "/workspace/work/base_model"
    assert '["startup_lora_path"] = "/models/lora"' in script
    assert env(c)["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "voxpipe-serve", "key": "api-key"}
    fetch = container(doc, "fetch-adapter")
    assert fetch["args"] == [f"models:/{registered_name()}@champion", "/models"]
    volumes = {v["name"]: v for v in doc["spec"]["predictor"]["volumes"]}
    assert volumes["workspace"]["persistentVolumeClaim"]["claimName"] == LaunchParams().pvc


@pytest.mark.slow  # logs a model version, then a fresh interpreter imports mlflow and downloads it
def test_the_fetch_adapter_command_as_written_puts_lora_where_vllm_omni_reads_it(tmp_path):
    """The init container's own command, run against a registry holding a LoRA run's version: /models/lora
    is the adapter, byte for byte."""
    from voxpipe.track.registry import log_model
    from voxpipe.track.tracking import session
    from voxpipe.train.init_model import init_model
    from voxpipe.train.lora import lora_state_dict, save_lora

    export = tmp_path / "step-40"  # any export's name: the path comes from the version's MLmodel
    init_model(ModelParams(out=str(export), dtype="float32"))
    from voxpipe.model.io import from_pretrained
    from voxpipe.train.lora import apply_lora

    model = from_pretrained(export)
    lora = LoraParams(enabled=True, r=2)
    apply_lora(model, lora)
    save_lora(lora_state_dict(model), lora, export / "lora")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    name = registered_name()
    with session(uri) as client:
        run_id = client.create_run(client.create_experiment(
            "voices", artifact_location=(tmp_path / "mlruns").as_uri())).info.run_id
        model_uri, _ = log_model(run_id, SimpleNamespace(export=export, export_md5="0" * 32, data=None))
        client.create_registered_model(name)
        version = client.create_model_version(name, model_uri, run_id=run_id).version
        client.set_registered_model_alias(name, "champion", version)
    fetch = container(rendering("vllm-omni.yaml"), "fetch-adapter")
    models = tmp_path / "models"
    cmd = [sys.executable if fetch["command"][0] == "python" else fetch["command"][0], *fetch["command"][1:]]
    done = subprocess.run([*cmd, fetch["args"][0], str(models)], capture_output=True, text=True,
                          env={**os.environ, "MLFLOW_TRACKING_URI": uri}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    for f in ("lora_config.json", "lora_weights.safetensors"):
        assert (models / "lora" / f).read_bytes() == (export / "lora" / f).read_bytes()


def test_the_vllm_omni_start_script_writes_the_deploy_config_and_execs_vllm_as_written(tmp_path):
    """The container's script run here with a stand-in vllm_omni package (its deploy YAML) and a stand-in
    `vllm` that records its argv: vLLM-Omni itself needs a CUDA GPU and Python 3.12 (docs/serving.md)."""
    package = tmp_path / "site" / "vllm_omni"
    (package / "deploy").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    bundled = {"stages": [{"stage_id": 0, "max_num_seqs": 8, "engine_extras": {
        "hf_overrides": {"voxcpm2_runtime_config": {"enable_unified_decode_graph": True}}}}]}
    (package / "deploy" / "voxcpm2.yaml").write_text(yaml.safe_dump(bundled))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    argv = tmp_path / "argv.json"
    (bin_dir / "vllm").write_text(f"#!{sys.executable}\nimport json, sys\n"
                                  f"json.dump(sys.argv[1:], open({str(argv)!r}, 'w'))\n")
    (bin_dir / "vllm").chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable)
    c = container(rendering("vllm-omni.yaml"))
    deploy = tmp_path / "voxcpm2-lora.yaml"
    script = c["args"][0].replace("/tmp/voxcpm2-lora.yaml", str(deploy))
    done = subprocess.run([*c["command"], script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                               "PYTHONPATH": str(tmp_path / "site")})
    assert done.returncode == 0, done.stderr
    written = yaml.safe_load(deploy.read_text())
    runtime = written["stages"][0]["engine_extras"]["hf_overrides"]["voxcpm2_runtime_config"]
    assert runtime == {"enable_unified_decode_graph": True, "startup_lora_path": "/models/lora"}
    assert written["stages"][0]["max_num_seqs"] == 8  # the rest of vLLM-Omni's own config kept
    args = json.loads(argv.read_text())
    assert args[:5] == ["serve", "/workspace/work/base_model", "--omni", "--deploy-config", str(deploy)]
    assert args[args.index("--port") + 1] == "8080" and args[args.index("--host") + 1] == "0.0.0.0"

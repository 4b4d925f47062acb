"""Issue 30 part 4: a LoRA run's registered version carries `lora/` in upstream's format, and serving
base + adapter unmerged says the same thing as the merged weights, with the identity that answered."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from mlflow import MlflowClient

from voxpipe.errors import StepError
from voxpipe.model.io import from_pretrained, save_pretrained
from voxpipe.serve.adapter import adapter_params, load_served, registered_checkpoint
from voxpipe.steps.model import ModelParams
from voxpipe.steps.train import LoraParams
from voxpipe.track.registry import log_model
from voxpipe.track.tracking import session
from voxpipe.train.export import LORA_SUBDIR
from voxpipe.train.init_model import init_model
from voxpipe.train.lora import (
    LORA_CONFIG,
    LORA_WEIGHTS,
    LoraLinear,
    apply_lora,
    lora_state_dict,
    merge_lora,
    save_lora,
)

LORA = LoraParams(enabled=True, r=4, alpha=8, target_proj=True)
SPEAK = {"max_len": 6, "inference_timesteps": 2, "seed": 7}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny base and a LoRA run's export from it, as train/export.py lays it out: the merged checkpoint
    with the adapter alone in lora/ (adapters drawn at random: a trained adapter, not the zero start)."""
    root = tmp_path_factory.mktemp("lora-run")
    base = root / "base"
    init_model(ModelParams(out=str(base), dtype="float32"))
    model = from_pretrained(base)
    apply_lora(model, LORA)
    torch.manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoraLinear):
                module.lora_B.normal_(0, 0.05)
    export = root / "export"
    save_lora(lora_state_dict(model), LORA, export / LORA_SUBDIR, base_model=str(base))
    merged = copy.deepcopy(model)
    merged.attach(model.audio_vae, model.tokenizer)
    merge_lora(merged)
    save_pretrained(merged, model.audio_vae, model.tokenizer, export, dtype=torch.float32)
    return base, export


def speak(model) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(["a short line"], **SPEAK).audio[0]


def test_base_plus_adapter_unmerged_says_what_the_merged_weights_say(run):
    base, export = run
    unmerged = load_served(export, base=base)
    merged = load_served(export)
    assert unmerged.adapter == "unmerged" and merged.adapter == "merged"
    assert any(isinstance(m, LoraLinear) for m in unmerged.model.modules())  # really not folded
    assert not any(isinstance(m, LoraLinear) for m in merged.model.modules())
    a, b = speak(unmerged.model), speak(merged.model)
    assert a.numel() > 0 and a.shape == b.shape
    torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
    plain = speak(from_pretrained(base).eval())  # the adapter counts: the base alone says something else
    assert plain.shape != a.shape or not torch.allclose(plain, a, atol=1e-3)


def test_the_identity_names_the_version_and_the_adapters_bytes(run):
    base, export = run
    want = hashlib.sha256((export / LORA_SUBDIR / LORA_WEIGHTS).read_bytes()).hexdigest()
    served = load_served(export, base=base, version="models:/voice/3")
    assert served.identity() == {"X-Voxpipe-Model-Version": "models:/voice/3",
                                 "X-Voxpipe-Adapter": "unmerged", "X-Voxpipe-Adapter-Sha256": want}
    assert load_served(export).identity()["X-Voxpipe-Model-Version"] == str(export)
    assert load_served(base).identity()["X-Voxpipe-Adapter-Sha256"] == "none"


def test_the_config_round_trips_to_the_trained_params(run):
    _, export = run
    assert adapter_params(export / LORA_SUBDIR) == LORA


def test_a_wrong_base_a_half_adapter_or_a_base_without_adapter_is_one_paragraph(run, tmp_path):
    base, export = run
    other = tmp_path / "other"
    init_model(ModelParams(out=str(other), dtype="float32", preset="tiny", seed=1))
    config = json.loads((other / "config.json").read_text())
    config["max_length"] = config.get("max_length", 4096) + 1
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(StepError, match=r"config.json differs .* in max_length; the adapter needs the base"):
        load_served(export, base=other)
    with pytest.raises(StepError, match=r"^serve --base \S+: not a VoxCPM2 checkpoint \(no "
                       r"config.json\); name the base folder the run was trained from"):
        load_served(export, base=tmp_path / "nothing")
    with pytest.raises(StepError, match=r"has no lora/ adapter to apply to it .* leave --base out"):
        load_served(base, base=base)
    half = tmp_path / "half"
    shutil.copytree(export, half)
    (half / LORA_SUBDIR / LORA_WEIGHTS).unlink()
    with pytest.raises(StepError, match=rf"without {LORA_WEIGHTS}; .*Re-export the run") as err:
        load_served(half, base=base)
    assert "\n" not in str(err.value)
    (half / LORA_SUBDIR / LORA_WEIGHTS).write_bytes((export / LORA_SUBDIR / LORA_WEIGHTS).read_bytes())
    (half / LORA_SUBDIR / LORA_CONFIG).write_text('{"lora_config": {"r": 4}}')
    with pytest.raises(StepError, match=r"not upstream VoxCPM's LoRA config \(missing key 'alpha'\)"):
        load_served(half, base=base)


def test_the_registered_version_carries_the_adapter_and_serves_it(run, tmp_path, monkeypatch):
    """What `register` logs (registry.log_model: the export folder as the "checkpoint" artifact), registered
    as a version in a sqlite store, downloaded again: lora/ byte for byte, and it serves unmerged."""
    base, export = run
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with session(uri) as client:
        assert isinstance(client, MlflowClient)
        experiment = client.create_experiment("voices", artifact_location=(tmp_path / "mlruns").as_uri())
        run_id = client.create_run(experiment).info.run_id
        model_uri, _ = log_model(run_id, SimpleNamespace(export=export, export_md5="0" * 32, data=None))
        client.create_registered_model("voice")
        version = client.create_model_version("voice", model_uri, run_id=run_id).version
        folder = registered_checkpoint(f"models:/voice/{version}", tmp_path / "served")
    for name in (LORA_CONFIG, LORA_WEIGHTS):
        assert (folder / LORA_SUBDIR / name).read_bytes() == (export / LORA_SUBDIR / name).read_bytes()
    served = load_served(folder, base=base, version=f"models:/voice/{version}")
    assert served.adapter == "unmerged" and served.version == "models:/voice/1"
    torch.testing.assert_close(speak(served.model), speak(load_served(export).model), rtol=0, atol=1e-4)


def test_voxpipe_serve_loads_the_base_plus_adapter_and_names_its_hash(run):
    """serve.base: `voxpipe serve` answers with the unmerged base + adapter, and its headers and metric
    labels carry the adapter's sha256; without it the merged folder still names the adapter it folded in."""
    from voxpipe.params import Params
    from voxpipe.serve.server import load_served as load_for_serve

    base, export = run
    want = hashlib.sha256((export / LORA_SUBDIR / LORA_WEIGHTS).read_bytes()).hexdigest()
    unmerged = load_for_serve(Params.model_validate({"serve": {"base": str(base), "device": "cpu"}}),
                              str(export))
    assert unmerged.adapter == want
    assert any(isinstance(m, LoraLinear) for m in unmerged.model.modules())
    merged = load_for_serve(Params.model_validate({"serve": {"device": "cpu"}}), str(export))
    assert merged.adapter == want and not any(isinstance(m, LoraLinear) for m in merged.model.modules())
    plain = load_for_serve(Params.model_validate({"serve": {"device": "cpu"}}), str(base))
    assert plain.adapter_label == "none"

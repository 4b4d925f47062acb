"""`train.ema_decay`: EMA weights beside the live ones (voxpipe/train/ema.py). The average against its closed
form on a tiny module, then the real trainer on the encoded sample: EMA exports beside the live ones that
load and verify, a resume that restores the average (bit for bit against the uninterrupted run), a checkpoint
from before EMA was on, and 2 gloo ranks under torchrun holding each its own EMA shard in the checkpoint."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.distributed.checkpoint import FileSystemReader

from voxpipe.integrity import signing_key
from voxpipe.model.config import VoxCPM2Config
from voxpipe.model.io import from_pretrained
from voxpipe.params import Params
from voxpipe.steps.train import LoraParams, TrainParams
from voxpipe.train import plan as P
from voxpipe.train.ema import EMA
from voxpipe.train.identity import verified_identity
from voxpipe.train.loop import train

DECAY = 0.8
SETTINGS = {"device": "cpu", "lr": 2e-3, "warmup_steps": 2, "max_tokens": 512, "val_every": 0,
            "export_dtype": "float32", "export_every": 3, "keep_exports": 2, "checkpoint_every": 2}
WEIGHT = "base_lm.layers.0.self_attn.q_proj.weight"


def test_ema_after_n_steps_is_the_closed_form():
    """Live weights w0, then held at w for n steps: ema_n = w + d^n (w0 - w). The swap gives the EMA
    and hands the live weights back exactly."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    frozen = nn.Parameter(torch.ones(2), requires_grad=False)
    model.register_parameter("frozen", frozen)
    w0 = {k: v.detach().clone() for k, v in model.named_parameters()}
    ema = EMA(model, DECAY)
    assert set(ema.state_dict()) == {"weight", "bias"}, "only the trainable parameters are averaged"
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.5)
    live = {k: v.detach().clone() for k, v in model.named_parameters()}
    n = 7
    for _ in range(n):
        ema.update()
    for name in ("weight", "bias"):
        expected = live[name] + DECAY**n * (w0[name] - live[name])
        torch.testing.assert_close(ema.state_dict()[name], expected, rtol=1e-6, atol=1e-6)
    averaged = ema.state_dict()["weight"].clone()
    with ema.swapped_in():
        assert torch.equal(model.weight.detach(), averaged)
    assert torch.equal(model.weight.detach(), live["weight"])
    assert torch.equal(model.bias.detach(), live["bias"])
    assert torch.equal(ema.state_dict()["weight"], averaged), "the EMA itself survives the swap"


def test_ema_needs_exports():
    with pytest.raises(ValueError, match="train.ema_decay needs train.export_every"):
        TrainParams(ema_decay=0.999, export_every=0)


def _train(sample, out: Path, steps: int, **changes) -> dict:
    params = {"data": str(sample.encoded), "out": str(out), "max_steps": steps, **SETTINGS, **changes}
    train(Params(model={"base": str(sample.base_model)}, train=TrainParams(**params)))
    return json.loads((out / "report.json").read_text())


@pytest.fixture(scope="module")
def ema_run(encoded_sample, tmp_path_factory):
    """6 steps with EMA, uninterrupted: the reference."""
    out = tmp_path_factory.mktemp("ema") / "run"
    return out, _train(encoded_sample, out, 6, ema_decay=DECAY)


@pytest.mark.slow  # a training run (the module's ema_run)
def test_ema_exports_sit_beside_the_live_ones_load_and_verify(ema_run, encoded_sample):
    out, report = ema_run
    exports = out / "exports"
    assert sorted(p.name for p in exports.iterdir()) == ["step-3", "step-3-ema", "step-6", "step-6-ema"]
    ema_export, live_export = exports / "step-6-ema", exports / "step-6"
    from_pretrained(ema_export)  # strict load of the upstream layout
    ema_w = load_file(str(ema_export / "model.safetensors"))
    live_w = load_file(str(live_export / "model.safetensors"))
    base_w = load_file(str(encoded_sample.base_model / "model.safetensors"))
    assert sorted(ema_w) == sorted(live_w)
    assert not torch.equal(ema_w[WEIGHT], live_w[WEIGHT]) and not torch.equal(ema_w[WEIGHT], base_w[WEIGHT])
    key = signing_key(exports)
    ema_id, live_id = verified_identity(ema_export, key), verified_identity(live_export, key)
    assert ema_id["run"] == live_id["run"] and ema_id["step"] == 6
    assert ema_id["kind"] == "ema" and ema_id["ema_decay"] == DECAY and "kind" not in live_id
    # the checkpoint holds the EMA shards, and its bytes count them
    checkpoint = out / "checkpoints" / "step-6"
    assert json.loads((checkpoint / "trainer.json").read_text())["ema"] is True
    keys = FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata
    assert any(k.startswith("ema.") for k in keys)
    # what `voxpipe plan` says the EMA adds to a checkpoint is what the save measured
    config = VoxCPM2Config.from_file(encoded_sample.base_model / "config.json")
    planned = P.checkpoint_bytes_per_rank(P.Setup(config, 1, LoraParams(), False, "float32", 512, ema=True))
    saved = report["checkpoint_save"]["bytes_per_rank"]
    assert abs(saved - planned) <= 0.01 * saved


@pytest.mark.slow
def test_a_resume_restores_the_ema(ema_run, encoded_sample, tmp_path):
    """The reference run with its step-6 checkpoint and exports taken away resumes from step 4: its new
    step-6 EMA export is the uninterrupted run's, bit for bit (an average restarted from the live weights
    at step 4 would differ)."""
    reference, _ = ema_run
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    for folder in ("checkpoints/step-6", "exports/step-6", "exports/step-6-ema"):
        shutil.rmtree(out / folder)
    report = _train(encoded_sample, out, 6, ema_decay=DECAY)
    assert report["resumed_from"].endswith("step-4")
    for name in ("step-6", "step-6-ema"):
        mine = load_file(str(out / "exports" / name / "model.safetensors"))
        theirs = load_file(str(reference / "exports" / name / "model.safetensors"))
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs), name


@pytest.mark.slow
def test_a_checkpoint_from_before_ema_starts_it_from_the_live_weights(encoded_sample, tmp_path, caplog):
    out = tmp_path / "run"
    _train(encoded_sample, out, 3, checkpoint_every=3)
    assert not (out / "exports" / "step-3-ema").exists()
    with caplog.at_level("INFO", logger="voxpipe.train.loop"):
        report = _train(encoded_sample, out, 4, ema_decay=DECAY, export_every=1)
    assert report["resumed_from"].endswith("step-3")
    assert "holds no EMA weights" in caplog.text
    # one update after the resume: ema_4 = live_4 + d (live_3 - live_4), live_3 the checkpoint's weights
    live3 = load_file(str(out / "exports" / "step-3" / "model.safetensors"))[WEIGHT]
    live4 = load_file(str(out / "exports" / "step-4" / "model.safetensors"))[WEIGHT]
    ema4 = load_file(str(out / "exports" / "step-4-ema" / "model.safetensors"))[WEIGHT]
    torch.testing.assert_close(ema4, live4 + DECAY * (live3 - live4), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_two_gloo_ranks_each_hold_their_ema_shard(encoded_sample, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
           "voxpipe.cli", "train", "--data", str(encoded_sample.encoded), "--model-base",
           str(encoded_sample.base_model), "--out", str(out), "--device", "cpu", "--max-steps", "2",
           "--max-tokens", "512", "--lr", "2e-3", "--val-every", "0",
           "--set", "train.export_every=2", "--set", f"train.ema_decay={DECAY}",
           "--set", "train.export_dtype=float32"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metadata = FileSystemReader(str(out / "checkpoints" / "step-2")).read_metadata().state_dict_metadata
    ema_key, model_key = f"ema.{WEIGHT}", f"model.{WEIGHT}"
    assert ema_key in metadata, sorted(k for k in metadata if k.startswith("ema."))[:5]
    # sharded like the live weight: one chunk per rank, together the full shape
    assert len(metadata[ema_key].chunks) == len(metadata[model_key].chunks) == 2
    assert metadata[ema_key].size == metadata[model_key].size
    ema_w = load_file(str(out / "exports" / "step-2-ema" / "model.safetensors"))[WEIGHT]
    live_w = load_file(str(out / "exports" / "step-2" / "model.safetensors"))[WEIGHT]
    base_w = load_file(str(encoded_sample.base_model / "model.safetensors"))[WEIGHT]
    # gathered from both ranks' shards: neither the live weights nor the base
    assert not torch.equal(ema_w, live_w) and not torch.equal(ema_w, base_w)
    assert torch.isfinite(ema_w).all()


@pytest.mark.slow
def test_with_lora_only_the_adapters_are_averaged_and_exported(encoded_sample, tmp_path):
    out = tmp_path / "run"
    _train(encoded_sample, out, 2, ema_decay=DECAY, export_every=2, lora={"enabled": True, "r": 4},
           lr=1e-2)
    keys = FileSystemReader(str(out / "checkpoints" / "step-2")).read_metadata().state_dict_metadata
    ema_keys = [k for k in keys if k.startswith("ema.")]
    assert ema_keys and all("lora_" in k for k in ema_keys), ema_keys[:5]
    live = load_file(str(out / "exports" / "step-2" / "lora" / "lora_weights.safetensors"))
    ema = load_file(str(out / "exports" / "step-2-ema" / "lora" / "lora_weights.safetensors"))
    assert sorted(live) == sorted(ema)
    assert any(not torch.equal(live[k], ema[k]) for k in live)
    from_pretrained(out / "exports" / "step-2-ema")  # the merged EMA checkpoint loads


def test_an_ema_export_is_pruned_with_its_live_sibling(tmp_path):
    from voxpipe.train.device import Runtime
    from voxpipe.train.exports import export_step

    rt = Runtime(torch.device("cpu"), 0, 1, None)  # rank 0 of one: export_step needs no collective

    def write(folder: Path) -> None:
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")

    for step in (1, 2, 3):
        export_step(write, tmp_path, step, 2, rt, write)
    assert sorted(p.name for p in (tmp_path / "exports").iterdir()) == ["step-2", "step-2-ema", "step-3",
                                                                       "step-3-ema"]


@pytest.mark.slow
def test_a_resume_is_exact_when_an_export_shares_the_checkpoints_step(encoded_sample, tmp_path):
    """The export at step 3 comes after the checkpoint of step 3: building it must not draw from the
    training RNG the checkpoint saved, or the resumed steps 4-6 differ from the uninterrupted ones."""
    runs = {}
    for name in ("whole", "resumed"):
        out = tmp_path / name
        if name == "resumed":
            shutil.copytree(tmp_path / "whole", out)
            for folder in ("checkpoints/step-6", "exports/step-6", "exports/step-6-ema"):
                shutil.rmtree(out / folder)
        report = _train(encoded_sample, out, 6, ema_decay=DECAY, checkpoint_every=3)
        runs[name] = load_file(str(out / "exports" / "step-6-ema" / "model.safetensors"))
    assert report["resumed_from"].endswith("step-3")
    assert all(torch.equal(runs["whole"][k], runs["resumed"][k]) for k in runs["whole"])

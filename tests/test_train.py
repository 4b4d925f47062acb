"""`voxpipe train` on the encoded sample with the tiny model: FSDP2 over 2 gloo ranks, resume, SIGTERM,
bf16 + LoRA, the NaN guard, and the schedule. Real data (the shipped sample through ingest ->
manifest -> encode), real processes (torchrun), real signals; nothing is mocked.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from upstream import import_upstream

from voxpipe.errors import StepError
from voxpipe.integrity import MANIFEST, user_key_path
from voxpipe.model.config import VoxCPM2Config
from voxpipe.model.io import from_pretrained
from voxpipe.params import Params, load_params
from voxpipe.steps.model import ModelParams
from voxpipe.steps.train import LoraParams, TrainParams
from voxpipe.train import plan as P
from voxpipe.train.checkpoint import latest_checkpoint
from voxpipe.train.init_model import init_model
from voxpipe.train.loop import train
from voxpipe.train.moves import MOVE_FLOOR, move_check
from voxpipe.train.schedule import WarmupCosine

STEPS = 30
CHECKPOINT_EVERY = 10
# lr 2e-3 on the tiny model: the fixed-seed val loss falls by more than half within 30 steps
SETTINGS = {"lr": 2e-3, "warmup_steps": 4, "max_tokens": 512, "val_every": 10, "export_dtype": "float32"}
COMPARED = ("loss/diff", "loss/stop", "grad_norm", "lr", "shapes", "skipped")


def cli_args(sample, out: Path, steps: int = STEPS) -> list[str]:
    args = ["train", "--data", str(sample.encoded), "--model-base", str(sample.base_model), "--out", str(out),
            "--device", "cpu", "--max-steps", str(steps), "--checkpoint-every", str(CHECKPOINT_EVERY),
            "--lr", str(SETTINGS["lr"]), "--max-tokens", str(SETTINGS["max_tokens"]),
            "--val-every", str(SETTINGS["val_every"])]
    return args + ["--set", f"train.warmup_steps={SETTINGS['warmup_steps']}",
                   "--set", f"train.export_dtype={SETTINGS['export_dtype']}"]


def torchrun(sample, out: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "-m", "voxpipe.cli", *cli_args(sample, out)]


def run_in_process(sample, out: Path, **changes) -> dict:
    base = changes.pop("model", str(sample.base_model))
    params = {"data": str(sample.encoded), "out": str(out), "device": "cpu",
              "max_steps": STEPS, "checkpoint_every": CHECKPOINT_EVERY, **SETTINGS, **changes}
    train(Params(model={"base": base}, train=TrainParams(**params)))
    return json.loads((out / "report.json").read_text())


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def wait_for_checkpoint(proc: subprocess.Popen, folder: Path) -> None:
    while not (folder / MANIFEST).is_file():
        assert proc.poll() is None, f"the run ended before {folder} was written: {proc.communicate()}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def two_rank_run(encoded_sample, tmp_path_factory):
    """The reference: 2 ranks over gloo, uninterrupted, STEPS steps."""
    out = tmp_path_factory.mktemp("train2") / "run"
    proc = subprocess.run(torchrun(encoded_sample, out), capture_output=True, text=True, cwd=out.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stdout


def test_two_ranks_train_export_and_converge(two_rank_run, encoded_sample):
    out, stdout = two_rank_run
    report = json.loads((out / "report.json").read_text())
    assert report["world_size"] == 2 and report["steps"] == STEPS and report["skipped_steps"] == 0
    assert report["device_type"] == "cpu" and report["dtype"] == "float32"
    curve = [point["val/loss"] for point in report["val_curve"]]
    assert [p["step"] for p in report["val_curve"]] == [0, 10, 20, 30]
    assert curve[-1] < 0.6 * curve[0], f"fixed-seed val loss did not fall clearly: {curve}"
    rows = metrics(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(len(r["shapes"]) == 1 and r["tokens"] >= r["real_tokens"] > 0 for r in rows)
    assert all(0 <= r["data_wait_frac"] < 1 and r["flops"] > 0 for r in rows)
    assert "val/loss" in rows[9] and "val/loss" not in rows[8]
    assert "val/loss" in stdout.splitlines()[-1]
    # checkpoints: only the newest `keep_checkpoints` (2) complete ones remain; the signing key is elsewhere
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-20", "step-30"]
    assert user_key_path().stat().st_mode & 0o777 == 0o600
    # the last save as measured (issue 47): the plan's per-rank bytes and its seconds, for the next plan
    save = report["checkpoint_save"]
    config = VoxCPM2Config.from_file(encoded_sample.base_model / "config.json")
    setup = P.Setup(config, 2, LoraParams(), False, "float32", SETTINGS["max_tokens"])
    assert abs(save["bytes_per_rank"] - P.checkpoint_bytes_per_rank(setup)) <= 0.01 * save["bytes_per_rank"]
    gbps = save["bytes_per_rank"] / save["seconds"] / 1e9
    assert save["seconds"] > 0 and save["write_gbps"] == pytest.approx(gbps, rel=0.05)


def test_export_loads_strictly_in_ours_and_upstream(two_rank_run, encoded_sample):
    export = two_rank_run[0] / "export"
    ours = from_pretrained(export)
    files = load_file(str(export / "model.safetensors"))
    base = load_file(str(encoded_sample.base_model / "model.safetensors"))
    assert sorted(ours.state_dict()) == sorted(files) == sorted(base)
    assert not torch.equal(files["base_lm.layers.0.self_attn.q_proj.weight"],
                           base["base_lm.layers.0.self_attn.q_proj.weight"]), "export holds the base weights"
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (export / name).read_bytes() == (encoded_sample.base_model / name).read_bytes()

    import_upstream()
    from voxcpm.model.voxcpm2 import VoxCPM2Model

    upstream = VoxCPM2Model.from_local(str(export), training=True, device="cpu")
    files |= {f"audio_vae.{k}": v for k, v in load_file(str(export / "audiovae.safetensors")).items()}
    up_state = upstream.state_dict()
    assert sorted(up_state) == sorted(files), "upstream's keys differ from the exported ones"
    assert all(torch.equal(up_state[k], v) for k, v in files.items())


def test_resume_after_sigkill_matches_the_uninterrupted_run(two_rank_run, encoded_sample, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(torchrun(encoded_sample, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=tmp_path, start_new_session=True)
    wait_for_checkpoint(proc, out / "checkpoints" / f"step-{CHECKPOINT_EVERY}")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    resumed = subprocess.run(torchrun(encoded_sample, out), capture_output=True, text=True, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["resumed_from"] is not None and report["steps_run"] < STEPS
    reference = metrics(two_rank_run[0])
    again = metrics(out)
    assert [r["step"] for r in again] == list(range(1, STEPS + 1))
    for ref, got in zip(reference, again, strict=True):
        assert {k: got[k] for k in COMPARED} == {k: ref[k] for k in COMPARED}, f"step {ref['step']} differs"
    ref_val = json.loads((two_rank_run[0] / "report.json").read_text())["val_curve"]
    assert report["val_curve"] == ref_val


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_0_then_resumes(encoded_sample, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "voxpipe.cli", *cli_args(encoded_sample, out, steps=400)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env=env)
    wait_for_checkpoint(proc, out / "checkpoints" / f"step-{CHECKPOINT_EVERY}")
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-3000:]
    assert "SIGTERM" in stdout
    report = json.loads((out / "report.json").read_text())
    stopped_at = report["steps"]
    assert report["stopped_by_sigterm"] and CHECKPOINT_EVERY <= stopped_at < 400
    assert latest_checkpoint(out / "checkpoints") == out / "checkpoints" / f"step-{stopped_at}"
    assert not (out / "export").exists()
    assert [r["step"] for r in metrics(out)] == list(range(1, stopped_at + 1))

    more = cli_args(encoded_sample, out, steps=stopped_at + 2)  # a new max_steps: resumes, then exports
    resumed = subprocess.run([sys.executable, "-m", "voxpipe.cli", *more], capture_output=True, text=True,
                             cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["resumed_from"].endswith(f"step-{stopped_at}") and report["steps_run"] == 2
    assert (out / "export" / "model.safetensors").is_file()


@pytest.mark.slow
def test_bf16_lora_with_activation_checkpointing_trains_on_cpu(encoded_sample, tmp_path):
    lora = LoraParams(enabled=True, r=4, alpha=8)
    report = run_in_process(encoded_sample, tmp_path / "run", max_steps=3, dtype="bfloat16", grad_accum=2,
                            max_tokens=256, activation_checkpointing=True, lr=1e-2, lora=lora)
    assert report["dtype"] == "bfloat16" and report["skipped_steps"] == 0 and report["lora"]
    assert all(math.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in metrics(tmp_path / "run"))
    assert all(len(r["shapes"]) == 2 for r in metrics(tmp_path / "run"))

    export = tmp_path / "run" / "export"
    adapters = load_file(str(export / "lora" / "lora_weights.safetensors"))
    assert adapters and all(k.endswith((".lora_A", ".lora_B")) for k in adapters)
    trained = [k for k, v in adapters.items() if k.endswith(".lora_B") and v.abs().sum() > 0]
    assert trained, "adapters did not train"
    # merged export: targeted projections moved, everything else is bit-identical to the base
    merged = from_pretrained(export).state_dict()
    base = load_file(str(encoded_sample.base_model / "model.safetensors"))
    targeted = {k.removesuffix(".lora_A") + ".weight" for k in adapters if k.endswith(".lora_A")}
    assert all(not torch.equal(merged[k], base[k]) for k in targeted)
    assert all(torch.equal(merged[k], base[k]) for k in base if k not in targeted)

    import_upstream()
    from voxcpm.model.voxcpm2 import LoRAConfig, VoxCPM2Model

    config = json.loads((export / "lora" / "lora_config.json").read_text())["lora_config"]
    upstream = VoxCPM2Model.from_local(str(encoded_sample.base_model), training=True, device="cpu",
                                       lora_config=LoRAConfig(**config))
    loaded, skipped = upstream.load_lora_weights(str(export / "lora"), device="cpu")
    assert not skipped and len(loaded) == len(adapters)


def _poisoned_copy(sample, dst: Path, rows: str) -> Path:
    """The encoded folder with NaN written into the stored latents of the first (or every) train row."""
    shutil.copytree(sample.encoded, dst)
    entries = [json.loads(line) for line in (dst / "train.jsonl").read_text().splitlines()]
    targets = entries[:1] if rows == "first" else entries
    by_shard: dict[str, list[str]] = {}
    for entry in targets:
        by_shard.setdefault(entry["latents"]["shard"], []).append(entry["latents"]["key"])
    for shard, keys in by_shard.items():
        tensors = load_file(str(dst / shard))
        for key in keys:
            tensors[key][0, 0] = float("nan")
        save_file(tensors, str(dst / shard))
    # NaN data the encoder really produced, not a damaged file: the index records the new bytes
    from voxpipe.integrity import file_entry

    index = [json.loads(line) for line in (dst / "index.jsonl").read_text().splitlines()]
    for record in index:
        if record["shard"] in by_shard:
            entry = file_entry(dst / record["shard"])
            record.update(size=entry["size"], sha256=entry["sha256"])
    (dst / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in index))
    return dst


@pytest.mark.slow
def test_a_nan_batch_is_skipped_and_counted(encoded_sample, tmp_path):
    data = _poisoned_copy(encoded_sample, tmp_path / "data", "first")
    report = run_in_process(encoded_sample, tmp_path / "run", data=str(data), max_steps=16, val_every=0)
    rows = metrics(tmp_path / "run")
    skipped = [r["step"] for r in rows if r["skipped"]]
    assert skipped and report["skipped_steps"] == len(skipped) < 16
    assert all(r["loss"] is None for r in rows if r["skipped"])  # NaN is written as null
    assert all(math.isfinite(r["loss"]) for r in rows if not r["skipped"])
    assert math.isfinite(report["val_curve"][-1]["val/loss"]), "a skipped NaN step still reached the weights"


@pytest.mark.slow
def test_consecutive_nan_steps_stop_with_a_clear_message(encoded_sample, tmp_path):
    data = _poisoned_copy(encoded_sample, tmp_path / "data", "all")
    with pytest.raises(StepError, match=r"step 3: 3 steps in a row had a non-finite loss"):
        run_in_process(encoded_sample, tmp_path / "run", data=str(data), max_bad_steps=3, val_every=0)
    assert len(metrics(tmp_path / "run")) == 3


def test_schedule_warms_up_decays_to_min_and_never_climbs_back():
    s = WarmupCosine(peak_lr=1e-3, min_lr=1e-5, warmup_steps=10, total_steps=100)
    lrs = [s.lr(step) for step in range(1, 301)]
    assert lrs[:10] == pytest.approx([1e-3 * k / 10 for k in range(1, 11)])
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:], strict=False)), "lr rose after warmup"
    assert lrs[99] == pytest.approx(1e-5) and set(lrs[99:]) == {lrs[99]}


def test_incomplete_checkpoint_folders_are_ignored(tmp_path):
    for step, complete in ((3, True), (5, False)):
        folder = tmp_path / f"step-{step}"
        folder.mkdir()
        (folder / ".metadata").write_bytes(b"x")
        if complete:
            (folder / MANIFEST).write_text("{}")
    (tmp_path / ".tmp-step-7").mkdir()
    assert latest_checkpoint(tmp_path) == tmp_path / "step-3"


def test_nested_lora_keys_are_settable_from_the_command_line():
    p = load_params(None, ["train.lora.r=8"], {"train.lora.enabled": True, "train.max_steps": 7})
    assert p.train.lora.r == 8 and p.train.lora.enabled and p.train.max_steps == 7
    with pytest.raises(StepError, match=r"train\.lora\.bogus: unknown key"):
        load_params(None, ["train.lora.bogus=1"])


def test_data_encoded_by_another_vae_is_refused(encoded_sample, tmp_path):
    other = tmp_path / "other_base"
    init_model(ModelParams(preset="tiny", seed=5, out=str(other)))  # same shapes, different VAE weights
    with pytest.raises(StepError, match=r"was encoded with vae .* run `voxpipe encode --model-base"):
        run_in_process(encoded_sample, tmp_path / "run", model=str(other))


def test_the_move_check_compares_the_first_validation_with_the_bases():
    base = {"step": 0, "val/loss": 2.0, "val/diff": 1.2, "val/stop": 0.8}
    still = move_check(base, {**base, "step": 5, "val/loss": 2.0 + 1e-6}, 1e-5, lora=True)
    assert not still["moved"] and still["step"] == 5 and still["floor"] == MOVE_FLOOR
    assert "LoRA adapters" in still["warning"] and "lr at this step 1.00e-05" in still["warning"]
    assert "frozen part" in still["warning"] and "Training goes on" in still["warning"]
    full = move_check(base, {**base, "step": 5, "val/loss": 2.0 + 1e-6}, 1e-5, lora=False)
    assert "LoRA" not in full["warning"]
    moved = move_check(base, {**base, "step": 5, "val/stop": 0.7}, 1e-5, lora=False)
    assert moved["moved"] and moved["warning"] is None and moved["change"] == pytest.approx(0.125)


def test_a_base_that_cannot_move_is_named_after_a_few_steps_and_training_goes_on(encoded_sample, tmp_path,
                                                                                  caplog):
    """lr 1e-30 changes no weight: the first validation equals the base's, the run warns and finishes; the
    same run at the test lr moves."""
    stuck = run_in_process(encoded_sample, tmp_path / "stuck", max_steps=2, val_every=1, lr=1e-30)
    assert stuck["steps"] == 2 and stuck["moved"]["step"] == 1 and stuck["moved"]["moved"] is False
    assert stuck["moved"]["change"] <= MOVE_FLOOR and "the model is not learning" in caplog.text
    moving = run_in_process(encoded_sample, tmp_path / "moving", max_steps=2, val_every=1)
    assert moving["moved"]["moved"] and moving["moved"]["warning"] is None
    assert moving["moved"]["change"] > MOVE_FLOOR

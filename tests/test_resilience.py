"""Runs that survive faults (docs/resilience.md): checked and signed checkpoints, honest resume, one
writer per output folder, workers that die with their launcher, finite numbers only. Real training
of the tiny model, real torchrun, real signals; faults are made by damaging real files.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from voxpipe.errors import StepError
from voxpipe.integrity import KEY_ENV, KEY_FILE, MANIFEST, file_entry, user_key_path
from voxpipe.outlock import hold_output, lock_path
from voxpipe.params import Params, load_params
from voxpipe.steps.train import TrainParams
from voxpipe.train.loop import train

STEPS = 4
SETTINGS = {"device": "cpu", "max_tokens": 256, "val_every": 0, "val_batches": 1, "warmup_steps": 1,
            "lr": 1e-3, "checkpoint_every": 2, "export_dtype": "float32"}


def run(sample, out: Path, **changes):
    p = {"data": str(sample.encoded), "out": str(out), "max_steps": STEPS, **SETTINGS, **changes}
    return train(Params(model={"base": str(sample.base_model)}, train=TrainParams(**p)))


def report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


@pytest.fixture(scope="module")
def finished(encoded_sample, tmp_path_factory):
    """A finished STEPS-step run with checkpoints step-2 and step-4 (read-only: copy it)."""
    out = tmp_path_factory.mktemp("resilience") / "run"
    os.environ.pop(KEY_ENV, None)
    run(encoded_sample, out)
    return out


@pytest.fixture
def copy(finished, tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


# -- checked checkpoints --------------------------------------------------------------------------
def test_each_checkpoint_has_a_signed_manifest_and_a_private_key(finished):
    ckpts = finished / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir() if p.name.startswith("step-")) == ["step-2", "step-4"]
    manifest = json.loads((ckpts / "step-4" / MANIFEST).read_text())
    assert manifest["step"] == 4 and len(manifest["hmac"]) == 64
    assert {".metadata", "trainer.json", "rank-0.json"} <= set(manifest["files"])
    assert any(name.endswith(".distcp") for name in manifest["files"])
    assert not (ckpts / KEY_FILE).exists()  # the key is the user's, outside the checkpoints
    key = user_key_path()
    assert key.stat().st_mode & 0o777 == 0o600 and key.parent.stat().st_mode & 0o777 == 0o700
    assert not key.resolve().is_relative_to(finished.resolve())


def test_a_truncated_distcp_falls_back_to_the_previous_checkpoint(encoded_sample, copy, caplog):
    newest = copy / "checkpoints" / "step-4"
    shard = next(newest.glob("*.distcp"))
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size // 2)
    with caplog.at_level(logging.WARNING):
        result = run(encoded_sample, copy, max_steps=6)
    r = report(copy)
    assert r["resumed_from"].endswith("step-2") and r["steps_run"] == 4 and result.steps == 6
    kept = copy / "checkpoints" / "step-4.rejected-bad-size"
    assert (kept / shard.name).stat().st_size == size // 2, "the failing checkpoint was not kept as it was"
    assert "step-4" in caplog.text and "set aside" in caplog.text


def test_a_step_folder_without_manifest_is_set_aside(encoded_sample, copy):
    leftover = copy / "checkpoints" / "step-6"  # e.g. copied in by hand, or from another tool
    leftover.mkdir()
    (leftover / ".metadata").write_bytes(b"not ours")
    run(encoded_sample, copy, max_steps=5)
    assert report(copy)["resumed_from"].endswith("step-4")
    assert (copy / "checkpoints" / "step-6.rejected-no-manifest" / ".metadata").read_bytes() == b"not ours"


def _marker_pickle(marker: Path) -> bytes:
    """A pickle that, when loaded, writes `marker` (what an attacker on the volume would plant)."""

    class Plant:
        def __reduce__(self):
            return (Path.write_text, (marker, "pwned"))

    return pickle.dumps(Plant())


@pytest.mark.parametrize("resigned", [False, True], ids=["planted", "planted-and-rehashed"])
def test_a_planted_metadata_pickle_is_never_unpickled(encoded_sample, copy, tmp_path, resigned):
    control = tmp_path / "control"
    pickle.loads(_marker_pickle(control))  # the payload works: loading it does write its marker
    assert control.read_text() == "pwned"

    marker = tmp_path / "marker"
    newest = copy / "checkpoints" / "step-4"
    (newest / ".metadata").write_bytes(_marker_pickle(marker))
    if resigned:  # the attacker also fixes the manifest's hashes, but has no key
        manifest = json.loads((newest / MANIFEST).read_text())
        manifest["files"][".metadata"] = file_entry(newest / ".metadata")
        (newest / MANIFEST).write_text(json.dumps(manifest))
    run(encoded_sample, copy, max_steps=5)
    assert not marker.exists()
    reason = "bad-signature" if resigned else "bad-size"
    assert (copy / "checkpoints" / f"step-4.rejected-{reason}" / ".metadata").is_file()
    assert report(copy)["resumed_from"].endswith("step-2")


def test_a_planted_key_and_a_resigned_checkpoint_run_nothing(encoded_sample, copy, tmp_path):
    """The attack of issue 22: write access to checkpoints/ only. Plant a key file there, re-sign a
    checkpoint with a planted .metadata pickle: the run stops before unpickling anything."""
    from voxpipe.integrity import write_manifest

    marker = tmp_path / "marker"
    newest = copy / "checkpoints" / "step-4"
    (newest / ".metadata").write_bytes(_marker_pickle(marker))
    forged = b"attacker-key-0123456789abcdef"
    (copy / "checkpoints" / KEY_FILE).write_bytes(forged)
    manifest = json.loads((newest / MANIFEST).read_text())
    write_manifest(newest, forged, extra={"step": manifest["step"]})
    with pytest.raises(StepError, match=r"a checkpoint signing key inside the checkpoints folder is no "):
        run(encoded_sample, copy, max_steps=5)
    assert not marker.exists()


def test_checkpoints_signed_with_another_key_stop_the_run_and_stay(encoded_sample, copy, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "not-the-key-that-signed-them")
    before = sorted(p.name for p in (copy / "checkpoints").iterdir())
    with pytest.raises(StepError, match=f"no checkpoint's manifest verifies.*{KEY_ENV}.*--no-resume"):
        run(encoded_sample, copy, max_steps=6)
    assert sorted(p.name for p in (copy / "checkpoints").iterdir()) == before


# -- honest resume --------------------------------------------------------------------------------
def test_rerunning_a_finished_folder_trains_0_steps_and_says_so(encoded_sample, copy):
    export = (copy / "export" / "model.safetensors").read_bytes()
    result = run(encoded_sample, copy)
    assert report(copy)["steps_run"] == 0 and result.steps == STEPS
    assert "nothing to do" in result.summary() and "0 steps trained" in result.summary()
    assert (copy / "export" / "model.safetensors").read_bytes() == export


def test_resuming_with_a_changed_lr_is_refused_and_nothing_is_lost(encoded_sample, copy):
    before = report(copy)
    with pytest.raises(StepError, match=r"train\.lr: 0\.001 -> 0\.002.*--no-resume"):
        run(encoded_sample, copy, lr=2e-3)
    assert report(copy) == before
    assert (copy / "checkpoints" / "step-4" / MANIFEST).is_file()


def test_a_longer_max_steps_continues_without_an_lr_jump(encoded_sample, copy):
    run(encoded_sample, copy, max_steps=STEPS + 2)
    rows = [json.loads(line) for line in (copy / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 3))
    lrs = [r["lr"] for r in rows]
    assert all(a >= b for a, b in zip(lrs[1:], lrs[2:], strict=False)), f"lr rose after resume: {lrs}"
    assert report(copy)["resumed_from"].endswith(f"step-{STEPS}")


def test_fresh_on_change_starts_fresh_and_move_old_checkpoints_aside(encoded_sample, copy):
    run(encoded_sample, copy, lr=2e-3, fresh_on_change=True, max_steps=2)
    assert report(copy)["resumed_from"] is None and report(copy)["steps_run"] == 2
    aside = [p for p in copy.iterdir() if p.name.startswith("checkpoints.replaced-")]
    assert len(aside) == 1 and (aside[0] / "step-4" / MANIFEST).is_file()
    run(encoded_sample, copy, lr=2e-3, max_steps=3)  # same params as the fresh run: resumes it
    assert report(copy)["resumed_from"].endswith("step-2")


def _changed_data(sample, tmp_path: Path) -> Path:
    """The encoded sample less its last training row: new data, as a changed ingest.input gives."""
    data = tmp_path / "encoded-changed"
    shutil.copytree(sample.encoded, data)
    rows = (data / "train.jsonl").read_text().splitlines(keepends=True)
    (data / "train.jsonl").write_text("".join(rows[:-1]))
    return data


def test_changed_data_is_refused_before_loading_naming_both_ways_out(encoded_sample, copy, tmp_path):
    before = report(copy)
    data = _changed_data(encoded_sample, tmp_path)
    with pytest.raises(StepError, match=r"train\.data: the encoded data .*md5 \w{12} -> \w{12}.*"
                       r"train\.fresh_on_change=true.*--no-resume") as raised:
        run(encoded_sample, copy, data=str(data))
    assert raised.value.every_rank and "sampler" not in str(raised.value)
    assert report(copy) == before and (copy / "checkpoints" / "step-4" / MANIFEST).is_file()


def test_the_same_data_elsewhere_resumes(encoded_sample, copy, tmp_path):
    moved = tmp_path / "encoded-moved"
    shutil.copytree(encoded_sample.encoded, moved)
    run(encoded_sample, copy, data=str(moved), max_steps=STEPS + 1)
    assert report(copy)["resumed_from"].endswith(f"step-{STEPS}")


def test_fresh_on_change_starts_fresh_on_changed_data_in_one_line(encoded_sample, copy, tmp_path, caplog):
    data = _changed_data(encoded_sample, tmp_path)
    with caplog.at_level(logging.WARNING, logger="voxpipe.train.checkpoint"):
        run(encoded_sample, copy, data=str(data), fresh_on_change=True, max_steps=2)
    assert report(copy)["resumed_from"] is None and report(copy)["steps_run"] == 2
    fresh = [r.getMessage() for r in caplog.records if "starting fresh" in r.getMessage()]
    assert len(fresh) == 1 and "train.data: the encoded data" in fresh[0] and "\n" not in fresh[0]
    assert "checkpoints and exports moved to" in fresh[0]
    aside = [p for p in copy.iterdir() if p.name.startswith("checkpoints.replaced-")]
    assert len(aside) == 1 and (aside[0] / "step-4" / MANIFEST).is_file()


@pytest.mark.slow
def test_a_refusal_under_torchrun_is_printed_once_without_a_traceback(encoded_sample, copy, tmp_path):
    data = _changed_data(encoded_sample, tmp_path)
    cmd = [sys.executable, "-m", "voxpipe.launch.torchrun", "--standalone", "--nproc_per_node=2", "-m",
           "voxpipe.cli", "train", "--data", str(data), "--model-base", str(encoded_sample.base_model),
           "--out", str(copy), "--device", "cpu", "--max-steps", str(STEPS), "--max-tokens", "256",
           "--checkpoint-every", "2", "--val-every", "0", "--lr", "1e-3",
           "--set", "train.warmup_steps=1", "--set", "train.export_dtype=float32"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.count("voxpipe train: error:") == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr, proc.stderr[-3000:]
    assert "train.data: the encoded data" in proc.stderr


# -- finite numbers -------------------------------------------------------------------------------
def test_every_float_param_must_be_finite():
    floats = [f"{name}.{key}" for name, section in Params().model_dump(by_alias=True).items()
              if isinstance(section, dict) for key, v in section.items() if isinstance(v, float)]
    assert "train.lr" in floats
    for key in floats:
        for bad in (".inf", "-.inf", ".nan"):
            with pytest.raises(StepError, match=rf"{re.escape(key)}: Input should be a finite number"):
                load_params(None, [f"{key}={bad}"])


def test_the_cli_refuses_an_infinite_lr_in_one_paragraph(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "voxpipe.cli", "train", "--set", "train.lr=.inf",
                           "--out", str(tmp_path / "run")], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "train.lr: Input should be a finite number" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_non_finite_weights_are_not_exported(encoded_sample, tmp_path):
    from voxpipe.model.config import VoxCPM2Config
    from voxpipe.train.device import distributed_runtime
    from voxpipe.train.export import export_checkpoint
    from voxpipe.train.fsdp import build_model

    base = encoded_sample.base_model
    config = VoxCPM2Config.from_file(base / "config.json")
    with distributed_runtime("cpu") as rt:
        model = build_model(config, base, rt, dtype=torch.float32, lora_params=TrainParams().lora,
                            activation_checkpointing=False, seed=0)
        with torch.no_grad():
            name, param = next(iter(model.named_parameters()))
            param.fill_(float("nan"))
        with pytest.raises(StepError, match=r"step 7: 1 of \d+ trained tensors hold NaN or inf") as err:
            export_checkpoint(model, config, base, tmp_path / "export", rt, lora_params=TrainParams().lora,
                              dtype=torch.float32, step=7)
    assert name.split(".")[0] in str(err.value)
    assert not (tmp_path / "export").exists()


# -- one writer per output folder -----------------------------------------------------------------
def test_a_second_writer_is_told_who_holds_the_folder(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from voxpipe.outlock import "
         "hold_output\nwith hold_output(Path(sys.argv[1]), 'manifest'):\n print('held', flush=True)\n "
         "time.sleep(60)", str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = subprocess.run([sys.executable, "-m", "voxpipe.cli", "manifest", "--input", "x.jsonl",
                               "--out", str(out)], capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert f"pid {holder.pid} on host {os.uname().nodename}" in proc.stderr
        assert "is in use by another run" in proc.stderr
    finally:
        holder.kill()
        holder.wait()
    with hold_output(out, "manifest"):  # the dead holder's lock file is left behind, but not held
        assert lock_path(out).is_file()


def test_out_pointing_at_an_existing_file_is_refused(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("keep me")
    proc = subprocess.run([sys.executable, "-m", "voxpipe.cli", "manifest", "--input", "x.jsonl",
                           "--out", str(target)], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"--out {target} is an existing file" in proc.stderr
    assert target.read_text() == "keep me"


def _children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    return [int(c) for t in tasks.iterdir() for c in (t / "children").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
@pytest.mark.slow
def test_killing_torchruns_process_group_leaves_no_worker(encoded_sample, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
           "voxpipe.cli", "train", "--data", str(encoded_sample.encoded), "--model-base",
           str(encoded_sample.base_model), "--out", str(out), "--device", "cpu", "--max-steps", "400",
           "--checkpoint-every", "2", "--max-tokens", "256", "--val-every", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoints" / "step-2" / MANIFEST).is_file():  # workers are training
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        workers = _children(proc.pid)
        assert len(workers) == 2
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    deadline = time.monotonic() + 30
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(w) for w in workers), "a worker outlived its launcher"
    with hold_output(out, "train"):  # and nobody holds the folder any more
        pass


# -- every file checked before it is used ----------------------------------------------------------
def test_train_verifies_every_shard_and_encode_reencodes_only_the_bad_ones(encoded_sample, tmp_path):
    """4 flipped bytes in the latent shard and a truncated token shard: train stops before reading anything,
    naming both and saying to rerun encode; encode sets them aside and encodes only their clips."""
    from voxpipe.data.encode.step import encode
    from voxpipe.data.shards import check_referenced, referenced_shards
    from voxpipe.data.world import World
    from voxpipe.steps.encode import EncodeParams

    data = tmp_path / "encoded"
    shutil.copytree(encoded_sample.encoded, data)
    index = [json.loads(line) for line in (data / "index.jsonl").read_text().splitlines()]
    flipped = next(r for r in index if r["kind"] == "latents")
    truncated = next(r for r in index if r["kind"] != "latents")
    raw = bytearray((data / flipped["shard"]).read_bytes())
    for offset in range(len(raw) - 40, len(raw) - 36):  # inside the tensor data, past the header
        raw[offset] ^= 0x5A
    (data / flipped["shard"]).write_bytes(bytes(raw))
    with open(data / truncated["shard"], "r+b") as f:
        f.truncate(truncated["size"] // 2)

    with pytest.raises(StepError) as err:
        run(SimpleNamespace(encoded=data, base_model=encoded_sample.base_model), tmp_path / "train")
    message = str(err.value)
    assert "\n" not in message and f"{flipped['shard']} (bad-hash)" in message
    assert f"{truncated['shard']} (bad-size)" in message and "Rerun `voxpipe encode`" in message
    assert not (tmp_path / "train" / "checkpoints").exists()  # stopped before training

    params = Params(model={"base": str(encoded_sample.base_model)}, encode=EncodeParams(
        manifest=[str(encoded_sample.manifest / "train.jsonl"), str(encoded_sample.manifest / "val.jsonl")],
        out=str(data), device="cpu"))
    again = encode(params)
    assert again.run["shards_rejected"] == {flipped["shard"]: "bad-hash", truncated["shard"]: "bad-size"}
    # the clips of the damaged latent shard (here: the sample's only one), the tokens re-tokenized;
    # that encode leaves good shards alone is test_encode.py's test_deleted_truncated_or_altered_...
    assert again.run["clips"]["encoded"] == len(flipped["entries"])
    rows = [json.loads(line) for split in ("train", "val") for line in (data / f"{split}.jsonl").open()]
    check_referenced(data, referenced_shards(rows), World())  # now every shard verifies


def test_train_imports_nothing_of_the_encode_step():
    code = ("import sys, voxpipe.train.loop; "
            "print([m for m in sys.modules if m.startswith('voxpipe.data.encode')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# -- disk full ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_disk_full_while_checkpointing_keeps_the_complete_checkpoints(encoded_sample, tmp_path, monkeypatch):
    """The disk fills while step-4 is written (a real partial file, then the kernel's ENOSPC): one paragraph
    naming the folder, the partial folder gone, step-2 kept; with space again the rerun resumes from it."""
    import errno

    from voxpipe.train import checkpoint

    real = checkpoint.write_json

    def full_at_step_4(path, data):
        if ".tmp-step-4" in str(path):
            Path(path).write_text("{")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, data)

    monkeypatch.setattr(checkpoint, "write_json", full_at_step_4)
    out = tmp_path / "run"
    with pytest.raises(StepError) as err:
        run(encoded_sample, out)
    message = str(err.value)
    assert "\n" not in message and f"into {out / 'checkpoints'} failed (No space left on device)" in message
    assert "complete checkpoints are kept (step-2)" in message
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-2"]
    monkeypatch.setattr(checkpoint, "write_json", real)
    run(encoded_sample, out)
    assert report(out)["resumed_from"].endswith("step-2")


def test_disk_full_during_encode_names_the_folder(encoded_sample, tmp_path, monkeypatch):
    import errno

    from voxpipe.data import shards
    from voxpipe.data.encode.step import encode
    from voxpipe.steps.encode import EncodeParams

    def full(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)

    monkeypatch.setattr(shards, "save_file", full)
    out = tmp_path / "encoded"
    params = Params(model={"base": str(encoded_sample.base_model)}, encode=EncodeParams(
        manifest=[str(encoded_sample.manifest / "val.jsonl")], out=str(out), device="cpu"))
    with pytest.raises(StepError) as err:
        encode(params)
    message = str(err.value)
    assert "\n" not in message and f"writing into {out} failed (No space left on device" in message
    assert "rerun encode" in message


@pytest.mark.slow
def test_ctrl_c_stops_a_step_in_one_line_and_the_rerun_resumes(tmp_path):
    """A terminal's Ctrl-C (SIGINT to the whole process group, workers included): one line, status 130,
    no traceback; the same command then finishes the ingest."""
    cmd = [sys.executable, "-m", "voxpipe.cli", "ingest", "--input", str(Path("data/sample").resolve()),
           "--out", str(tmp_path / "ingest"), "--set", "ingest.score_quality=false"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    # interrupt the step, not the interpreter's start: on a loaded machine 4 s could still be before Python
    # handles SIGINT at all (the process then dies of the signal, silently, status -2)
    deadline = time.monotonic() + 60
    while not (tmp_path / "ingest").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the ingest finished before the interrupt arrived")
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last == "voxpipe ingest: interrupted; what was done is kept, and the same command resumes"
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]

"""Issue 34 part 7: a full disk ends train, encode, evaluate and register in one paragraph that names the
folder, on a real small tmpfs (conftest.small_disk, as ingest's tests); nothing done before is lost:
earlier checkpoints and shards stay valid and the rerun resumes from them, the previous evaluation stays,
and a new sqlite MLflow store is never left half-migrated."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from voxpipe.errors import StepError
from voxpipe.params import Params
from voxpipe.steps.encode import EncodeParams
from voxpipe.steps.train import TrainParams

FULL = "No space left on device"


def fill(folder: Path, leave: int) -> Path:
    """A filler file that leaves about `leave` bytes free on the volume of `folder`."""
    free = shutil.disk_usage(folder).free
    filler = folder / "filler"
    with open(filler, "wb") as f:
        f.write(b"\0" * max(free - leave, 0))
    return filler


def one_paragraph(err: pytest.ExceptionInfo, *parts: str) -> str:
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message, message
    for part in parts:
        assert part in message, message
    return message


# -- register: a new sqlite store ---------------------------------------------------------------------
def test_a_full_disk_while_creating_the_sqlite_store_leaves_no_half_store(small_disk, monkeypatch):
    from voxpipe.track.tracking import resolve_tracking_uri, session

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    disk = small_disk.mount("256k")  # MLflow's migrated schema takes more than that
    work = disk / "work"
    uri = resolve_tracking_uri(None, work)
    db = work / "mlflow.db"
    with pytest.raises(StepError) as err:
        with session(uri):
            pass
    one_paragraph(err, f"creating the MLflow store {db} failed", "The half-made store was removed",
                  "Free space on that volume")
    assert not db.exists() and not list(work.glob(".mlflow.db.creating*"))
    with pytest.raises(StepError):  # the rerun on the still-full disk: the same paragraph, no alembic error
        with session(uri):
            pass
    small_disk.resize(disk, "16m")  # space freed: the rerun creates the store whole
    with session(uri) as client:
        client.create_experiment("voices")
    assert db.is_file()


def test_a_half_migrated_store_is_named_with_the_way_out(tmp_path, monkeypatch):
    """What a full disk left before stores were created whole: MLflow's batch migration's temp table."""
    from voxpipe.track.tracking import session

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    db = tmp_path / "mlflow.db"
    with session(f"sqlite:///{db}"):
        pass
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE _alembic_tmp_endpoints (id INTEGER)")
    with pytest.raises(StepError) as err:
        with session(f"sqlite:///{db}"):
            pass
    one_paragraph(err, f"MLflow store {db} is half-migrated: table _alembic_tmp_endpoints",
                  f"mv {db} {db}.broken")
    (tmp_path / "junk.db").write_bytes(b"not a database at all, not even close" * 10)
    with pytest.raises(StepError, match=r"not a readable sqlite database .*mv "):
        with session(f"sqlite:///{tmp_path / 'junk.db'}"):
            pass


# -- train: checkpoints --------------------------------------------------------------------------------
TRAIN = {"device": "cpu", "max_tokens": 256, "val_every": 0, "val_batches": 1, "warmup_steps": 1, "lr": 1e-3,
         "checkpoint_every": 2, "export_dtype": "float32"}


def train_run(sample, out: Path, steps: int) -> dict:
    from voxpipe.train.loop import train

    train(Params(model={"base": str(sample.base_model)},
                 train=TrainParams(data=str(sample.encoded), out=str(out), max_steps=steps, **TRAIN)))
    return json.loads((out / "report.json").read_text())


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


@pytest.mark.slow  # three short tiny-model runs
def test_a_full_disk_at_a_checkpoint_keeps_the_earlier_one_and_the_rerun_resumes(
        encoded_sample, small_disk, monkeypatch):
    from voxpipe.integrity import KEY_ENV

    monkeypatch.delenv(KEY_ENV, raising=False)
    disk = small_disk.mount("256m")
    out = disk / "run"
    train_run(encoded_sample, out, steps=2)  # step-2 and the export fit
    step2 = out / "checkpoints" / "step-2"
    filler = fill(disk, leave=folder_bytes(step2) // 2)  # step-4 does not
    with pytest.raises(StepError) as err:
        train_run(encoded_sample, out, steps=4)
    # torch's writer says "file write failed" where the kernel said ENOSPC: one paragraph all the same
    message = one_paragraph(err, f"writing checkpoint step-4 into {out / 'checkpoints'} failed (",
                            "complete checkpoints are kept (step-2)", "rerun train")
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-2"], message
    filler.unlink()  # space freed: the same command resumes from step-2 and finishes
    report = train_run(encoded_sample, out, steps=4)
    assert report["resumed_from"].endswith("step-2") and report["steps"] == 4


# -- encode: shards ------------------------------------------------------------------------------------
def encode_params(sample, out: Path) -> Params:
    return Params(model={"base": str(sample.base_model)}, encode=EncodeParams(
        manifest=[str(sample.manifest / "train.jsonl"), str(sample.manifest / "val.jsonl")], out=str(out),
        device="cpu", shard_mb=0.002, batch_seconds=2.0))


@pytest.mark.slow  # three encodes of the sample
def test_a_full_disk_while_encoding_keeps_the_registered_shards_and_the_rerun_adds_the_rest(
        encoded_sample, small_disk, tmp_path):
    from voxpipe.data.encode.step import encode

    whole = encode(encode_params(encoded_sample, tmp_path / "whole"))  # how much the whole output takes
    total = folder_bytes(tmp_path / "whole")
    disk = small_disk.mount("64m")
    out = disk / "encoded"
    out.mkdir()
    filler = fill(disk, leave=total // 2)
    with pytest.raises(StepError) as err:
        encode(encode_params(encoded_sample, out))
    one_paragraph(err, f"writing into {out} failed ({FULL}", "Shards already registered", "rerun encode")
    filler.unlink()
    again = encode(encode_params(encoded_sample, out))
    reused = again.run["clips"]["reused"]
    assert 0 < reused < whole.run["clips"]["encoded"], again.run["clips"]  # the first run's shards count
    assert again.report["rows_kept"] == whole.report["rows_kept"]


# -- evaluate: samples ---------------------------------------------------------------------------------
def evaluate_args(sample, out: Path) -> list[str]:
    base = str(sample.base_model)
    return ["evaluate", "--model", base, "--model-base", base, "--data", str(sample.encoded),
            "--out", str(out), "--device", "cpu", "--seeds", "0", "--set", "evaluate.texts_per_speaker=1",
            "--set", "evaluate.max_len=4", "--set", "evaluate.inference_timesteps=2"]


@pytest.mark.slow  # two evaluations
def test_a_full_disk_while_evaluating_keeps_the_previous_evaluation(encoded_sample, small_disk, capsys):
    from voxpipe.cli import main

    disk = small_disk.mount("64m")
    out = disk / "eval"
    assert main(evaluate_args(encoded_sample, out)) == 0
    before = {p.relative_to(out): p.read_bytes() for p in [out / "eval.json", *(out / "samples").iterdir()]}
    capsys.readouterr()
    fill(disk, leave=8192)  # not even the first clip fits
    assert main(evaluate_args(encoded_sample, out)) != 0
    err = capsys.readouterr().err
    assert f"writing into {out} failed ({FULL}" in err and "previous evaluation there" in err, err
    assert "Traceback" not in err
    after = {p.relative_to(out): p.read_bytes() for p in [out / "eval.json", *(out / "samples").iterdir()]}
    assert after == before and not (out / ".samples-new").exists()


# -- the output lock: the first write of every step ------------------------------------------------------
def test_a_completely_full_disk_at_the_output_lock_is_one_paragraph_and_the_rerun_works(small_disk):
    """Issue 41: a completely full volume ended in a traceback from the lock file's holder record; now one
    paragraph naming the folder and the way out, and after freeing space the same --out is taken."""
    from voxpipe.outlock import guard_step, lock_path

    disk = small_disk.mount("64k")
    out = disk / "out"
    out.mkdir()
    filler = fill(disk, 0)
    with pytest.raises(StepError) as err:
        with guard_step(str(out), "train"):
            pytest.fail("the step must not start on a full volume")
    message = one_paragraph(err, f"--out {out}", FULL, "free space there", "rerun")
    assert str(lock_path(out)) in message
    filler.unlink()
    with guard_step(str(out), "train"):
        assert json.loads(lock_path(out).read_text())["step"] == "train"

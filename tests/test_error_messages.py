"""The faults of docs/resilience.md ("Faults and what is kept"): each bad input below is fed as a user
would, and the step must answer with one paragraph (a StepError, no traceback) that names the file or
key, and lose nothing it had already done.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from small_sample import TEST_CONSENT, write_small_sample

from voxpipe.errors import StepError
from voxpipe.steps.ingest import IngestParams
from voxpipe.steps.manifest import ManifestParams


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "voxpipe.cli", *args], capture_output=True, text=True,
                          cwd=cwd)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


# -- params ---------------------------------------------------------------------------------------
def test_non_utf8_params_file(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_bytes(b"train:\n  lr: 0.001  # caf\xe9\n")
    proc = cli("train", "--params", str(params), cwd=tmp_path)
    assert proc.returncode == 1
    assert f"{params}: not UTF-8 text" in proc.stderr and "save the file as UTF-8" in proc.stderr
    assert params.read_bytes().endswith(b"caf\xe9\n")  # the user's file is untouched


def test_broken_yaml_in_set(tmp_path):
    proc = cli("manifest", "--set", "manifest.val_fraction=[0.1,", cwd=tmp_path)
    assert proc.returncode == 1
    assert "--set 'manifest.val_fraction=[0.1,': not valid YAML" in proc.stderr


# -- data manifests -------------------------------------------------------------------------------
def test_non_utf8_bytes_in_a_manifest(encoded_sample, tmp_path):
    out = tmp_path / "manifest"
    raw = tmp_path / "raw.jsonl"
    lines = (encoded_sample.ingest / "raw.jsonl").read_bytes().splitlines(keepends=True)
    raw.write_bytes(b"".join(lines[:2]) + lines[2].replace(b'"text": "', b'"text": "\xe9t\xe9 ') + lines[3])
    # a folder from an earlier good run: the failed one must not damage it
    from voxpipe.data.manifest import build_manifest

    good = tmp_path / "good.jsonl"
    good.write_bytes(b"".join(lines))
    build_manifest(ManifestParams(input=[str(good)], out=str(out)))
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    proc = cli("manifest", "--input", str(raw), "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 1
    assert f"{raw}:3: not UTF-8 text" in proc.stderr and "\\xe9" in proc.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


@pytest.mark.slow
def test_non_utf8_bytes_in_a_training_manifest(encoded_sample, tmp_path):
    bad = tmp_path / "train.jsonl"
    rows = (encoded_sample.manifest / "train.jsonl").read_bytes()
    bad.write_bytes(rows.replace(b'"text": "', b'"text": "\xff', 1))
    proc = cli("validate", "--manifest", str(bad), cwd=tmp_path)
    assert proc.returncode == 1 and f"{bad}:1: not UTF-8 text" in proc.stderr
    proc = cli("encode", "--manifest", str(bad), "--model-base", str(encoded_sample.base_model), "--out",
               str(tmp_path / "enc"), "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 1 and f"{bad}:1: not UTF-8 text" in proc.stderr


# -- output folders and disks ---------------------------------------------------------------------
def test_read_only_output_folder(tmp_path, monkeypatch):
    """Root ignores permission bits, so the read-only file system is simulated at the write boundary."""
    from voxpipe.outlock import prepare_output

    out = tmp_path / "ro"
    out.mkdir()
    if os.geteuid() != 0:
        out.chmod(0o555)
    else:
        def read_only(*args, **kwargs):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))

        monkeypatch.setattr("tempfile.TemporaryFile", read_only)
    with pytest.raises(StepError, match=rf"--out {out}: the folder is not writable \((Read-only|Permission)"):
        prepare_output(out)


@pytest.mark.slow  # a whole ingest per case
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_full_or_read_only_disk_during_ingest_keeps_what_it_has(tmp_path, monkeypatch, code):
    """The disk fails on the 13th audio file (of 20): a real partial write, then the OSError the kernel
    gives. Rows are recorded per batch of 8 in input order, so the first batch is complete in raw.jsonl."""
    source = write_small_sample(tmp_path / "in", per_speaker=10)
    out = tmp_path / "ingest"
    calls = {"n": 0}
    real_write_bytes = Path.write_bytes

    def failing_write_bytes(self, data):
        calls["n"] += 1
        if self.suffix != ".tmp" or calls["n"] <= 12:
            return real_write_bytes(self, data)
        with open(self, "wb") as f:
            f.write(data[: len(data) // 2])
        raise OSError(code, os.strerror(code), str(self))

    monkeypatch.setattr(Path, "write_bytes", failing_write_bytes)
    from voxpipe.data.ingest_step import ingest

    params = IngestParams(**TEST_CONSENT, input=[str(source)], out=str(out), workers=1, max_bad_fraction=1.0)
    with pytest.raises(StepError, match=rf"writing into {out} failed \({os.strerror(code)}") as err:
        ingest(params)
    assert "no temp file is left" in str(err.value)
    left = [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    assert not left, f"a temp file was left behind: {left}"
    kept = (out / "raw.jsonl").read_text().splitlines()
    assert len(kept) >= 8, "the rows ingested before the failure were not kept"
    report = json.loads((out / "report.json").read_text())
    assert report["rows_kept"] == len(kept) and os.strerror(code) in report["error"]
    assert all((out / json.loads(line)["audio"]).is_file() for line in kept)

    monkeypatch.setattr(Path, "write_bytes", real_write_bytes)  # space freed: the rerun completes
    result = ingest(params)
    assert result.rows_kept > len(kept)


# -- checkpoints a user points us at --------------------------------------------------------------
@pytest.fixture
def base_copy(encoded_sample, tmp_path):
    base = tmp_path / "base"
    shutil.copytree(encoded_sample.base_model, base)
    return base


@pytest.mark.slow
def test_truncated_audiovae(encoded_sample, base_copy, tmp_path):
    vae = base_copy / "audiovae.safetensors"
    vae.write_bytes(vae.read_bytes()[: vae.stat().st_size // 2])
    out = tmp_path / "enc"
    proc = cli("encode", "--manifest", str(encoded_sample.manifest / "val.jsonl"), "--model-base",
               str(base_copy), "--out", str(out), "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 1
    assert f"{vae}: cannot read the AudioVAE weights" in proc.stderr and "truncated or corrupt" in proc.stderr


def test_junk_tokenizer_json_is_named(encoded_sample, base_copy, tmp_path):
    from voxpipe.model.encoder import load_encoder

    tokenizer = base_copy / "tokenizer.json"
    tokenizer.write_bytes(b'{"version": "1.0", "model": {"type": "Nope"}}')
    proc = cli("encode", "--manifest", str(encoded_sample.manifest / "val.jsonl"), "--model-base",
               str(base_copy), "--out", str(tmp_path / "enc"), "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 1 and f"{tokenizer}: not a tokenizer" in proc.stderr
    for junk in (b"\xff\xfejunk", b"{"):  # not UTF-8; cut-off JSON
        tokenizer.write_bytes(junk)
        with pytest.raises(StepError, match=f"{tokenizer}: not a tokenizer file"):
            load_encoder(base_copy)


@pytest.mark.slow
def test_a_config_asking_for_82_gb_is_refused_before_allocating(encoded_sample, base_copy, tmp_path):
    """The tiny base with a vocab_size typo that makes its parameters 82 GB (fp32): more than this box has."""
    import torch

    from voxpipe.model.config import VoxCPM2Config
    from voxpipe.model.memory import available_bytes, parameter_bytes
    from voxpipe.model.voxcpm2 import VoxCPM2

    config = json.loads((base_copy / "config.json").read_text())

    def size(vocab: int) -> int:
        config["lm_config"]["vocab_size"] = vocab
        return parameter_bytes(lambda: VoxCPM2(VoxCPM2Config.from_dict(config)))

    per_token = size(2000) - size(1000)
    vocab = 1000 + int((82e9 - size(1000)) / per_token * 1000)
    assert size(vocab) == pytest.approx(82e9, rel=1e-3)
    (base_copy / "config.json").write_text(json.dumps(config))
    free = available_bytes(torch.device("cpu"))
    if free is None or free > 100e9:
        pytest.skip("this machine has room for it")
    out = tmp_path / "train"
    start = time.monotonic()
    proc = cli("train", "--data", str(encoded_sample.encoded), "--model-base", str(base_copy), "--out",
               str(out), "--device", "cpu", "--max-steps", "1", cwd=tmp_path)
    assert proc.returncode == 1
    assert f"{base_copy / 'config.json'}: the model needs about" in proc.stderr
    assert "nothing was allocated" in proc.stderr
    assert time.monotonic() - start < 600  # (not a timing assertion: a guard against a swap storm)


# -- the MLflow store -----------------------------------------------------------------------------
RACER = """
import sys, time
from pathlib import Path
from voxpipe.track.tracking import experiment_id, session
import mlflow  # imported before the start line, so that all racers open the store together
go = Path(sys.argv[2])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.01)
with session(sys.argv[1]) as client:
    experiment_id(client, "voxpipe", None)
    client.create_registered_model(sys.argv[3])
print("ok")
"""


@pytest.mark.slow
def test_first_use_of_a_new_sqlite_store_by_racing_processes(tmp_path):
    """Without the creation lock, racers on a new mlflow.db fail in alembic's migration."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    go = tmp_path / "go"
    racers = [subprocess.Popen([sys.executable, "-c", RACER, uri, str(go), f"model{i}"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    assert all(r.stdout.readline().strip() == "ready" for r in racers)
    go.touch()
    results = [r.communicate(timeout=300) for r in racers]
    assert all(r.returncode == 0 for r in racers), [err[-1500:] for _, err in results]
    assert all(out.strip().endswith("ok") for out, _ in results)

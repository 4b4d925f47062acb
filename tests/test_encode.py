"""`voxpipe encode` on the shipped sample: batched = one-at-a-time, rerun does nothing, resume, quarantine."""

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
from safetensors import safe_open

from voxpipe.data.audio import decode
from voxpipe.data.encode import encode, encode_batch, load_encoder
from voxpipe.errors import StepError
from voxpipe.model.tokenizer import VoxTokenizer
from voxpipe.params import EncodeParams

ROOT = Path(__file__).resolve().parents[1]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _tree(folder: Path) -> dict[str, bytes]:
    """Every output file's bytes except the report (timings) and the stat-keyed hash cache."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in ("report.json", "file_hashes.json")
    }


def _tensor(folder: Path, ref: dict) -> torch.Tensor:
    with safe_open(str(folder / ref["shard"]), framework="pt") as f:
        return f.get_tensor(ref["key"])


def _subset_manifest(encoded_sample, n: int, path: Path) -> Path:
    """The first n train rows with absolute audio paths, so the manifest can live anywhere."""
    lines = []
    for row in _rows(encoded_sample.manifest / "train.jsonl")[:n]:
        for key in ("audio", "ref_audio"):
            if key in row:
                row[key] = str((encoded_sample.manifest / row[key]).resolve())
        lines.append(json.dumps(row) + "\n")
    path.write_text("".join(lines))
    return path


def test_batched_encoding_equals_one_at_a_time(encoded_sample):
    enc = load_encoder(encoded_sample.base_model)
    files = sorted((encoded_sample.ingest / "audio").rglob("*.flac"))[:4]
    # real speech cut to different lengths (not multiples of 2560), so the batch pads most clips
    wavs = [decode(f, 16000)[: int(16000 * s)] for f, s in zip(files, (1.9, 0.7, 1.37, 1.1), strict=True)]
    assert len({len(w) for w in wavs}) == len(wavs)
    batched = encode_batch(enc.vae, wavs, enc.multiple)
    for wav, z in zip(wavs, batched, strict=True):
        (alone,) = encode_batch(enc.vae, [wav], enc.multiple)
        assert z.shape == alone.shape == (math.ceil(len(wav) / 2560) * 4, 64)
        torch.testing.assert_close(z, alone, atol=1e-5, rtol=0)
        assert z.abs().max() > 0


def test_encoded_sample_rows_point_at_their_latents_and_tokens(encoded_sample):
    out = encoded_sample.encoded
    report = json.loads((out / "report.json").read_text())
    manifest_rows = [r for s in ("train", "val") for r in _rows(encoded_sample.manifest / f"{s}.jsonl")]
    rows = _rows(out / "train.jsonl") + _rows(out / "val.jsonl")
    assert report["rows_in"] == report["rows_kept"] == len(rows) == len(manifest_rows) == 64
    assert report["clips"] == {"total": 64, "encoded": 64, "reused": 0, "failed": 0}  # refs reuse clips
    assert [r["id"] for r in rows] == [r["id"] for r in manifest_rows]
    tokenizer = VoxTokenizer.from_dir(encoded_sample.base_model)
    for row in rows[:8] + [r for r in rows if "ref_audio" in r][:4]:
        samples = len(decode(out / row["audio"], 16000))
        latents = _tensor(out, row["latents"])
        assert latents.dtype == torch.float32
        assert latents.shape == (row["audio_frames"], 64) == (math.ceil(samples / 2560) * 4, 64)
        assert _tensor(out, row["tokens"]).tolist() == tokenizer.encode(row["text"])
        assert row["text_tokens"] == len(tokenizer.encode(row["text"]))
        extra = 0
        if "ref_audio" in row:
            ref = _tensor(out, row["ref_latents"])
            assert ref.shape == (row["ref_frames"], 64)
            extra = row["ref_frames"] // 4 + 2
        assert row["lm_tokens"] == row["text_tokens"] + row["audio_frames"] // 4 + 2 + extra


def test_rerun_does_no_encoding_and_changes_nothing(encoded_sample):
    # a sibling copy keeps the rows' relative audio paths valid
    copy = encoded_sample.encoded.parent / "encoded_rerun"
    shutil.copytree(encoded_sample.encoded, copy)
    before = _tree(copy)
    result = encode(EncodeParams(
        manifest=[str(encoded_sample.manifest / "train.jsonl"), str(encoded_sample.manifest / "val.jsonl")],
        model=str(encoded_sample.base_model),
        out=str(copy),
        device="cpu",
    ))
    assert result.report["clips"]["encoded"] == 0
    assert result.report["clips"]["reused"] == 64
    assert result.report["texts_tokenized"] == 0
    assert _tree(copy) == before


def test_killed_run_resumes_to_the_uninterrupted_result(encoded_sample, tmp_path):
    manifest = _subset_manifest(encoded_sample, 8, tmp_path / "subset.jsonl")
    settings = {"shard_mb": 0.05, "batch_seconds": 8.0}  # two or three clips per shard, several shards
    common = dict(manifest=[str(manifest)], model=str(encoded_sample.base_model), device="cpu", **settings)
    reference = encode(EncodeParams(out=str(tmp_path / "uninterrupted"), **common))
    assert reference.report["clips"]["encoded"] == reference.report["clips"]["total"]

    out = tmp_path / "resumed"
    cmd = [sys.executable, "-m", "voxpipe.cli", "encode", "--manifest", str(manifest),
           "--model", str(encoded_sample.base_model), "--out", str(out), "--device", "cpu"]
    cmd += [arg for key, value in settings.items() for arg in ("--set", f"encode.{key}={value}")]
    # run from tmp_path so the repo's params.yaml is not read; env keeps the package importable
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    index = out / "index.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if index.is_file() and sum('"latents"' in line for line in index.read_text().splitlines()) >= 1:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    assert proc.wait(timeout=30) == -signal.SIGKILL, "the encode subprocess ended before it could be killed"
    assert not (out / "report.json").exists()
    assert not (out / "subset.jsonl").exists()

    resumed = encode(EncodeParams(out=str(out), **common))
    clips = resumed.report["clips"]
    assert 0 < clips["encoded"] < clips["total"]
    assert clips["encoded"] + clips["reused"] == clips["total"] == reference.report["clips"]["total"]
    assert resumed.report["texts_tokenized"] == 0  # the token shard was registered before the kill
    assert _tree(out) == _tree(tmp_path / "uninterrupted")


def test_bad_rows_are_quarantined_with_file_line_and_reason(encoded_sample, tmp_path):
    good = _rows(encoded_sample.manifest / "train.jsonl")[0]
    audio = str((encoded_sample.manifest / good["audio"]).resolve())
    junk = tmp_path / "junk.flac"
    junk.write_bytes(b"this is not audio" * 100)
    lines = [
        json.dumps({"id": "ok", "audio": audio, "text": good["text"]}),
        json.dumps({"id": "gone", "audio": str(tmp_path / "nope.flac"), "text": "hello"}),
        json.dumps({"id": "junk", "audio": str(junk), "text": "hello"}),
        "{not json",
        json.dumps({"id": "blank", "audio": audio, "text": "  "}),
        json.dumps({"id": "badref", "audio": audio, "text": "hello", "ref_audio": str(junk)}),
    ]
    manifest = tmp_path / "train.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    result = encode(EncodeParams(manifest=[str(manifest)], model=str(encoded_sample.base_model), out=str(out),
                                 device="cpu"))
    report = result.report
    assert (report["rows_in"], report["rows_kept"], report["rows_quarantined"]) == (6, 1, 5)
    assert report["reasons"] == {"audio_missing": 1, "audio_undecodable": 1, "bad_json": 1, "missing_text": 1,
                                 "ref_audio_undecodable": 1}
    quarantined = _rows(out / "quarantine.jsonl")
    assert [(q["source"]["line"], q["reason"]) for q in quarantined] == [
        (2, "audio_missing"), (3, "audio_undecodable"), (4, "bad_json"), (5, "missing_text"),
        (6, "ref_audio_undecodable"),
    ]
    assert all(q["source"]["file"] == str(manifest) and q["detail"] for q in quarantined)
    assert "nope.flac" in quarantined[0]["detail"]
    assert [r["id"] for r in _rows(out / "train.jsonl")] == ["ok"]

    manifest.write_text("\n".join(lines[1:3]) + "\n")
    with pytest.raises(StepError, match="no row could be encoded"):
        encode(EncodeParams(manifest=[str(manifest)], model=str(encoded_sample.base_model),
                            out=str(tmp_path / "none"), device="cpu"))

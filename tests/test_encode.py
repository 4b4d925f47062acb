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
from voxpipe.data.encode.step import encode
from voxpipe.errors import StepError
from voxpipe.model.encoder import encode_batch, load_encoder
from voxpipe.model.tokenizer import VoxTokenizer
from voxpipe.params import Params
from voxpipe.steps.encode import EncodeParams

ROOT = Path(__file__).resolve().parents[1]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _tree(folder: Path) -> dict[str, bytes]:
    """Every output file's bytes except the report, the run's timings and the stat-keyed hash cache."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in ("report.json", "run.json", "file_hashes.json")
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


@pytest.mark.slow
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
    assert report["clips"] == {"total": 64, "failed": 0}  # refs reuse clips
    assert json.loads((out / "run.json").read_text())["clips"] == {"encoded": 64, "reused": 0}
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
    result = encode(Params(model={"base": str(encoded_sample.base_model)}, encode=EncodeParams(
        manifest=[str(encoded_sample.manifest / "train.jsonl"), str(encoded_sample.manifest / "val.jsonl")],
        out=str(copy),
        device="cpu",
    )))
    assert result.run["clips"] == {"encoded": 0, "reused": 64}
    assert result.run["texts_tokenized"] == 0
    assert _tree(copy) == before


@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_result(encoded_sample, tmp_path):
    manifest = _subset_manifest(encoded_sample, 8, tmp_path / "subset.jsonl")
    settings = {"shard_mb": 0.05, "batch_seconds": 8.0}  # two or three clips per shard, several shards
    common = dict(manifest=[str(manifest)], device="cpu", **settings)
    base = {"base": str(encoded_sample.base_model)}
    reference = encode(Params(model=base, encode=EncodeParams(out=str(tmp_path / "uninterrupted"), **common)))
    assert reference.run["clips"]["encoded"] == reference.report["clips"]["total"]

    out = tmp_path / "resumed"
    cmd = [sys.executable, "-m", "voxpipe.cli", "encode", "--manifest", str(manifest),
           "--model-base", str(encoded_sample.base_model), "--out", str(out), "--device", "cpu"]
    cmd += [arg for key, value in settings.items() for arg in ("--set", f"encode.{key}={value}")]
    # run from tmp_path so the repo's params.yaml is not read; env keeps the package importable
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    index = out / "index.rank-0.jsonl"  # a rank's shards are registered here until rank 0 merges them
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if index.is_file() and sum('"latents"' in line for line in index.read_text().splitlines()) >= 1:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    assert proc.wait(timeout=30) == -signal.SIGKILL, "the encode subprocess ended before it could be killed"
    assert not (out / "report.json").exists()
    assert not (out / "subset.jsonl").exists()

    resumed = encode(Params(model=base, encode=EncodeParams(out=str(out), **common)))
    clips = resumed.run["clips"]
    assert 0 < clips["encoded"] and 0 < clips["reused"]
    assert clips["encoded"] + clips["reused"] == reference.report["clips"]["total"]
    assert resumed.run["texts_tokenized"] == 0  # the token shard was registered before the kill
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
    result = encode(Params(model={"base": str(encoded_sample.base_model)},
                           encode=EncodeParams(manifest=[str(manifest)], out=str(out), device="cpu")))
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
        encode(Params(model={"base": str(encoded_sample.base_model)},
                      encode=EncodeParams(manifest=[str(manifest)], out=str(tmp_path / "none"),
                                          device="cpu")))


# ---------------------------------------------------------------------------------------------
# Under torchrun: the same latents, bit for bit, and a resume per rank
# ---------------------------------------------------------------------------------------------

def test_the_batches_do_not_depend_on_the_world_size_or_on_earlier_work():
    from voxpipe.data.encode.plan import Clip, plan

    lengths = [16000 * s // 10 for s in (14, 50, 22, 31, 9, 44, 27, 18, 35, 12, 40, 25, 33, 16, 21)]
    clips = [Clip(f"{i:02d}", Path(f"{i}.flac"), n) for i, n in enumerate(lengths)]
    new = {c.sha for c in clips}
    names = lambda batches: [[c.sha for c in b] for b in batches]  # noqa: E731
    (alone,) = plan(clips, new, 2560, 16000 * 6, 1)
    assert any(len(b) > 1 for b in alone)
    for ranks in (2, 3, 8):
        dealt = plan(clips, new, 2560, 16000 * 6, ranks)
        assert sorted(names(b for mine in dealt for b in mine)) == sorted(names(alone))  # each batch once
        loads = [sum(len(b) * max(c.samples for c in b) for b in mine) for mine in dealt]
        assert max(loads) - min(loads) <= max(len(b) * max(c.samples for c in b) for b in alone)
    # once the first batches are encoded, the rest are the very same batches
    done = {c.sha for b in alone[:3] for c in b}
    assert names(plan(clips, new - done, 2560, 16000 * 6, 1)[0]) == names(alone[3:])


# batches of 1-3 clips (the sample's clips last 1.4-5 s) and a shard per batch or two
SPLIT = {"batch_seconds": 6.0, "shard_mb": 0.02}


def _params(encoded_sample, manifest: Path, out: Path, **settings) -> Params:
    return Params(model={"base": str(encoded_sample.base_model)},
                  encode=EncodeParams(manifest=[str(manifest)], out=str(out), device="cpu", **settings))


def _torchrun(encoded_sample, nproc: int, manifest: Path, out: Path, settings: dict) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "voxpipe.cli", "encode", "--manifest", str(manifest), "--model-base",
           str(encoded_sample.base_model), "--out", str(out), "--device", "cpu"]
    cmd += [arg for key, value in settings.items() for arg in ("--set", f"encode.{key}={value}")]
    # run beside the manifest so the repo's params.yaml is not read; env keeps the package importable
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(cmd, cwd=manifest.parent, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _finish(proc: subprocess.Popen) -> None:
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output


def _latents(folder: Path, split: str) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """Each row's latents (and ref latents) as training reads them, copied out of the memory-mapped shards."""
    from voxpipe.data.dataset import EncodedDataset

    data = EncodedDataset(folder, split)
    samples = [data[i] for i in range(len(data))]
    return {row["id"]: (s.latents.clone(), None if s.ref_latents is None else s.ref_latents.clone())
            for row, s in zip(data.rows, samples, strict=True)}


def _assert_bit_identical(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, (latents, ref) in want.items():
        assert torch.equal(got[key][0], latents), key
        assert (ref is None and got[key][1] is None) or torch.equal(got[key][1], ref), key


@pytest.mark.slow
def test_two_ranks_encode_bit_identical_latents(encoded_sample, tmp_path):
    manifest = _subset_manifest(encoded_sample, 12, tmp_path / "subset.jsonl")
    one = encode(_params(encoded_sample, manifest, tmp_path / "one", **SPLIT))
    _finish(_torchrun(encoded_sample, 2, manifest, tmp_path / "two", SPLIT))

    run = json.loads((tmp_path / "two" / "run.json").read_text())
    assert run["world_size"] == 2
    assert all(r["clips_encoded"] > 0 for r in run["ranks"])  # both ranks did real work
    assert sum(r["clips_encoded"] for r in run["ranks"]) == one.report["clips"]["total"]
    assert not list((tmp_path / "two").glob("index.rank-*"))  # rank 0 merged the parts
    two = json.loads((tmp_path / "two" / "report.json").read_text())
    # versions list what the process had imported: pytest's differs from the CLI's
    assert {**two, "versions": None} == {**one.report, "versions": None}
    _assert_bit_identical(_latents(tmp_path / "two", "subset"), _latents(tmp_path / "one", "subset"))


def _worker(launcher: subprocess.Popen, local_rank: int):
    import psutil

    for child in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if child.environ().get("LOCAL_RANK") == str(local_rank):
                return child
        except psutil.Error:
            continue
    return None


@pytest.mark.slow
def test_a_killed_rank_resumes_its_share(encoded_sample, tmp_path):
    manifest = _subset_manifest(encoded_sample, 16, tmp_path / "subset.jsonl")
    settings = {"batch_seconds": 3.0, "shard_mb": 0.001}  # a clip or two per batch, a shard per batch
    reference = encode(_params(encoded_sample, manifest, tmp_path / "reference", **settings))

    out = tmp_path / "resumed"
    proc = _torchrun(encoded_sample, 2, manifest, out, settings)
    part = out / "index.rank-1.jsonl"
    deadline = time.monotonic() + 180
    killed = False
    while time.monotonic() < deadline and proc.poll() is None:
        worker = _worker(proc, 1)
        if worker and part.is_file() and '"latents"' in part.read_text():
            worker.kill()  # rank 1 alone; torchrun then stops rank 0
            killed = True
            break
        time.sleep(0.01)
    proc.communicate(timeout=120)
    assert killed and proc.returncode != 0, "the 2-rank encode ended before rank 1 could be killed"
    assert not (out / "report.json").exists()

    _finish(_torchrun(encoded_sample, 2, manifest, out, settings))
    clips = json.loads((out / "run.json").read_text())["clips"]
    assert clips["reused"] > 0 and clips["encoded"] > 0  # what rank 1 registered was kept
    assert clips["reused"] + clips["encoded"] == reference.report["clips"]["total"]
    _assert_bit_identical(_latents(out, "subset"), _latents(tmp_path / "reference", "subset"))


# ---------------------------------------------------------------------------------------------
# Shards are verified before reuse
# ---------------------------------------------------------------------------------------------


def test_deleted_truncated_or_altered_shards_are_encoded_again(encoded_sample, tmp_path):
    manifest = _subset_manifest(encoded_sample, 8, tmp_path / "subset.jsonl")
    first = encode(_params(encoded_sample, manifest, tmp_path / "out", **SPLIT))
    out = tmp_path / "out"
    want = _latents(out, "subset")
    records = _rows(out / "index.jsonl")
    shards = [r for r in records if r["kind"] == "latents"]
    assert len(shards) >= 3
    deleted, truncated, altered = (out / s["shard"] for s in shards[:3])
    deleted.unlink()
    truncated.write_bytes(truncated.read_bytes()[:-100])
    data = bytearray(altered.read_bytes())
    data[-1] ^= 0xFF  # same size, one bit pattern changed in the last latent
    altered.write_bytes(bytes(data))

    again = encode(_params(encoded_sample, manifest, out, **SPLIT))
    reasons = ("missing-file", "bad-size", "bad-hash")
    assert again.run["shards_rejected"] == {s["shard"]: r for s, r in zip(shards, reasons, strict=False)}
    assert again.run["clips"]["encoded"] == sum(len(s["entries"]) for s in shards[:3])
    assert again.report == first.report
    # the damaged files are set aside under a name that says why, the index lists only good shards
    assert truncated.with_name(truncated.name + ".bad-size").is_file()
    assert altered.with_name(altered.name + ".bad-hash").is_file()
    for record in _rows(out / "index.jsonl"):
        assert (out / record["shard"]).stat().st_size == record["size"]
    _assert_bit_identical(_latents(out, "subset"), want)  # same batches: the very same latents

    # an index line without checksums (an older voxpipe) or pointing outside shards/ is not trusted either
    records = _rows(out / "index.jsonl")
    latents = [r for r in records if r["kind"] == "latents"]
    del latents[0]["size"], latents[0]["sha256"]
    latents[1]["shard"] = "../" + latents[1]["shard"]
    junk = b'{"shard": "shards/x"\n\xff\xfe not utf-8\n'  # and lines that are not shard records at all
    (out / "index.jsonl").write_bytes("".join(json.dumps(r) + "\n" for r in records).encode() + junk)
    third = encode(_params(encoded_sample, manifest, out, **SPLIT))
    assert b"not utf-8" not in (out / "index.jsonl").read_bytes()
    rejected = {latents[0]["shard"]: "unverified", latents[1]["shard"]: "bad-path"}
    assert third.run["shards_rejected"] == rejected
    assert third.run["clips"]["encoded"] == len(latents[0]["entries"]) + len(latents[1]["entries"])
    _assert_bit_identical(_latents(out, "subset"), want)


# ---------------------------------------------------------------------------------------------
# On a cluster: a Volcano job through train's launcher, with encode's own device count
# ---------------------------------------------------------------------------------------------


def _encode_job(**launch) -> dict:
    from voxpipe.launch.pod import StepJob
    from voxpipe.launch.volcano import render_job
    from voxpipe.steps.launch import LaunchParams

    params = Params(launch=LaunchParams(accelerator="nvidia.com/gpu", devices_per_pod=8, **launch),
                    encode=EncodeParams(manifest=["runs/m/train.jsonl", "runs/m/val.jsonl"], out="runs/enc"),
                    model={"base": "models/VoxCPM2"})
    return render_job(params, "ml", None, StepJob.encode(params.launch))


@pytest.mark.parametrize("devices, pods, per_pod", [(1, 1, 1), (4, 1, 4), (16, 2, 8)])
def test_encode_job_runs_torchrun_on_voxpipe_encode_with_its_own_devices(tmp_path, devices, pods, per_pod):
    import kubernetes_validate

    from voxpipe.params import load_params

    job = _encode_job(encode_devices=devices, pods=3)  # launch.pods is train's, not encode's
    assert job["metadata"]["generateName"] == "voxpipe-encode-"
    assert job["spec"]["minAvailable"] == pods
    assert sum(t["replicas"] for t in job["spec"]["tasks"]) == pods
    for task in job["spec"]["tasks"]:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {**task["template"]["metadata"], "name": "p"},
               "spec": task["template"]["spec"]}
        kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    container = job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == per_pod

    # the pod's command, with torchrun replaced by a recorder of its arguments
    fake = tmp_path / "bin" / "torchrun"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$RECORD"\n')
    fake.chmod(0o755)
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env |= {"PATH": f"{fake.parent}:{os.environ['PATH']}", "RECORD": str(tmp_path / "argv"),
            "WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "m", "MASTER_PORT": "1"}
    subprocess.run(container["args"], env=env, check=True, cwd=tmp_path)
    argv = (tmp_path / "argv").read_text().splitlines()
    assert f"--nproc_per_node={per_pod}" in argv
    assert argv[-5:-1] == ["-m", "voxpipe.cli", "encode", "--params"]
    carried = load_params(argv[-1])
    assert carried.encode.out == "runs/enc" and carried.model.base == "models/VoxCPM2"


def test_encode_job_refuses_partial_pods_and_paths_off_the_workspace():
    with pytest.raises(StepError, match="encode_devices=12 does not fill whole pods"):
        _encode_job(encode_devices=12)
    from voxpipe.launch.pod import StepJob
    from voxpipe.launch.volcano import render_job

    params = Params(encode=EncodeParams(manifest=["ok.jsonl", "/etc/elsewhere.jsonl"]))
    with pytest.raises(StepError, match="encode.manifest='/etc/elsewhere.jsonl'"):
        render_job(params, "ml", None, StepJob.encode(params.launch))


def test_text_the_tokenizer_only_byte_encodes_is_counted_and_row_fields_travel(encoded_sample, tmp_path):
    good = _rows(encoded_sample.manifest / "train.jsonl")[0]
    audio = str((encoded_sample.manifest / good["audio"]).resolve())
    assert good["language"] == "en" and "text_raw" in good  # from ingest, through the manifest
    manifest = tmp_path / "train.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in (
        {"id": "plain", "audio": audio, "text": good["text"], "language": "en", "text_raw": "as written"},
        {"id": "new-script", "audio": audio, "text": "ʘʬ 🎉", "language": "xx"},
        {"id": "han", "audio": audio, "text": "价格是十二点五元", "language": "zh"},
    )))
    out = tmp_path / "out"
    result = encode(Params(model={"base": str(encoded_sample.base_model)},
                           encode=EncodeParams(manifest=[str(manifest)], out=str(out), device="cpu")))
    plain, new, han = _rows(out / "train.jsonl")
    assert plain["byte_tokens"] == 0 and new["byte_tokens"] >= 3 and han["byte_tokens"] > 0
    assert (plain["language"], plain["text_raw"], new["language"]) == ("en", "as written", "xx")
    split = result.report["splits"]["train.jsonl"]
    assert split["byte_token_rows"] == 2
    assert split["byte_token_rows_by_script"] == {"Han": 1, "Latin or other alphabets": 1}
    warning = result.summary().splitlines()[-1]  # 2 of 3 rows: the summary warns, naming the way out
    assert warning.startswith("warning: ") and "2 of 3 rows (Han 1" in warning and "VoxCPM2" in warning

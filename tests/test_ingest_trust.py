"""Ingest trusts no file after it was written and no input beyond its folder (issue 22): the plan's
input hashes, the shards' output hashes checked by the merge, links out of the input folder, an
oversized CSV field, a worker count above the cores, and a full disk in ingest and manifest."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from small_sample import TEST_CONSENT, TEST_CONSENT_FLAGS
from test_ingest import encode, read_outputs, struct, tone, write_parquet
from test_ingest_formats import write_table

from voxpipe import cli
from voxpipe.cores import usable_cores
from voxpipe.data.ingest_shards import OUTPUT_HASHES, ingest_shard, merge, plan
from voxpipe.data.ingest_step import ingest
from voxpipe.errors import StepError
from voxpipe.steps.ingest import IngestParams


def _params(data: Path, **kw) -> IngestParams:
    # tones are not speech: DNSMOS rightly scores them low_quality (tests/test_ingest_conditioning.py)
    return IngestParams(**TEST_CONSENT,
                        input=[str(data)], workers=1, max_bad_fraction=1.0, score_quality=False, **kw)


def _dataset(folder: Path, files: int = 2) -> Path:
    for f in range(files):
        rows = [{"audio": struct(encode(tone(200 + 50 * f + 10 * i))), "text": f"file {f} row {i}",
                 "speaker": "s"} for i in range(3)]
        write_parquet(folder / f"part-{f}.parquet", rows)
    return folder


def _sharded(tmp_path: Path) -> tuple[Path, Path, list[Path]]:
    data = _dataset(tmp_path / "data")
    planned = plan(_params(data, shards=2, out=str(tmp_path / "plan")))
    folders = [tmp_path / f"s{i}" for i in range(2)]
    for i, folder in enumerate(folders):
        ingest_shard(_params(data, plan=str(planned.path), shard=i, out=str(folder)))
    return data, planned.path, folders


def test_the_plan_records_each_input_and_a_shard_refuses_a_changed_one(tmp_path):
    data, plan_path, _ = _sharded(tmp_path)
    entry = json.loads(plan_path.read_text())["inputs"][1]
    assert entry["size"] == (data / "part-1.parquet").stat().st_size and len(entry["sha256"]) == 64
    # swapped for a file with the same row count: the count alone would not notice
    rows = [{"audio": struct(encode(tone(900 + i))), "text": f"swapped {i}", "speaker": "s"}
            for i in range(3)]
    write_parquet(data / "part-1.parquet", rows)
    with pytest.raises(StepError, match=r"part-1.parquet is not the file the plan .* recorded .* changed "
                                        r"after planning. Run `voxpipe ingest-plan` again"):
        ingest_shard(_params(data, plan=str(plan_path), shard=1, out=str(tmp_path / "again")))


def test_merge_refuses_an_edited_transcript(tmp_path):
    data, plan_path, folders = _sharded(tmp_path)
    hashes = (folders[0] / OUTPUT_HASHES).read_text().splitlines()
    assert hashes[0].endswith("  raw.jsonl") and hashes[1].endswith("  quarantine.jsonl")
    assert subprocess.run(["sha256sum", "--check", "--quiet", OUTPUT_HASHES], cwd=folders[0]).returncode == 0
    raw = folders[0] / "raw.jsonl"
    raw.write_text(raw.read_text().replace("file 0 row 1", "file 0 row X"))
    with pytest.raises(StepError, match=rf"{raw} does not match the sha256 its shard recorded"):
        merge(_params(data, plan=str(plan_path), shard_dirs=[str(f) for f in folders],
                      out=str(tmp_path / "m")))
    assert not (tmp_path / "m" / "raw.jsonl").exists()


def test_merge_refuses_a_replaced_clip(tmp_path):
    data, plan_path, folders = _sharded(tmp_path)
    first = json.loads((folders[1] / "raw.jsonl").read_text().splitlines()[0])
    clip = folders[1] / first["audio"]
    clip.unlink()  # replaced, as a copy would be: a new file under the old name
    clip.write_bytes(encode(tone(1234), 16000, fmt="FLAC", subtype="PCM_16"))
    with pytest.raises(StepError, match=rf"{clip} does not match the sha256 its shard recorded"):
        merge(_params(data, plan=str(plan_path), shard_dirs=[str(f) for f in folders],
                      out=str(tmp_path / "m")))


def test_a_link_out_of_the_input_folder_is_quarantined_unread(tmp_path):
    data = _dataset(tmp_path / "data", files=1)
    outside = _dataset(tmp_path / "elsewhere", files=1)
    (data / "linked.parquet").symlink_to(outside / "part-0.parquet")
    (data / "linked-folder").symlink_to(outside, target_is_directory=True)
    for shards in (1, 2):
        out = tmp_path / f"out{shards}"
        ingest(_params(data, out=str(out), shards=shards))
        raw, bad, report = read_outputs(out)
        assert len(raw) == 3 and all(r["source"]["file"].endswith("data/part-0.parquet") for r in raw)
        assert sorted(Path(b["source"]["file"]).name for b in bad) == ["linked-folder", "linked.parquet"]
        assert {b["reason"] for b in bad} == {"unsafe_path"} and report["reasons"]["unsafe_path"] == 2
        assert "outside the input folder" in bad[0]["detail"] and "not read" in bad[0]["detail"]
    assert (tmp_path / "out1" / "raw.jsonl").read_bytes() == (tmp_path / "out2" / "raw.jsonl").read_bytes()


def test_an_oversized_csv_field_quarantines_only_its_row(tmp_path):
    data = tmp_path / "data"
    (data / "wavs").mkdir(parents=True)
    for i in range(3):
        (data / "wavs" / f"{i}.wav").write_bytes(encode(tone(300 + 40 * i)))
    write_table(data / "m.csv", ["path", "text", "speaker"], [
        ["wavs/0.wav", "fine", "a"], ["wavs/1.wav", "x" * 131_073, "a"], ["wavs/2.wav", "also fine", "a"]])
    raw, bad, report = (ingest(_params(data, out=str(tmp_path / "out"))), *read_outputs(tmp_path / "out"))[1:]
    assert [r["text"] for r in raw] == ["fine", "also fine"]
    assert [(b["source"]["row"], b["reason"]) for b in bad] == [(1, "malformed_row")]
    assert "line 3" in bad[0]["detail"] and "131072" in bad[0]["detail"]


def test_workers_above_the_cores_are_refused_in_one_paragraph(tmp_path, capsys):
    _dataset(tmp_path / "data", files=1)
    (tmp_path / "none.yaml").write_text("{}\n")
    code = cli.main(["ingest", *TEST_CONSENT_FLAGS,
                     "--params", str(tmp_path / "none.yaml"), "--input", str(tmp_path / "data"),
                     "--out", str(tmp_path / "out"), "--workers", "100000"])
    err = capsys.readouterr().err
    assert code != 0 and "ingest.workers=100000" in err and f"{usable_cores()} cores" in err
    assert "Traceback" not in err and not (tmp_path / "out" / "raw.jsonl").exists()


@pytest.fixture
def tiny_disk(small_disk):
    """A real 1 MiB tmpfs (conftest.small_disk): writes fail with ENOSPC as on a full volume."""
    return small_disk.mount("1m")


def test_a_full_disk_in_ingest_names_the_folder(tmp_path, tiny_disk, capsys):
    (tmp_path / "none.yaml").write_text("{}\n")
    data = tmp_path / "data"
    noise = np.random.default_rng(0).uniform(-0.3, 0.3, (16, 6 * 16000)).astype(np.float32)
    rows = [{"audio": struct(encode(x, 16000)), "text": f"long {i}", "speaker": "s"}
            for i, x in enumerate(noise)]  # ~3 MB of FLAC (noise does not compress): more than the disk holds
    write_parquet(data / "big.parquet", rows)
    out = tiny_disk / "ingest"
    code = cli.main(["ingest", *TEST_CONSENT_FLAGS,
                     "--params", str(tmp_path / "none.yaml"), "--input", str(data),
                     "--out", str(out), "--workers", "1", "--set", "ingest.score_quality=false"])
    err = capsys.readouterr().err
    assert code != 0 and f"writing into {out} failed (No space left on device" in err, err
    assert "Traceback" not in err and not [p for p in out.rglob("*.tmp")]


def test_a_full_disk_in_manifest_names_the_folder(tmp_path, tiny_disk, capsys):
    (tmp_path / "none.yaml").write_text("{}\n")
    data = _dataset(tmp_path / "data", files=1)
    ingest(_params(data, out=str(tmp_path / "ingest")))
    raw = tmp_path / "ingest" / "raw.jsonl"
    rows = [json.loads(line) for line in raw.read_text().splitlines()]
    big = [dict(row, id=f"{row['id']}-{i}") for i in range(4000) for row in rows]  # ~1.5 MB of manifest
    raw.write_text("".join(json.dumps(r) + "\n" for r in big))
    shutil.rmtree(tiny_disk / "m", ignore_errors=True)
    code = cli.main(["manifest", "--params", str(tmp_path / "none.yaml"), "--input", str(raw),
                     "--out", str(tiny_disk / "m")])
    err = capsys.readouterr().err
    assert code != 0 and str(tiny_disk / "m") in err and "No space left on device" in err, err
    assert "Traceback" not in err

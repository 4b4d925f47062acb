"""Sharded ingest: plan → shards → merge gives the bytes a single `voxpipe ingest` gives, with the
duplicates across shards found and every row accounted for. Real parquet files (several row groups),
a CSV manifest and real audio; the sub-steps through the real CLI, shard folders in any order."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from small_sample import TEST_CONSENT, TEST_CONSENT_FLAGS

from tests.test_ingest import HF_AUDIO, encode, good_bytes, read_outputs, struct, tone
from tests.test_ingest_formats import make_ljspeech, wav, write_table
from voxpipe import cli
from voxpipe.data.ingest_shards import ingest_shard, merge, plan
from voxpipe.data.ingest_step import ingest
from voxpipe.errors import StepError
from voxpipe.steps.ingest import IngestParams

OUTPUTS = ("raw.jsonl", "quarantine.jsonl", "report.json")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """Two parquet files of 4 row groups each, and a CSV manifest. Bad rows are spread over the
    files, and rows of the second parquet file and the CSV repeat rows of the first file: with 2 or 3
    shards those duplicates sit in other shards than the rows they repeat."""
    root = tmp_path_factory.mktemp("sharded") / "data"
    clips = [good_bytes(200 + 40 * i) for i in range(12)]
    first = [{"audio": struct(c), "text": f"row {i}", "speaker": "ab"[i % 2]} for i, c in enumerate(clips)]
    first[3] = {"audio": struct(b"not audio at all" * 10), "text": "bad", "speaker": "a"}
    first[7]["text"] = " "
    second = [{"audio": struct(encode(tone(1000 + 30 * i))), "text": f"other {i}", "speaker": "c"}
              for i in range(10)]
    second[2] = dict(first[0])  # a duplicate of a row of the first file
    second[6] = {"audio": struct(encode(tone(seconds=0.05))), "text": "short", "speaker": "c"}
    schema = pa.schema([("audio", HF_AUDIO), ("text", pa.string()), ("speaker", pa.string())])
    root.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(first, schema=schema), root / "a.parquet", row_group_size=3)
    pq.write_table(pa.Table.from_pylist(second, schema=schema), root / "b.parquet", row_group_size=3)
    wav(root / "wavs" / "x.wav", 700)
    (root / "wavs" / "dup.flac").write_bytes(clips[1])
    write_table(root / "c.csv", ["path", "text", "speaker"], [
        ["wavs/x.wav", "from the csv", "d"], ["wavs/dup.flac", "row 1", "a"], ["wavs/none.wav", "gone", "d"]])
    return root


def _single(dataset: Path, out: Path) -> Path:
    ingest(IngestParams(**TEST_CONSENT, input=[str(dataset)], out=str(out), workers=1, max_bad_fraction=1.0,
                        score_quality=False))
    return out


@pytest.fixture(scope="module")
def single(dataset, tmp_path_factory) -> Path:
    return _single(dataset, tmp_path_factory.mktemp("single") / "out")


@pytest.mark.parametrize("shards", [2, 3])
def test_sharded_run_is_byte_identical_to_a_single_run(dataset, single, tmp_path, capsys, shards):
    out = tmp_path / "out"
    (tmp_path / "params.yaml").write_text(f"ingest:\n  shards: {shards}\n  max_bad_fraction: 1.0\n"
                                         "  score_quality: false\n")
    # as `dvc repro` runs it: `voxpipe ingest`, the shard count from params.yaml
    assert cli.main(["ingest", *TEST_CONSENT_FLAGS,
                     "--params", str(tmp_path / "params.yaml"), "--input", str(dataset), "--out",
                     str(out), "--workers", "1"]) == 0
    assert f"in {shards} shards" in capsys.readouterr().out
    for name in OUTPUTS:
        assert (out / name).read_bytes() == (single / name).read_bytes(), name
    raw, bad, report = read_outputs(out)  # rows_in == rows_kept + rows_quarantined
    assert report["rows_in"] == 25 and report["reasons"]["duplicate"] == 2
    assert sorted(p.name for p in out.iterdir()) == ["audio", "data-report.html", "data-report.png",
                                                     "proofread.html", "quarantine.jsonl", "raw.jsonl",
                                                     "report.json", "run.json"]  # the shard folders are gone
    assert all((out / r["audio"]).is_file() for r in raw)
    run = json.loads((out / "run.json").read_text())
    assert sum(s["rows_in"] for s in run["shards"]) == 25 and len(run["shards"]) == shards


def test_duplicates_across_shards_are_quarantined_where_a_single_run_puts_them(dataset, single, tmp_path):
    (tmp_path / "none.yaml").write_text("ingest:\n  score_quality: false\n")  # tones: not speech
    base = ["--params", str(tmp_path / "none.yaml")]
    assert cli.main(["ingest-plan", *TEST_CONSENT_FLAGS, *base, "--input", str(dataset), "--shards", "3",
                     "--out", str(tmp_path / "plan")]) == 0
    plan_file = tmp_path / "plan" / "plan.json"
    shards = json.loads(plan_file.read_text())["shards"]
    assert len(shards) == 3 and sum(s["rows"] for s in shards) == 25
    assert shards[0]["ranges"][0][:2] == [0, 0] and [r[0] for r in shards[-1]["ranges"]][-1] == 2
    # a parquet file is cut inside where the volume asks for it, on row-group boundaries (3 rows a group)
    rows = {0: 12, 1: 10}
    inner = {(r[0], edge) for s in shards for r in s["ranges"] if r[0] in rows for edge in r[1:]
             if 0 < edge < rows[r[0]]}
    assert inner and all(edge % 3 == 0 for _, edge in inner)
    folders = []
    for index in range(3):
        folder = tmp_path / f"shard{index}"
        assert cli.main(["ingest-shard", *base, "--plan", str(plan_file), "--shard", str(index), "--out",
                         str(folder), "--workers", "1"]) == 0
        folders.append(str(folder))
        shard_raw, shard_bad, shard_report = read_outputs(folder)  # each shard balances its own rows
        assert shard_report["shard"]["index"] == index
    # a shard alone cannot know a row repeats one of an earlier shard: the merge finds it
    last_raw = [json.loads(line) for line in (Path(folders[2]) / "raw.jsonl").read_text().splitlines()]
    assert any(r["text_raw"] == "row 1" for r in last_raw)  # (its text is spelled out: "row one")
    # the merge takes the shard folders in any order (KFP's dsl.Collected promises none)
    assert cli.main(["ingest-merge", *base, "--plan", str(plan_file), "--shard-dirs", *reversed(folders),
                     "--out", str(tmp_path / "merged"), "--set", "ingest.max_bad_fraction=1"]) == 0
    for name in OUTPUTS:
        assert (tmp_path / "merged" / name).read_bytes() == (single / name).read_bytes(), name
    _, bad, _ = read_outputs(tmp_path / "merged")
    dups = [(Path(b["source"]["file"]).name, b["source"]["row"]) for b in bad if b["reason"] == "duplicate"]
    assert dups == [("b.parquet", 2), ("c.csv", 1)]


def test_merge_refuses_missing_foreign_or_stale_shards(dataset, tmp_path):
    dataset = Path(shutil.copytree(dataset, tmp_path / "data"))

    def params(**kw) -> IngestParams:
        return IngestParams(**TEST_CONSENT,
                            input=[str(dataset)], workers=1, max_bad_fraction=1.0, score_quality=False,
                            **kw)

    first = plan(params(shards=2, out=str(tmp_path / "p1")))
    other = plan(params(shards=3, out=str(tmp_path / "p2")))
    ingest_shard(params(plan=str(first.path), shard=0, out=str(tmp_path / "s0")))
    ingest_shard(params(plan=str(other.path), shard=1, out=str(tmp_path / "t1")))
    with pytest.raises(StepError, match=r"shards \[1\] of the plan .* are missing"):
        merge(params(plan=str(first.path), shard_dirs=[str(tmp_path / "s0")], out=str(tmp_path / "m")))
    with pytest.raises(StepError, match="t1 is not a shard of the plan"):
        merge(params(plan=str(first.path), shard_dirs=[str(tmp_path / "s0"), str(tmp_path / "t1")],
                     out=str(tmp_path / "m")))
    with pytest.raises(StepError, match=r"ingest.shard=5, but the plan has shards 0..1"):
        ingest_shard(params(plan=str(first.path), shard=5, out=str(tmp_path / "s5")))
    # a shard folder that lost a clip after it finished: named, and no half-merged output is left
    ingest_shard(params(plan=str(first.path), shard=1, out=str(tmp_path / "s1")))
    clip = next((tmp_path / "s0" / "audio").rglob("*.flac"))
    clip.unlink()
    with pytest.raises(StepError, match=rf"s0: cannot take its clip audio/{clip.parent.name}/{clip.name}"):
        merge(params(plan=str(first.path), shard_dirs=[str(tmp_path / "s0"), str(tmp_path / "s1")],
                     out=str(tmp_path / "m")))
    assert not [f for f in (tmp_path / "m").iterdir() if f.is_file()]
    write_table(dataset / "c.csv", ["path", "text", "speaker"], [["wavs/x.wav", "changed", "d"]])
    with pytest.raises(StepError, match=r"c.csv has 1 rows, the plan .* counted 3: the input changed"):
        ingest_shard(params(plan=str(first.path), shard=1, out=str(tmp_path / "s1")))


def test_too_many_bad_rows_is_judged_over_all_shards(tmp_path):
    good = [{"audio": struct(good_bytes(300 + i)), "text": f"ok {i}", "speaker": "s"} for i in range(4)]
    bad = [{"audio": struct(None), "text": f"bad {i}", "speaker": "s"} for i in range(4)]
    schema = pa.schema([("audio", HF_AUDIO), ("text", pa.string()), ("speaker", pa.string())])
    pq.write_table(pa.Table.from_pylist(good, schema=schema), tmp_path / "a.parquet", row_group_size=2)
    pq.write_table(pa.Table.from_pylist(bad, schema=schema), tmp_path / "b.parquet", row_group_size=2)
    # shard 2 is all bad rows; the data set as a whole is within max_bad_fraction=0.5
    ingest(IngestParams(**TEST_CONSENT, input=[str(tmp_path)], out=str(tmp_path / "out"), workers=1, shards=2,
                        score_quality=False))
    with pytest.raises(StepError, match="4 of 8 rows quarantined"):
        ingest(IngestParams(**TEST_CONSENT,
                            input=[str(tmp_path)], out=str(tmp_path / "out"), workers=1, shards=2,
                            max_bad_fraction=0.4, score_quality=False))
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["rows_in"] == 8 and "4 of 8 rows quarantined" in report["error"]


@pytest.mark.slow
def test_a_manifest_is_cut_in_row_blocks_of_equal_audio_volume(tmp_path):
    """One LJSpeech metadata.csv of 200 rows whose clips grow longer down the file: the plan cuts it by
    the sizes of the files named, not the row count, and the sharded run still equals a single one."""
    data = tmp_path / "LJSpeech"
    make_ljspeech(data, 200)
    for i in range(100, 200):  # the second half: clips 4x as long
        wav(data / "wavs" / f"LJ001-{i:04d}.wav", 200 + 50 * (i % 4) + i, seconds=4.0)
    planned = plan(IngestParams(**TEST_CONSENT, input=[str(data)], out=str(tmp_path / "plan"), shards=2))
    shards = json.loads(planned.path.read_text())["shards"]
    assert [s["ranges"] for s in shards] == [[[0, 0, 128]], [[0, 128, 200]]]  # cut on 64-row blocks
    assert 0.5 < shards[0]["audio_bytes"] / shards[1]["audio_bytes"] < 2
    single = _single(data, tmp_path / "single")
    ingest(IngestParams(**TEST_CONSENT,
                        input=[str(data)], out=str(tmp_path / "out"), workers=1, max_bad_fraction=1.0,
                        shards=2, score_quality=False))
    for name in OUTPUTS:
        assert (tmp_path / "out" / name).read_bytes() == (single / name).read_bytes(), name

import json
import os
import subprocess
import sys
from collections import Counter
from hashlib import sha256
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from voxpipe.data.manifest import build_manifest
from voxpipe.errors import StepError
from voxpipe.steps.manifest import ManifestParams

SR = 16000


def write_raw(folder: Path, speakers: dict[str, int], prefix: str = "") -> Path:
    """An ingest-style folder: real 16 kHz mono FLAC clips under audio/ and raw.jsonl next to them."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for s, count in speakers.items():
        for i in range(count):
            cid = f"{prefix}{s}-{i:03d}"
            seconds = 0.4 + 0.05 * (i % 7)
            t = np.arange(int(seconds * SR)) / SR
            rel = f"audio/{cid}.flac"
            (folder / "audio").mkdir(exist_ok=True)
            sf.write(folder / rel, 0.3 * np.sin(2 * np.pi * (150 + 10 * i) * t), SR, subtype="PCM_16")
            lines.append({"id": cid, "audio": rel, "text": f"clip {cid}", "speaker": s, "duration": seconds,
                          "source": {"file": "x.parquet", "row": i}})
    (folder / "raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return folder / "raw.jsonl"


def run(inputs: list[Path], out: Path, **kw) -> dict:
    result = build_manifest(ManifestParams(input=[str(p) for p in inputs], out=str(out), **kw))
    assert result.summary().startswith("manifest:")
    return result.report


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """~200 rows over speakers of very different sizes, split across two ingest folders."""
    root = tmp_path_factory.mktemp("corpus")
    a = write_raw(root / "ingest_a", {"alice": 90, "bob": 40, "solo": 1})
    b = write_raw(root / "ingest_b", {"carol": 55, "dave": 4, "erin": 3, "bob": 10}, prefix="b-")
    out = root / "deep" / "manifest"
    report = run([a, b], out)
    return {"root": root, "inputs": [a, b], "out": out, "report": report,
            "train": read(out / "train.jsonl"), "val": read(out / "val.jsonl")}


def test_split_invariants(corpus):
    train, val = corpus["train"], corpus["val"]
    train_ids, val_ids = {r["id"] for r in train}, {r["id"] for r in val}
    assert not train_ids & val_ids
    assert len(train_ids | val_ids) == len(train) + len(val) == 203
    assert len(val) >= 2
    assert 0.02 <= len(val) / 203 <= 0.12  # 5 % by hash, plus one row for each speaker that lacked one
    val_speakers = Counter(r["speaker"] for r in val)
    for s in ("alice", "bob", "carol", "dave"):  # >= min_speaker_rows_for_val (4) rows each
        assert val_speakers[s] >= 1, s
    assert [r["id"] for r in train] == sorted(train_ids) and [r["id"] for r in val] == sorted(val_ids)
    for r in train + val:
        assert set(r) <= {"id", "speaker", "audio", "text", "duration", "ref_audio", "ref_duration"}


def test_val_fraction_is_honoured_on_larger_share(tmp_path):
    raw = write_raw(tmp_path / "ingest", {"a": 120, "b": 80})
    report = run([raw], tmp_path / "out", val_fraction=0.3)
    assert 0.2 <= report["splits"]["val"]["rows"] / 200 <= 0.4


def test_speaker_and_minimum_val_guarantees(tmp_path):
    raw = write_raw(tmp_path / "ingest", {"a": 10, "b": 4, "c": 3})
    ids = [json.loads(line)["id"] for line in raw.read_text().splitlines()]

    def first_by_hash(prefix):
        mine = [i for i in ids if i.startswith(prefix)]
        return min(mine, key=lambda i: sha256(f"split:{i}".encode()).digest())

    run([raw], tmp_path / "o1", val_fraction=0.0001, min_val=0)
    val = [r["id"] for r in read(tmp_path / "o1" / "val.jsonl")]
    assert val == [first_by_hash("a-"), first_by_hash("b-")]  # none for c: too few rows
    run([raw], tmp_path / "o2", val_fraction=0.0001, min_val=5)
    assert len(read(tmp_path / "o2" / "val.jsonl")) == 5
    run([raw], tmp_path / "o3", val_fraction=0.0)  # no val fraction: no held-out set at all
    assert read(tmp_path / "o3" / "val.jsonl") == [] and len(read(tmp_path / "o3" / "train.jsonl")) == 17


def test_paths_resolve_from_the_manifest_folder(corpus):
    out = corpus["out"]
    for r in corpus["train"] + corpus["val"]:
        assert not os.path.isabs(r["audio"]) and r["audio"].startswith("../../ingest_")
        assert (out / r["audio"]).is_file()
        if "ref_audio" in r:
            assert (out / r["ref_audio"]).is_file()


def test_reference_audio_is_another_training_clip_of_the_same_speaker(corpus):
    train, val = corpus["train"], corpus["val"]
    speaker_of = {r["audio"]: r["speaker"] for r in train}
    duration_of = {r["audio"]: r["duration"] for r in train}
    refs = [r for r in train if "ref_audio" in r]
    assert abs(len(refs) / len(train) - 0.3) < 0.01
    assert corpus["report"]["splits"]["train"]["ref_rows"] == len(refs)
    for r in refs + val:
        assert r["ref_audio"] != r["audio"]
        assert speaker_of[r["ref_audio"]] == r["speaker"]  # a training clip, same speaker
        assert r["ref_duration"] == duration_of[r["ref_audio"]]
    assert all(r["speaker"] != "solo" or "ref_audio" not in r for r in train)
    assert len({r["ref_audio"] for r in refs}) > len(refs) // 2  # spread over clips, not one favourite


def test_output_is_deterministic_and_independent_of_input_order(corpus, tmp_path):
    a, b = corpus["inputs"]
    again = corpus["root"] / "deep" / "again"
    run([b, a], again)
    for name in ("train.jsonl", "val.jsonl"):
        assert (again / name).read_bytes() == (corpus["out"] / name).read_bytes()
    reseeded = corpus["root"] / "deep" / "reseeded"
    run([a, b], reseeded, seed=1)
    assert read(reseeded / "train.jsonl") != corpus["train"]  # the seed moves references only
    assert {r["id"] for r in read(reseeded / "val.jsonl")} == {r["id"] for r in corpus["val"]}


def test_report_counts_rows_and_hours_per_split_and_speaker(corpus):
    report = corpus["report"]
    splits = report["splits"]
    assert report["rows_in"] == splits["train"]["rows"] + splits["val"]["rows"] == 203
    assert report["inputs"] == [str(p) for p in corpus["inputs"]]
    assert set(report["speakers"]) == {"alice", "bob", "carol", "dave", "erin", "solo"}
    assert report["speakers"]["bob"]["train"]["rows"] + report["speakers"]["bob"]["val"]["rows"] == 50
    for split in ("train", "val"):
        rows = corpus[split]
        assert splits[split]["hours"] == pytest.approx(sum(r["duration"] for r in rows) / 3600, abs=1e-5)
        assert sum(s[split]["rows"] for s in report["speakers"].values()) == len(rows)
    saved = json.loads((corpus["out"] / "report.json").read_text())
    assert saved["splits"] == splits and "versions" in saved


def test_duplicate_ids_across_inputs_name_both_files(tmp_path):
    a = write_raw(tmp_path / "a", {"x": 3})
    b = write_raw(tmp_path / "b", {"x": 2})
    with pytest.raises(StepError, match=r"duplicate id 'x-000'.*a/raw\.jsonl:1 and .*b/raw\.jsonl:1"):
        run([a, b], tmp_path / "out")


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "no rows"),
        ('{"id": "a"}\n', r"raw\.jsonl:1: missing field\(s\) audio, text, speaker, duration"),
        ("not json\n", r"raw\.jsonl:1: not valid JSON"),
        ('{"id": "a", "audio": "a.flac", "text": "t", "speaker": "s", "duration": -1}\n', "duration"),
    ],
)
def test_bad_input_is_a_run_level_error(tmp_path, content, message):
    (tmp_path / "raw.jsonl").write_text(content)
    with pytest.raises(StepError, match=message):
        run([tmp_path / "raw.jsonl"], tmp_path / "out")


def test_missing_input_file_is_named(tmp_path):
    with pytest.raises(StepError, match="nowhere does not exist"):
        run([tmp_path / "nowhere"], tmp_path / "out")


def test_too_few_rows_for_a_training_split(tmp_path):
    raw = write_raw(tmp_path / "ingest", {"x": 2})
    with pytest.raises(StepError, match="all 2 rows went to val"):
        run([raw], tmp_path / "out")


def test_cli_builds_a_manifest_that_validates(tmp_path):
    a = write_raw(tmp_path / "a", {"p": 12, "q": 8})
    b = write_raw(tmp_path / "b", {"p": 5}, prefix="b-")
    voxpipe = str(Path(sys.executable).with_name("voxpipe"))
    out = tmp_path / "m"
    for hash_seed, dest in (("1", out), ("2", tmp_path / "m2")):
        # an ingest folder stands for the raw.jsonl inside it
        done = subprocess.run([voxpipe, "manifest", "--input", str(a), str(b.parent), "--out", str(dest),
                               "--ref-fraction", "0.5"], cwd=tmp_path, capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": hash_seed})
        assert done.returncode == 0, done.stderr
        assert "manifest: 25 rows from 2 input(s)" in done.stdout
    assert (out / "train.jsonl").read_bytes() == (tmp_path / "m2" / "train.jsonl").read_bytes()
    train = read(out / "train.jsonl")
    assert abs(sum("ref_audio" in r for r in train) / len(train) - 0.5) < 0.05
    for name in ("train.jsonl", "val.jsonl"):
        done = subprocess.run([voxpipe, "validate", "--manifest", str(out / name)], cwd=tmp_path,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "no problems → usable" in done.stdout
    done = subprocess.run([voxpipe, "manifest", "--input", str(a), str(a), "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 1 and "duplicate id" in done.stderr


def test_the_raw_text_and_the_language_travel_with_each_row(tmp_path):
    raw = write_raw(tmp_path / "ingest", {"alice": 6, "bob": 6})
    rows = read(raw)
    for i, row in enumerate(rows):
        row.update(text_raw=f"clip {i} of $12.50", language="zh" if i % 2 else "en")
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run([raw], tmp_path / "manifest")
    by_id = {r["id"]: r for r in rows}
    written = read(tmp_path / "manifest" / "train.jsonl") + read(tmp_path / "manifest" / "val.jsonl")
    assert len(written) == len(rows)
    for row in written:
        source = by_id[row["id"]]
        assert (row["text_raw"], row["language"]) == (source["text_raw"], source["language"])

"""`voxpipe ingest` on the shapes voice data comes in besides parquet: an LJSpeech folder, and CSV /
TSV / JSONL manifests of audio paths. Real WAV files, the real CLI; bad records are quarantined with
their line, and every row is accounted for exactly as for parquet."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import soundfile as sf
from small_sample import TEST_CONSENT_FLAGS

from tests.test_ingest import read_outputs, tone
from voxpipe import cli


def wav(path: Path, freq: float, seconds: float = 1.0, sr: int = 22050) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, tone(freq, seconds, sr), sr, subtype="PCM_16")
    return path


def ingest_cli(tmp_path: Path, *args: str) -> int:
    # tones are not speech: DNSMOS rightly scores them low_quality (tests/test_ingest_conditioning.py)
    (tmp_path / "none.yaml").write_text("ingest:\n  score_quality: false\n")
    return cli.main(["ingest", "--params", str(tmp_path / "none.yaml"), "--out", str(tmp_path / "out"),
                     "--workers", "1", "--max-bad-fraction", "1", *TEST_CONSENT_FLAGS, *args])


def make_ljspeech(folder: Path, n: int = 4) -> list[str]:
    """An LJSpeech-layout folder: `metadata.csv` (id|text|normalized_text) and wavs/<id>.wav."""
    lines = []
    for i in range(n):
        wav(folder / "wavs" / f"LJ001-{i:04d}.wav", 200 + 50 * i)
        spoken = "one two three four".split()[i % 4]
        lines.append(f'LJ001-{i:04d}|Chapter {i}, said "Dr. Smith".|Chapter {spoken}, said "Doctor Smith".')
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return lines


def test_ljspeech_folder_is_one_speaker_named_after_it_with_spoken_text_and_bad_lines_quarantined(
        tmp_path, capsys, caplog):
    data = tmp_path / "LJSpeech-1.1"
    make_ljspeech(data, 3)
    with open(data / "metadata.csv", "a", encoding="utf-8") as f:
        f.write("\n")  # a blank line is not a row
        f.write("LJ001-0009|the wav file is missing|the wav file is missing\n")
        f.write("just one field\n")
        f.write("LJ001-0001|same clip and text as an earlier row|Chapter two, said \"Doctor Smith\".\n")
    assert ingest_cli(tmp_path, "--input", str(data)) == 0
    raw, bad, report = read_outputs(tmp_path / "out")
    assert [r["text"] for r in raw] == [f'Chapter {w}, said "Doctor Smith".' for w in ("one", "two", "three")]
    assert {r["speaker"] for r in raw} == {"LJSpeech-1.1"} and report["speakers"] == {"LJSpeech-1.1": 3}
    meta = (data / "metadata.csv").as_posix()
    assert [(b["source"], b["reason"]) for b in bad] == [
        ({"file": meta, "row": 3}, "missing_file"),
        ({"file": meta, "row": 4}, "malformed_row"),
        ({"file": meta, "row": 5}, "duplicate"),
    ]
    assert "line 6 is not `id|text|normalized_text`" in bad[1]["detail"]
    assert report["rows_in"] == 6 and report["notices"] == [
        f"{meta}: the LJSpeech layout has no speaker: its 6 rows are one speaker, 'LJSpeech-1.1', named "
        "after the source"
    ]
    assert report["notices"][0] in caplog.text  # logged where the user looks, and in the summary line
    assert "1 speakers: LJSpeech-1.1)" in (out := capsys.readouterr().out) and "1 notice (report.json)" in out
    info = sf.info(tmp_path / "out" / raw[0]["audio"])
    assert (info.format, info.samplerate, info.channels) == ("FLAC", 16000, 1)
    # the metadata.csv given alone is the same data set
    first = (tmp_path / "out" / "raw.jsonl").read_bytes()
    assert ingest_cli(tmp_path, "--input", meta) == 0
    assert (tmp_path / "out" / "raw.jsonl").read_bytes() == first


def write_table(path: Path, header: list[str], rows: list[list[str]], delimiter: str = ",") -> Path:
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, delimiter=delimiter)
        w.writerow(header)
        w.writerows(rows)
    return path


def test_csv_tsv_and_jsonl_manifests_share_quarantine_and_content_addressing(tmp_path):
    data = tmp_path / "set"
    for name, freq in (("a", 300), ("b", 400), ("c", 500)):
        wav(data / "clips" / f"{name}.wav", freq)
    write_table(data / "one.csv", ["path", "text", "speaker"], [
        ["clips/a.wav", "alpha, with a comma", "anna"],
        ["clips/none.wav", "missing", "anna"],
        ["/etc/passwd", "absolute", "anna"],
        ["clips/b.wav", "", "bert"],
    ])
    with open(data / "one.csv", "a", encoding="utf-8") as f:
        f.write("clips/b.wav,too,many,fields\n")
    write_table(data / "two.tsv", ["audio", "text", "speaker"], [["clips/b.wav", "bravo", "bert"]],
                delimiter="\t")
    (data / "three.jsonl").write_text("\n".join([
        json.dumps({"audio": "clips/c.wav", "text": "charlie", "speaker": 7}),
        "{not json",
        json.dumps(["a", "list"]),
        json.dumps({"audio": "clips/a.wav", "text": "alpha, with a comma", "speaker": "anna"}),
        json.dumps({"audio": "clips/a.wav", "text": 3, "speaker": "anna"}),
    ]) + "\n")
    assert ingest_cli(tmp_path, "--input", str(data)) == 0
    raw, bad, report = read_outputs(tmp_path / "out")
    assert [(r["text"], r["speaker"]) for r in raw] == [
        ("alpha, with a comma", "anna"), ("charlie", "7"), ("bravo", "bert")]
    files = [(data / n).as_posix() for n in ("one.csv", "three.jsonl", "two.tsv")]
    assert [(b["source"]["file"], b["source"]["row"], b["reason"]) for b in bad] == [
        (files[0], 1, "missing_file"), (files[0], 2, "unsafe_path"), (files[0], 3, "missing_text"),
        (files[0], 4, "malformed_row"),
        (files[1], 1, "malformed_row"), (files[1], 2, "malformed_row"), (files[1], 3, "duplicate"),
        (files[1], 4, "malformed_row"),
    ]
    assert "line 6 has 4 fields, the header has 3" in bad[3]["detail"]
    assert "line 2 is not valid JSON" in bad[4]["detail"] and "JSON list, not an object" in bad[5]["detail"]
    assert "text field 'text' is a JSON int" in bad[7]["detail"]
    assert report["reasons"]["malformed_row"] == 4 and report["rows_in"] == 11
    # content addressing: the same samples give the same file as from a parquet row
    clip, _ = sf.read(tmp_path / "out" / raw[0]["audio"], dtype="int16")
    assert raw[0]["audio"].endswith(".flac") and clip.size == 16000 and np.abs(clip).max() > 2000  # -23 LUFS
    assert report["notices"] == [f"{files[0]}: no audio column 'audio'; read audio paths from 'path'"]


def test_manifest_without_a_text_column_is_refused_naming_the_columns(tmp_path, capsys):
    f = write_table(tmp_path / "m.csv", ["file", "transcript"], [["a.wav", "hi"]])
    assert ingest_cli(tmp_path, "--input", str(f)) == 1
    err = capsys.readouterr().err
    assert "no audio column 'audio'; the file has columns: file, transcript" in err
    assert ingest_cli(tmp_path, "--input", str(f), "--audio-column", "file") == 1
    assert "no text column 'text'" in capsys.readouterr().err
    wav(tmp_path / "a.wav", 300)
    assert ingest_cli(tmp_path, "--input", str(f), "--audio-column", "file", "--text-column", "transcript") \
        == 0
    raw, _, report = read_outputs(tmp_path / "out")
    assert [(r["text"], r["speaker"]) for r in raw] == [("hi", tmp_path.name)]  # m.csv's folder
    assert "no speaker column 'speaker'" in report["notices"][0]


def test_unreadable_manifest_is_a_run_level_error(tmp_path, capsys):
    (tmp_path / "m.jsonl").write_bytes(b'{"audio": "a.wav", "text": "\xff\xfe"}\n')
    assert ingest_cli(tmp_path, "--input", str(tmp_path / "m.jsonl")) == 1
    assert f"{tmp_path / 'm.jsonl'}:1: not UTF-8 text" in capsys.readouterr().err
    (tmp_path / "m.csv").write_bytes(b"audio,text\na.wav,caf\xe9\n")
    assert ingest_cli(tmp_path, "--input", str(tmp_path / "m.csv")) == 1
    assert f"{tmp_path / 'm.csv'}: unreadable csv manifest" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("x")
    assert ingest_cli(tmp_path, "--input", str(tmp_path / "notes.txt")) == 1
    assert "not a .parquet, .csv, .tsv or .jsonl file" in capsys.readouterr().err

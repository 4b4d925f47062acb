"""`voxpipe ingest` on real encoded audio in real parquet files: every bad-input kind, formats and
rates, column layouts, run-level errors through the CLI, idempotency, accounting, the shipped sample."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf
from hypothesis import given, settings
from hypothesis import strategies as st
from small_sample import TEST_CONSENT, TEST_CONSENT_FLAGS, write_small_sample

from voxpipe import cli
from voxpipe.data.ingest_row import REASONS, normalize_text
from voxpipe.data.ingest_step import ingest
from voxpipe.steps.ingest import IngestParams

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"
HF_AUDIO = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def tone(freq: float = 440.0, seconds: float = 1.0, sr: int = 22050, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(round(seconds * sr))) / sr
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def encode(x: np.ndarray, sr: int = 22050, fmt: str = "WAV", subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, sr, format=fmt, subtype=subtype)
    return buf.getvalue()


def good_bytes(freq: float = 440.0) -> bytes:
    return encode(tone(freq), fmt="FLAC", subtype="PCM_16")


def write_parquet(path: Path, rows: list[dict], audio_type: pa.DataType = HF_AUDIO, audio: str = "audio",
                  text: str = "text", speaker: str | None = "speaker") -> Path:
    """rows: dicts with keys audio/text/speaker (speaker optional); column names are configurable."""
    fields = [(audio, audio_type), (text, pa.string())] + ([(speaker, pa.string())] if speaker else [])
    data = {audio: [r["audio"] for r in rows], text: [r["text"] for r in rows]}
    if speaker:
        data[speaker] = [r.get("speaker", "spk") for r in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(data, schema=pa.schema(fields)), path)
    return path


def struct(data: bytes | None = None, path: str | None = None) -> dict:
    return {"bytes": data, "path": path}


def run(tmp_path: Path, inputs: list[Path], **kw) -> tuple[list[dict], list[dict], dict]:
    # tones are not speech: DNSMOS rightly scores them low_quality (tests/test_ingest_conditioning.py)
    kw = {"workers": 1, "max_bad_fraction": 1.0, "score_quality": False, **kw}
    out = tmp_path / "out"
    ingest(IngestParams(**TEST_CONSENT, input=[str(i) for i in inputs], out=str(out), **kw))
    return read_outputs(out)


def read_outputs(out: Path) -> tuple[list[dict], list[dict], dict]:
    raw = [json.loads(line) for line in (out / "raw.jsonl").read_text().splitlines()]
    bad = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    report = json.loads((out / "report.json").read_text())
    assert report["rows_in"] == report["rows_kept"] + report["rows_quarantined"] == len(raw) + len(bad)
    return raw, bad, report


def peak_hz(x: np.ndarray, sr: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / sr)[spectrum.argmax()])


# ---- one test per bad-input kind -------------------------------------------------------------

def _nan_wav() -> bytes:
    x = tone()
    x[500] = np.nan
    return encode(x, subtype="FLOAT")


def _inf_wav() -> bytes:
    x = tone()
    x[500] = np.inf
    return encode(x, subtype="FLOAT")


def _good_as_wav() -> bytes:
    """The good row's exact 16-bit samples, in a WAV container instead of FLAC."""
    samples, sr = sf.read(io.BytesIO(good_bytes()), dtype="int16")
    return encode(samples, sr, subtype="PCM_16")


def _row(audio: bytes | None, text: str | None = "hi", **extra) -> dict:
    return {"audio": struct(audio), "text": text, **extra}


BAD_ROWS = {
    "not_audio": (_row(b"this is plain text, not audio" * 20), "undecodable", {}),
    "truncated_flac": (_row(good_bytes()[:60]), "undecodable", {}),
    "wav_header_only": (_row(b"RIFF\x24\x00\x00\x00WAVEfmt "), "undecodable", {}),
    "empty_bytes": (_row(b""), "empty_audio", {}),
    "null_struct": ({"audio": None, "text": "hi"}, "no_audio", {}),
    "null_bytes_and_path": (_row(None), "no_audio", {}),
    "null_text": (_row(good_bytes(550), None), "missing_text", {}),
    "blank_text": (_row(good_bytes(550), " \t\n "), "missing_text", {}),
    "null_speaker": (_row(good_bytes(550), speaker=None), "missing_speaker", {}),
    "text_too_long": (_row(good_bytes(550), "a long line " * 10), "text_too_long", {"max_text_chars": 100}),
    "nan_samples": (_row(_nan_wav()), "non_finite", {}),
    "inf_samples": (_row(_inf_wav()), "non_finite", {}),
    "digital_silence": (_row(encode(np.zeros(22050, np.float32))), "silent", {}),
    "below_threshold": (_row(encode(tone(amp=5e-4), subtype="FLOAT")), "silent", {}),
    "too_short": (_row(encode(tone(seconds=0.1))), "too_short", {}),
    "zero_frames": (_row(encode(np.zeros(0, np.float32))), "too_short", {}),
    "zero_frames_no_minimum": (_row(encode(np.zeros(0, np.float32))), "silent", {"min_seconds": 0.0}),
    "too_long": (_row(encode(tone(seconds=2.5))), "too_long", {"max_seconds": 2.0}),
    "duplicate_same_bytes": (_row(good_bytes(), "the good row"), "duplicate", {}),
    # the same samples in another container, text differing only in whitespace: still the same row
    "duplicate_other_format": (_row(_good_as_wav(), "  the   good row "), "duplicate", {}),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_bad_row_is_quarantined_with_reason(tmp_path, case):
    bad_row, reason, params = BAD_ROWS[case]
    good = {"audio": struct(good_bytes()), "text": "the good row"}
    f = write_parquet(tmp_path / "data" / "d.parquet", [good, bad_row])
    raw, bad, report = run(tmp_path, [f], **params)
    assert [r["source"] for r in raw] == [{"file": f.as_posix(), "row": 0}]
    assert len(bad) == 1
    assert bad[0]["source"] == {"file": f.as_posix(), "row": 1}
    assert bad[0]["reason"] == reason and bad[0]["detail"]
    assert report["reasons"][reason] == 1 and sum(report["reasons"].values()) == 1
    assert "0x" not in bad[0]["detail"]  # no object addresses: details are reproducible


def test_a_300000_character_transcript_is_quarantined_before_it_is_normalized(tmp_path, monkeypatch):
    """wetext's time grows faster than linearly: such a row would stall ingest for hours. It is refused
    by its length, naming the limit, and its text never reaches the normalizer."""
    from voxpipe.data import text_norm

    seen: list[int] = []
    real = text_norm.normalize_for_speech
    monkeypatch.setattr(text_norm, "normalize_for_speech", lambda t, *a: seen.append(len(t)) or real(t, *a))
    huge = "It costs $12.50 on 3/5/2024. " * 10_345  # 300,005 characters
    rows = [{"audio": struct(good_bytes()), "text": "the good row"}, _row(good_bytes(550), huge)]
    raw, bad, report = run(tmp_path, [write_parquet(tmp_path / "d.parquet", rows)])
    assert [r["text"] for r in raw] == ["the good row"] and seen == [len("the good row")]
    assert bad[0]["reason"] == "text_too_long" and report["reasons"]["text_too_long"] == 1
    assert "300004 characters" in bad[0]["detail"] and "max_text_chars=2000" in bad[0]["detail"]
    assert "ingest.max_text_chars" in bad[0]["detail"]  # the way out


def test_path_rows_resolve_inside_the_dataset_and_unsafe_paths_are_never_used(tmp_path):
    data = tmp_path / "data"
    (data / "wavs").mkdir(parents=True)
    (data / "wavs" / "a.wav").write_bytes(encode(tone(300)))
    (data / "wavs" / "empty.wav").write_bytes(b"")
    outside = tmp_path / "outside.wav"  # a perfectly good file, but outside the dataset folder
    outside.write_bytes(encode(tone(600)))
    (data / "parts").mkdir()
    (data / "parts" / "link.wav").symlink_to(outside)
    rows = [
        {"audio": struct(None, "../wavs/a.wav"), "text": "sibling folder, still inside the dataset"},
        {"audio": struct(None, str(outside)), "text": "absolute"},
        {"audio": struct(None, "../../outside.wav"), "text": "escapes with .."},
        {"audio": struct(None, "link.wav"), "text": "symlink out of the dataset"},
        {"audio": struct(None, "../wavs/nope.wav"), "text": "missing"},
        {"audio": struct(None, "../wavs/empty.wav"), "text": "empty file"},
        {"audio": struct(b"", "../wavs/a.wav"), "text": "empty bytes win over a path"},
    ]
    f = write_parquet(data / "parts" / "p.parquet", rows)
    raw, bad, _ = run(tmp_path, [data])
    assert [r["text"] for r in raw] == ["sibling folder, still inside the dataset"]
    assert [(b["source"]["row"], b["reason"]) for b in bad] == [
        (1, "unsafe_path"), (2, "unsafe_path"), (3, "unsafe_path"),
        (4, "missing_file"), (5, "empty_audio"), (6, "empty_audio"),
    ]
    assert all(b["source"]["file"] == f.as_posix() for b in bad)
    # given the file alone, its own folder is the dataset: the sibling folder is now outside it
    raw, bad, _ = run(tmp_path, [f])
    assert raw == [] and bad[0]["reason"] == "unsafe_path"


# ---- formats, rates, channels ----------------------------------------------------------------

@pytest.mark.parametrize(
    "fmt, subtype, sr",
    [
        ("WAV", "PCM_U8", 22050),
        ("WAV", "PCM_16", 44100),
        ("WAV", "PCM_24", 48000),
        ("WAV", "PCM_32", 16000),
        ("WAV", "FLOAT", 48000),
        ("WAV", "DOUBLE", 22050),
        ("FLAC", "PCM_16", 44100),
        ("FLAC", "PCM_24", 22050),
        ("OGG", "VORBIS", 48000),
        ("MP3", "MPEG_LAYER_III", 44100),
    ],
)
def test_formats_and_rates_become_16k_mono_flac_with_pitch_intact(tmp_path, fmt, subtype, sr):
    seconds = 1.5
    audio = encode(tone(440, seconds, sr), sr, fmt, subtype)
    f = write_parquet(tmp_path / "d.parquet", [_row(audio, "a tone")])
    raw, bad, _ = run(tmp_path, [f], normalize_loudness=False)  # the level as it came, to compare
    assert bad == [] and len(raw) == 1
    out = tmp_path / "out" / raw[0]["audio"]
    info = sf.info(out)
    assert (info.format, info.subtype, info.samplerate, info.channels) == ("FLAC", "PCM_16", 16000, 1)
    x, _ = sf.read(out, dtype="float32")
    tolerance = 0.06 if fmt == "MP3" else 0.002  # MP3 frames round the length
    assert abs(raw[0]["duration"] - seconds) <= tolerance
    assert raw[0]["duration"] == pytest.approx(len(x) / 16000, abs=1e-4)
    assert abs(peak_hz(x, 16000) - 440) < 2
    assert np.abs(x).max() == pytest.approx(0.5, abs=0.03)
    assert raw[0]["audio"] == f"audio/{out.stem[:2]}/{out.name}"


def test_stereo_is_downmixed_not_just_the_left_channel(tmp_path):
    x = tone(440, 1.0, 48000)
    same = encode(np.stack([x, x], axis=1), 48000)
    opposite = encode(np.stack([x, -x], axis=1), 48000, subtype="FLOAT")  # mean of the channels is silence
    f = write_parquet(tmp_path / "d.parquet", [{"audio": struct(same), "text": "same"},
                                               {"audio": struct(opposite), "text": "opposite"}])
    raw, bad, _ = run(tmp_path, [f], normalize_loudness=False)  # the level as it came, to compare
    mono, _ = sf.read(tmp_path / "out" / raw[0]["audio"])
    assert np.abs(mono).max() == pytest.approx(0.5, abs=0.01)
    assert [b["reason"] for b in bad] == ["silent"]


# ---- column layouts --------------------------------------------------------------------------

def test_plain_binary_column_with_custom_names(tmp_path):
    rows = [{"audio": good_bytes(), "text": " Cafe\u0301   au\tlait \n", "speaker": "anna"},
            {"audio": None, "text": "null audio"}, {"audio": b"", "text": "empty"}]
    f = write_parquet(tmp_path / "d.parquet", rows, audio_type=pa.binary(), audio="wav", text="sentence",
                      speaker="client_id")
    raw, bad, _ = run(tmp_path, [f], audio_column="wav", text_column="sentence", speaker_column="client_id")
    assert [(r["text"], r["speaker"]) for r in raw] == [("Caf\u00e9 au lait", "anna")]
    assert [b["reason"] for b in bad] == ["no_audio", "empty_audio"]


def test_path_string_column_relative_to_the_parquet_folder(tmp_path):
    (tmp_path / "set" / "clips").mkdir(parents=True)
    (tmp_path / "set" / "clips" / "a.ogg").write_bytes(encode(tone(500), fmt="OGG", subtype="VORBIS"))
    rows = [{"audio": "clips/a.ogg", "text": "ok"}, {"audio": "clips/none.ogg", "text": "missing"},
            {"audio": "/etc/passwd", "text": "absolute"}, {"audio": None, "text": "null"}]
    f = write_parquet(tmp_path / "set" / "d.parquet", rows, audio_type=pa.string(), audio="path")
    raw, bad, _ = run(tmp_path, [f], audio_column="path")
    assert [r["text"] for r in raw] == ["ok"]
    assert [b["reason"] for b in bad] == ["missing_file", "unsafe_path", "no_audio"]


def test_a_set_without_speaker_column_is_one_speaker_named_after_it_with_a_notice(tmp_path, caplog):
    f = write_parquet(tmp_path / "d.parquet", [{"audio": struct(good_bytes()), "text": "x"}], speaker=None)
    raw, _, report = run(tmp_path, [f])
    folder = tmp_path.name  # the folder that holds d.parquet
    assert [r["speaker"] for r in raw] == [folder] and report["speakers"] == {folder: 1}
    notice = (f"{f}: no speaker column 'speaker' (if it has another name: --speaker-column NAME): its 1 rows "
              f"are one speaker, {folder!r}, named after the source")
    assert report["notices"] == [notice] and notice in caplog.text
    raw, _, report = run(tmp_path, [f], speaker_column="")
    assert [r["speaker"] for r in raw] == [folder] and "speaker_column is empty" in report["notices"][0]


def test_two_sets_without_speakers_are_two_speakers_each_named_after_its_source(tmp_path):
    """An English and a Mandarin set, neither with a speaker column, ingested together: two voices, not one
    speaker trained as both; the shards of one set stay one speaker. Each is named after its folder."""
    def row(hz: int) -> list[dict]:
        return [{"audio": struct(good_bytes(hz)), "text": f"clip at {hz}"}]

    english = write_parquet(tmp_path / "english" / "clips.parquet", row(500), speaker=None)
    shards = [write_parquet(tmp_path / "mandarin" / f"train-0000{i}-of-00002.parquet", row(600 + 100 * i),
                            speaker=None) for i in range(2)]
    raw, _, report = run(tmp_path, [english, tmp_path / "mandarin"])
    assert report["speakers"] == {"english": 1, "mandarin": 2}
    assert [n.split(": its ")[1] for n in report["notices"]] == [
        "1 rows are one speaker, 'english', named after the source",
        *["1 rows are one speaker, 'mandarin', named after the source"] * 2]
    assert {r["speaker"] for r in raw} == {"english", "mandarin"} and len(shards) == 2
    for inputs in ([tmp_path / "english", tmp_path / "mandarin"], [tmp_path]):  # or their parent
        assert run(tmp_path, inputs)[2]["speakers"] == {"english": 1, "mandarin": 2}


def test_same_audio_with_other_text_is_not_a_duplicate(tmp_path):
    rows = [{"audio": struct(good_bytes()), "text": "one"}, {"audio": struct(good_bytes()), "text": "two"}]
    raw, bad, _ = run(tmp_path, [write_parquet(tmp_path / "d.parquet", rows)])
    assert bad == [] and raw[0]["audio"] == raw[1]["audio"] and raw[0]["id"] != raw[1]["id"]


def test_folders_are_read_recursively_in_sorted_order(tmp_path):
    write_parquet(tmp_path / "ds" / "b" / "x.parquet", [{"audio": struct(good_bytes(300)), "text": "b/x"}])
    write_parquet(tmp_path / "ds" / "a.parquet", [{"audio": struct(good_bytes(400)), "text": "a"}])
    write_parquet(tmp_path / "ds" / "b" / "a.parquet", [{"audio": struct(good_bytes(500)), "text": "b/a"}])
    (tmp_path / "ds" / "notes.txt").write_text("not parquet")
    raw, _, _ = run(tmp_path, [tmp_path / "ds"])
    assert [r["text"] for r in raw] == ["a", "b/a", "b/x"]


def test_normalize_text():
    assert normalize_text("\u00a0 A\u030a  b\n\tc  ") == "\u00c5 b c"


# ---- run-level errors through the real CLI ---------------------------------------------------

def _cli(tmp_path: Path, *args: str) -> int:
    out = str(tmp_path / "out")
    return cli.main(["ingest", *TEST_CONSENT_FLAGS,
                     "--params", str(tmp_path / "none.yaml"), "--out", out, *args])


@pytest.fixture
def no_params_file(tmp_path):
    # tones are not speech: DNSMOS rightly scores them low_quality (tests/test_ingest_conditioning.py)
    (tmp_path / "none.yaml").write_text("ingest:\n  score_quality: false\n")


@pytest.mark.usefixtures("no_params_file")
def test_cli_no_input_files(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert _cli(tmp_path, "--input", str(tmp_path / "empty")) == 1
    assert "no input files" in capsys.readouterr().err
    assert _cli(tmp_path, "--input", str(tmp_path / "nope")) == 1
    assert "nope does not exist" in capsys.readouterr().err


@pytest.mark.usefixtures("no_params_file")
def test_cli_unreadable_parquet_is_named(tmp_path, capsys):
    write_parquet(tmp_path / "ds" / "a.parquet", [{"audio": struct(good_bytes()), "text": "fine"}])
    (tmp_path / "ds" / "b.parquet").write_bytes(b"PAR1 but not really a parquet file")
    assert _cli(tmp_path, "--input", str(tmp_path / "ds")) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'ds' / 'b.parquet'}: unreadable parquet file" in err


@pytest.mark.usefixtures("no_params_file")
def test_cli_missing_column_lists_the_columns(tmp_path, capsys):
    f = write_parquet(tmp_path / "d.parquet", [_row(good_bytes())], text="transcription")
    assert _cli(tmp_path, "--input", str(f)) == 1
    err = capsys.readouterr().err
    assert "no text column 'text'" in err and "columns: audio, transcription, speaker" in err
    assert _cli(tmp_path, "--input", str(f), "--text-column", "transcription", "--workers", "1") == 0


def test_cli_too_many_bad_rows_fails_but_writes_the_reports(tmp_path):
    rows = [_row(good_bytes(), "good")] + [_row(None, f"bad {i}") for i in range(3)]
    f = write_parquet(tmp_path / "d.parquet", rows)
    voxpipe = Path(sys.executable).with_name("voxpipe")
    r = subprocess.run([str(voxpipe), "ingest", *TEST_CONSENT_FLAGS, "--params", os.devnull, "--input",
                        str(f), "--out", str(tmp_path / "out"), "--workers", "1",
                        "--set", "ingest.score_quality=false"], capture_output=True, text=True)
    assert r.returncode == 1
    assert "3 of 4 rows quarantined" in r.stderr and "max_bad_fraction=0.5" in r.stderr
    raw, bad, report = read_outputs(tmp_path / "out")
    assert len(raw) == 1 and len(bad) == 3 and report["reasons"]["no_audio"] == 3 and "error" in report


# ---- idempotency -----------------------------------------------------------------------------

def test_rerun_is_byte_identical_and_reuses_audio_files(tmp_path):
    rows = [{"audio": struct(good_bytes(f)), "text": f"tone {f}"} for f in (300, 400, 500)]
    rows.append({"audio": struct(b"junk"), "text": "bad"})
    f = write_parquet(tmp_path / "d.parquet", rows)
    params = IngestParams(**TEST_CONSENT,
                          input=[str(f)], out=str(tmp_path / "out"), workers=1, score_quality=False)
    ingest(params)
    first = {n: (tmp_path / "out" / n).read_bytes() for n in ("raw.jsonl", "quarantine.jsonl")}
    files = sorted((tmp_path / "out" / "audio").rglob("*.flac"))
    stats = [(p.stat().st_ino, p.stat().st_mtime_ns) for p in files]
    assert len(files) == 3
    ingest(params)
    assert {n: (tmp_path / "out" / n).read_bytes() for n in first} == first
    assert sorted((tmp_path / "out" / "audio").rglob("*.flac")) == files
    assert [(p.stat().st_ino, p.stat().st_mtime_ns) for p in files] == stats


def test_a_damaged_audio_file_from_an_earlier_run_is_rewritten(tmp_path):
    f = write_parquet(tmp_path / "d.parquet", [_row(good_bytes(), "tone")])
    params = IngestParams(**TEST_CONSENT,
                          input=[str(f)], out=str(tmp_path / "out"), workers=1, score_quality=False)
    ingest(params)
    (clip,) = (tmp_path / "out" / "audio").rglob("*.flac")
    original = clip.read_bytes()
    clip.write_bytes(original[: len(original) // 3])  # e.g. a crash before the data reached the disk
    ingest(params)
    assert clip.read_bytes() == original


# ---- accounting property ---------------------------------------------------------------------

KINDS = {
    "good": None,
    "undecodable": lambda i: {"audio": struct(b"\x00garbage" * 30), "text": f"row {i}"},
    "empty_audio": lambda i: {"audio": struct(b""), "text": f"row {i}"},
    "no_audio": lambda i: {"audio": None, "text": f"row {i}"},
    "missing_text": lambda i: {"audio": struct(good_bytes(200 + i)), "text": "  "},
    "silent": lambda i: {"audio": struct(SILENT_WAV), "text": f"row {i}"},
    "too_short": lambda i: {"audio": struct(SHORT_WAV), "text": f"row {i}"},
}
SILENT_WAV = encode(np.zeros(16000, np.float32), 16000)
SHORT_WAV = encode(tone(seconds=0.05))
GOOD_WAVS = [encode(tone(200 + 37 * i, 0.5, 16000), 16000) for i in range(12)]


@pytest.mark.slow
@settings(max_examples=15, deadline=None)
@given(kinds=st.lists(st.sampled_from(list(KINDS)), min_size=1, max_size=12))
def test_accounting_every_row_is_kept_or_quarantined(kinds):
    rows = [
        {"audio": struct(GOOD_WAVS[i]), "text": f"good {i}"} if k == "good" else KINDS[k](i)
        for i, k in enumerate(kinds)
    ]
    with tempfile.TemporaryDirectory() as d:
        f = write_parquet(Path(d) / "d.parquet", rows)
        raw, bad, report = run(Path(d), [f])
    assert report["rows_in"] == len(kinds)
    assert [r["source"]["row"] for r in raw] == [i for i, k in enumerate(kinds) if k == "good"]
    expected_bad = [(i, k) for i, k in enumerate(kinds) if k != "good"]
    assert [(b["source"]["row"], b["reason"]) for b in bad] == expected_bad
    assert set(report["reasons"]) == set(REASONS)


# ---- the shipped sample ----------------------------------------------------------------------

@pytest.mark.slow  # the whole sample, twice, and a part of it scored twice
def test_shipped_sample_is_fully_kept_in_a_process_pool_and_matches_one_worker(tmp_path):
    """Every row of the sample is kept, and 2 decode processes write the bytes one does; DNSMOS scores
    too (on a part of the sample: scoring all 64 clips twice was most of this test's time)."""
    pool = IngestParams(**TEST_CONSENT, input=[str(SAMPLE)], out=str(tmp_path / "pool"), workers=2,
                        score_quality=False)
    result = ingest(pool)
    assert "64 kept" in result.summary() and result.workers == 2
    raw, bad, report = read_outputs(tmp_path / "pool")
    assert bad == [] and len(raw) >= 60 and report["rows_kept"] == len(raw)
    assert set(report["speakers"]) == {"spk_m", "spk_f"}
    assert len({r["id"] for r in raw}) == len(raw)
    assert all(1.0 <= r["duration"] <= 12.0 for r in raw)
    for r in raw[:: max(1, len(raw) // 8)]:
        info = sf.info(tmp_path / "pool" / r["audio"])
        assert (info.format, info.subtype, info.samplerate, info.channels) == ("FLAC", "PCM_16", 16000, 1)
    ingest(IngestParams(**TEST_CONSENT, input=[str(SAMPLE)], out=str(tmp_path / "one"), workers=1,
                        score_quality=False))
    assert (tmp_path / "one" / "raw.jsonl").read_bytes() == (tmp_path / "pool" / "raw.jsonl").read_bytes()
    part = write_small_sample(tmp_path / "part", per_speaker=4)
    scored = {workers: tmp_path / f"scored-{workers}" for workers in (1, 2)}
    for workers, out in scored.items():
        ingest(IngestParams(**TEST_CONSENT, input=[str(part)], out=str(out), workers=workers))
    rows = [json.loads(line) for line in (scored[1] / "raw.jsonl").open()]
    assert len(rows) == 8 and all(r["dnsmos"]["ovrl"] for r in rows)
    assert (scored[1] / "raw.jsonl").read_bytes() == (scored[2] / "raw.jsonl").read_bytes()


def test_worker_count_follows_the_cgroup_cpu_quota(tmp_path):
    """A pod's CPU limit is a cgroup quota, not an affinity mask: `workers: 0` must not start one decode
    process per core of the node."""
    from voxpipe.cores import usable_cores

    affinity = len(os.sched_getaffinity(0))
    cpu_max = tmp_path / "cpu.max"
    assert usable_cores(tmp_path / "absent") == affinity
    cpu_max.write_text("max 100000\n")
    assert usable_cores(cpu_max) == affinity
    cpu_max.write_text("50000 100000\n")  # half a CPU: still one worker
    assert usable_cores(cpu_max) == 1
    cpu_max.write_text(f"{(affinity + 3) * 100000} 100000\n")  # a quota above the affinity: the affinity
    assert usable_cores(cpu_max) == affinity

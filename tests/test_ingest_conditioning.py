"""Ingest's conditioning on generated clips: edge silence trimmed, clipping and noise quarantined, quiet
clips levelled, transcripts spelled out in their language, the original kept beside each result."""

from __future__ import annotations

import html
import io
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pyloudnorm
import pytest
import soundfile as sf
import soxr
from small_sample import SAMPLE, TEST_CONSENT
from test_ingest import encode, read_outputs, struct, write_parquet

from voxpipe.data.conditioning import find_trim
from voxpipe.data.ingest_step import ingest
from voxpipe.steps.ingest import IngestParams

SR = 16_000


def speech(index: int = 0) -> np.ndarray:
    """One of the shipped sample's (espeak) utterances at 16 kHz, peak 0.5."""
    row = pq.read_table(sorted(SAMPLE.glob("*.parquet"))[0]).slice(index, 1).to_pylist()[0]
    x, sr = sf.read(io.BytesIO(row["audio"]["bytes"]), dtype="float32")
    x = soxr.resample(x, sr, SR).astype(np.float32)
    return x / np.abs(x).max() * 0.5


def _silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SR), np.float32)


def _clips() -> dict[str, tuple[np.ndarray, str]]:
    rng = np.random.default_rng(0)
    x = speech(2)
    noisy = x + rng.standard_normal(x.size).astype(np.float32) * np.sqrt(np.mean(x**2))  # 0 dB SNR
    return {
        "padded": (np.concatenate([_silence(2.0), speech(0), _silence(2.0)]), "Good morning, everyone."),
        "clipped": (np.clip(speech(1) * 8, -1, 1), "Please close the door behind you."),
        "noise": (np.clip(noisy, -1, 1), "The train to the city leaves at half past seven."),
        "quiet": (speech(3) * 0.02, "2024年3月5日我在商店花了12.5元"),  # 34 dB down, as float samples
        "dollars": (speech(4), "I paid $12.50 on 3/5/2024."),
    }


@pytest.fixture(scope="module")
def ingested(tmp_path_factory) -> tuple[Path, dict[str, dict], dict[str, dict], dict]:
    folder = tmp_path_factory.mktemp("conditioning")
    clips = _clips()
    rows = [{"audio": struct(encode(x, SR, subtype="FLOAT")), "text": text, "speaker": name}
            for name, (x, text) in clips.items()]
    write_parquet(folder / "in" / "clips.parquet", rows)
    out = folder / "out"
    ingest(IngestParams(**TEST_CONSENT,
                        input=[str(folder / "in")], out=str(out), workers=1, max_bad_fraction=1.0))
    raw, bad, report = read_outputs(out)
    names = list(clips)
    return (out, {r["speaker"]: r for r in raw}, {names[b["source"]["row"]]: b for b in bad}, report)


def test_edge_silence_is_trimmed_to_the_bound_and_the_original_duration_kept(ingested):
    out, kept, _, report = ingested
    row = kept["padded"]
    assert row["duration_raw"] == pytest.approx(4.0 + speech(0).size / SR, abs=1e-3)
    assert row["trim"][0] > 1.4 and row["trim"][1] > 1.4
    x, sr = sf.read(out / row["audio"], dtype="float32")
    loud = np.flatnonzero(np.abs(x) > 0.01)
    assert loud[0] / sr <= 0.5 + 0.02 and (x.size - loud[-1]) / sr <= 0.5 + 0.02
    cut = find_trim(x, sr, 0.5)  # trimming the output again takes nothing more off
    assert cut.start == 0 and cut.stop == x.size
    assert report["conditioning"]["trimmed"] >= 1
    assert report["conditioning"]["trimmed_seconds"] >= row["duration_raw"] - row["duration"] - 1e-3


def test_a_clipped_clip_is_quarantined(ingested):
    _, _, bad, report = ingested
    assert bad["clipped"]["reason"] == "clipped" and "full scale" in bad["clipped"]["detail"]
    assert report["reasons"]["clipped"] == 1


def test_white_noise_at_0_db_snr_is_quarantined_as_low_quality_at_the_default_bound(ingested):
    _, kept, bad, report = ingested
    assert bad["noise"]["reason"] == "low_quality", bad["noise"]
    assert report["reasons"]["low_quality"] == 1
    assert all(r["dnsmos"]["bak"] >= IngestParams().min_quality for r in kept.values())


def test_a_quiet_clip_is_brought_to_the_target_loudness(ingested):
    out, kept, _, _ = ingested
    row = kept["quiet"]
    x, sr = sf.read(out / row["audio"], dtype="float64")
    assert row["lufs_raw"] < -45 and row["gain_db"] > 20
    assert abs(pyloudnorm.Meter(sr).integrated_loudness(x) - IngestParams().target_lufs) <= 1.0


def test_chinese_date_and_money_become_characters_and_the_raw_text_is_kept(ingested):
    _, kept, _, report = ingested
    row = kept["quiet"]
    assert row["language"] == "zh" and row["text_raw"] == "2024年3月5日我在商店花了12.5元"
    assert not any(c.isdigit() for c in row["text"]) and "元" in row["text"] and "月" in row["text"]
    assert report["conditioning"]["languages"] == {"en": 2, "zh": 1}


def test_english_money_and_date_are_spelled_out(ingested):
    _, kept, _, report = ingested
    row = kept["dollars"]
    assert row["language"] == "en" and row["text_raw"] == "I paid $12.50 on 3/5/2024."
    assert not any(c.isdigit() for c in row["text"]) and "$" not in row["text"]
    assert "twelve" in row["text"] and "dollar" in row["text"] and "twenty" in row["text"]
    assert report["conditioning"]["text_normalized"] == 2


def test_the_report_lists_every_row_whose_text_normalization_changed(ingested):
    """report.json and the data report's page list each changed row (id, before, after), not a sample."""
    out, kept, _, report = ingested
    changed = [r for r in kept.values() if r["text"] != r["text_raw"]]  # in raw.jsonl order
    assert len(changed) == 2
    assert report["text_changes"] == [
        {"id": r["id"], "before": r["text_raw"], "after": r["text"], "unsure": []} for r in changed]
    assert kept["dollars"]["text"] == ("I paid twelve dollars and fifty cents on March fifth twenty "
                                       "twenty four.")
    assert kept["quiet"]["text"] == "二零二四年三月五日我在商店花了十二点五元"
    page = (out / "data-report.html").read_text(encoding="utf-8")
    section = page.split('id="text-changes"')[1]
    assert "changed 2 rows" in section
    for r in changed:
        cells = (r["id"], r["text_raw"], r["text"])
        assert "".join(f"<td>{html.escape(c)}</td>" for c in cells) in section


def test_each_step_switches_off_and_the_language_can_be_named(tmp_path):
    x, text = _clips()["padded"][0], "I paid $12.50."
    write_parquet(tmp_path / "in" / "a.parquet", [{"audio": struct(encode(x, SR)), "text": text}])
    out = tmp_path / "out"
    ingest(IngestParams(**TEST_CONSENT,
                        input=[str(tmp_path / "in")], out=str(out), workers=1, trim_silence=False,
                        normalize_loudness=False, score_quality=False, normalize_text=False, language="fr"))
    (row,), _, report = read_outputs(out)
    assert row["text"] == row["text_raw"] == text and row["language"] == "fr"
    assert row["duration"] == row["duration_raw"] and row["trim"] is None
    assert row["gain_db"] is None and row["dnsmos"] is None
    stored, _ = sf.read(out / row["audio"], dtype="float32")
    assert np.abs(stored - np.round(x * 32767) / 32767).max() < 1e-4  # the samples as they came
    assert report["conditioning"]["trimmed"] == report["conditioning"]["quality_scored"] == 0


def test_the_locale_reads_the_date_and_the_unsure_rows_are_marked(tmp_path):
    """ingest.locale=en-GB reads 12/05/2026 as 12 May; a row with an abbreviation kept as written and an
    account number read as a quantity is marked unsure in report.json and on the data report's page."""
    x = _clips()["padded"][0]
    texts = ["We met on 12/05/2026.", "Acme Inc. is owed 55231 pounds."]
    write_parquet(tmp_path / "in" / "a.parquet", [{"audio": struct(encode(x, SR)), "text": t} for t in texts])
    out = tmp_path / "out"
    ingest(IngestParams(**TEST_CONSENT,
                        input=[str(tmp_path / "in")], out=str(out), workers=1, trim_silence=False,
                        normalize_loudness=False, score_quality=False, locale="en-GB"))
    rows, _, report = read_outputs(out)
    assert [r["text"] for r in rows] == [
        "We met on the twelfth of May twenty twenty six.",
        "Acme Inc. is owed fifty five thousand two hundred and thirty one pounds."]
    assert [c["unsure"] for c in report["text_changes"]] == [
        [], ["abbreviation kept: Inc.", "digit string read as a number: 55231"]]
    section = (out / "data-report.html").read_text(encoding="utf-8").split('id="text-changes"')[1]
    assert "changed 2 rows, 1 marked unsure" in section
    assert "<td>⚠ abbreviation kept: Inc.; digit string read as a number: 55231</td>" in section


def test_a_locale_per_source_and_per_speaker_reads_each_voice_as_its_speaker_says_it(tmp_path):
    """ingest.locale as a mapping: the folder `gb` (speaker ann) is en-GB, speaker `li` (in the folder `us`)
    zh-CN, and `us`'s other speaker, named by no key, en-US; every raw.jsonl row records the locale it was
    read in."""
    x = _clips()["padded"][0]
    date = "We met on 12/05/2026."
    def row(scale: float, speaker: str) -> dict:
        return {"audio": struct(encode(x * scale, SR)), "text": date, "speaker": speaker}

    write_parquet(tmp_path / "gb" / "a.parquet", [row(1.0, "ann")])
    write_parquet(tmp_path / "us" / "a.parquet", [row(1.0, "sam"), row(0.5, "li")])
    out = tmp_path / "out"
    ingest(IngestParams(**TEST_CONSENT,
                        input=[str(tmp_path / "gb"), str(tmp_path / "us")], out=str(out), workers=1,
                        trim_silence=False, normalize_loudness=False, score_quality=False,
                        locale={str(tmp_path / "gb"): "en-GB", "li": "zh-CN"}))
    rows, _, _ = read_outputs(out)
    said = {r["speaker"]: (r["locale"], r["text"]) for r in rows}
    assert said == {"ann": ("en-GB", "We met on the twelfth of May twenty twenty six."),
                    "sam": ("en-US", "We met on December fifth twenty twenty six."),
                    # an English row of a zh-CN voice is read in English's default (text_norm.locale_for)
                    "li": ("zh-CN", "We met on December fifth twenty twenty six.")}


def test_a_long_pause_inside_a_clip_is_flagged_not_cut(tmp_path):
    x = np.concatenate([speech(0), _silence(1.5), speech(1)])
    write_parquet(tmp_path / "in" / "a.parquet", [{"audio": struct(encode(x, SR)), "text": "two parts"}])
    out = tmp_path / "out"
    ingest(IngestParams(**TEST_CONSENT,
                        input=[str(tmp_path / "in")], out=str(out), workers=1, score_quality=False))
    (row,), _, report = read_outputs(out)
    assert row["flags"] == ["long_pause"] and report["conditioning"]["long_pause"] == 1
    assert row["duration"] >= 1.5 + (speech(0).size + speech(1).size) / SR - 1.0


@pytest.mark.slow
def test_rerun_and_two_shards_give_the_same_bytes(tmp_path, ingested):
    out = ingested[0]
    src = out.parent / "in"
    again, sharded = tmp_path / "again", tmp_path / "sharded"
    ingest(IngestParams(**TEST_CONSENT,
                        input=[str(src)], out=str(again), workers=2, max_bad_fraction=1.0))
    ingest(IngestParams(**TEST_CONSENT,
                        input=[str(src)], out=str(sharded), workers=1, shards=2, max_bad_fraction=1.0))
    for name in ("raw.jsonl", "quarantine.jsonl"):
        assert (again / name).read_bytes() == (out / name).read_bytes()
        assert (sharded / name).read_bytes() == (out / name).read_bytes()
    report = json.loads((sharded / "report.json").read_text())
    assert report["conditioning"] == json.loads((out / "report.json").read_text())["conditioning"]

"""Consent records (voxpipe/data/consent.py): ingest keeps a speaker's rows only with a valid record in the
voices.yaml beside the data; everything else is quarantined `no_consent` with the speaker named, or stops
in one paragraph that says how to add the record. Real ingest on a few rows of the shipped sample."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from pydantic import ValidationError
from small_sample import SAMPLE, write_small_sample

from voxpipe.data.ingest_step import ingest
from voxpipe.errors import StepError
from voxpipe.steps.ingest import IngestParams


def sample_records() -> dict:
    return yaml.safe_load((SAMPLE / "voices.yaml").read_text())


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_small_sample(tmp_path / "data", per_speaker=2)  # with the sample's voices.yaml


def write_records(folder: Path, records: dict) -> None:
    (folder / "voices.yaml").write_text(yaml.safe_dump(records))


def run(folder: Path, tmp_path: Path, **kw) -> tuple[dict, list[dict]]:
    out = tmp_path / "out"
    kw = {"workers": 1, "score_quality": False, "max_bad_fraction": 1.0, **kw}
    ingest(IngestParams(input=[str(folder)], out=str(out), **kw))
    quarantine = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    return json.loads((out / "report.json").read_text()), quarantine


def test_the_shipped_sample_carries_synthetic_records_for_its_voices(data, tmp_path):
    report, quarantine = run(data, tmp_path)
    assert report["rows_kept"] == 4 and quarantine == []
    consent = report["consent"]
    assert consent["required"] is True
    assert {(r["speaker"], r["kind"], r["valid"]) for r in consent["records"]} == {
        ("spk_m", "synthetic", True), ("spk_f", "synthetic", True)}


@pytest.mark.parametrize("change, detail", [
    ({"revoked": True, "revoked_reason": "asked to withdraw"}, "was revoked (asked to withdraw)"),
    ({"expires": "2020-01-01"}, "expired on 2020-01-01"),
    ({"granted": "2999-01-01"}, "after today"),
    ({"scope": ["voice_clone"]}, "does not include tts"),
])
def test_an_invalid_record_quarantines_its_speakers_rows_no_consent(data, tmp_path, change, detail):
    records = sample_records()
    records["voices"][0].update(change)  # spk_m
    write_records(data, records)
    report, quarantine = run(data, tmp_path)
    assert report["rows_kept"] == 2 and report["reasons"]["no_consent"] == 2
    assert {q["reason"] for q in quarantine} == {"no_consent"}
    assert all(q["detail"].startswith("speaker 'spk_m': ") and detail in q["detail"] for q in quarantine)
    assert set(report["speakers"]) == {"spk_f"}


def test_a_speaker_without_a_record_is_quarantined_and_named(data, tmp_path):
    records = sample_records()
    del records["voices"][1]  # spk_f
    write_records(data, records)
    report, quarantine = run(data, tmp_path)
    assert report["reasons"]["no_consent"] == 2 and set(report["speakers"]) == {"spk_m"}
    assert "no consent record for speaker 'spk_f'" in quarantine[0]["detail"]


def test_all_voices_without_consent_stop_saying_how_to_add_a_record(data, tmp_path):
    records = sample_records()
    for r in records["voices"]:
        r["revoked"] = True
    write_records(data, records)
    with pytest.raises(StepError, match="no_consent: add or renew the speaker's record in the voices.yaml"):
        run(data, tmp_path, max_bad_fraction=0.5)


def test_data_without_voices_yaml_stops_before_decoding(data, tmp_path):
    (data / "voices.yaml").unlink()
    with pytest.raises(StepError) as e:
        run(data, tmp_path)
    message = str(e.value)
    assert "\n" not in message and f"{data / 'voices.yaml'} does not exist" in message
    assert "consent_reason" in message and "recording_sha256" in message
    assert not (tmp_path / "out" / "raw.jsonl").exists()


def test_not_required_needs_a_reason_and_records_it(data, tmp_path):
    (data / "voices.yaml").unlink()
    with pytest.raises(ValidationError, match="consent_reason is empty"):
        IngestParams(input=[str(data)], consent="not_required")
    report, _ = run(data, tmp_path, consent="not_required", consent_reason="LibriTTS, CC-BY-4.0")
    assert report["rows_kept"] == 4
    assert report["consent"] == {"required": False, "reason": "LibriTTS, CC-BY-4.0", "records": []}


@pytest.mark.parametrize("edit, key", [
    (lambda r: r["voices"][0].pop("licence"), "voices.0.licence"),
    (lambda r: r["voices"][1].update(kind="robot"), "voices.1.kind"),
    (lambda r: r["voices"][0].update(kind="person"), "voices.0"),  # a person needs the recording
    (lambda r: r["voices"][1].update(id="sample-spk_m"), "voices.1.id"),  # ids are unique
])
def test_a_bad_record_is_one_paragraph_naming_the_file_and_key(data, tmp_path, edit, key):
    records = sample_records()
    edit(records)
    write_records(data, records)
    with pytest.raises(StepError) as e:
        run(data, tmp_path)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{data / 'voices.yaml'}: key {key}")


def held_out_clip(speaker: str, dest: Path) -> Path:
    """A clip of `speaker` from the sample's second file (write_small_sample takes the first's): the consent
    statement "read aloud" by that voice, not one of the clips trained on."""
    table = pq.read_table(sorted(SAMPLE.glob("*.parquet"))[1]).to_pylist()
    dest.write_bytes(next(r for r in table if r["speaker"] == speaker)["audio"]["bytes"])
    return dest


def as_person(records: dict, index: int, recording: Path) -> None:
    records["voices"][index].update(kind="person", subject="Anna Example", recording=recording.name,
                                    recording_sha256=hashlib.sha256(recording.read_bytes()).hexdigest())


def test_a_person_record_checks_its_consent_recording(data, tmp_path):
    recording = held_out_clip("spk_m", data / "consent-spk_m.flac")
    records = sample_records()
    as_person(records, 0, recording)  # spk_m, recorded by spk_m
    write_records(data, records)
    report, _ = run(data, tmp_path)
    assert report["rows_kept"] == 4
    recording.write_bytes(recording.read_bytes() + b"\0")
    with pytest.raises(StepError, match="key voices.0.recording_sha256 does not match"):
        run(data, tmp_path)
    recording.unlink()
    with pytest.raises(StepError, match="key voices.0.recording: 'consent-spk_m.flac' is not a file"):
        run(data, tmp_path)


@pytest.mark.parametrize("shards", [1, 2])
def test_a_consent_recorded_by_another_voice_quarantines_the_speaker(data, tmp_path, shards):
    """spk_f's record carries a recording of spk_m: below consent_voice_threshold (0.72, measured on the
    sample: same voice >= 0.816, other voice <= 0.618), spk_f's rows are consent_voice_mismatch."""
    records = sample_records()
    as_person(records, 1, held_out_clip("spk_m", data / "consent-spk_f.flac"))
    write_records(data, records)
    report, quarantine = run(data, tmp_path, shards=shards)
    assert report["rows_kept"] == 2 and set(report["speakers"]) == {"spk_m"}
    assert report["reasons"]["consent_voice_mismatch"] == 2
    assert {q["reason"] for q in quarantine} == {"consent_voice_mismatch"}
    detail = quarantine[0]["detail"]
    assert "speaker 'spk_f': the consent recording consent-spk_f.flac is another voice" in detail
    kept = [json.loads(line) for line in (tmp_path / "out" / "raw.jsonl").read_text().splitlines()]
    assert {r["speaker"] for r in kept} == {"spk_m"}


def test_a_consent_recording_that_is_not_audio_is_one_paragraph(data, tmp_path):
    recording = data / "consent.flac"
    recording.write_bytes(b"not audio")
    records = sample_records()
    as_person(records, 0, recording)
    write_records(data, records)
    with pytest.raises(StepError, match="the consent recording .*consent.flac cannot be read as audio"):
        run(data, tmp_path)


def test_a_sharded_run_checks_consent_as_one_pass_does(data, tmp_path):
    """The plan carries the consent read from the inputs to each shard (a KFP shard task sees only the
    plan)."""
    records = sample_records()
    records["voices"][0]["revoked"] = True  # spk_m
    write_records(data, records)
    report, quarantine = run(data, tmp_path, shards=2)
    assert report["rows_kept"] == 2 and report["reasons"]["no_consent"] == 2
    assert {r["speaker"]: r["valid"] for r in report["consent"]["records"]} == {"spk_m": False, "spk_f": True}
    assert all("spk_m" in q["detail"] for q in quarantine)


def test_each_registered_voice_carries_its_consent_record(data, tmp_path):
    """register's voices artifact (track/voices.py) holds each voice's consent {id, scope}, so serve shows
    it (GET /v1/audio/voices) without the data's voices.yaml at hand."""
    from voxpipe.track.voices import voice_consent, write_training_voices

    report, _ = run(data, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "out" / "raw.jsonl").read_text().splitlines()]
    write_training_voices(tmp_path / "out", rows, tmp_path / "voices", voice_consent(report))
    voices = json.loads((tmp_path / "voices" / "voices.json").read_text())
    assert {v["speaker"]: v["consent"] for v in voices} == {
        "spk_f": {"id": "sample-spk_f", "scope": ["tts", "voice_clone"]},
        "spk_m": {"id": "sample-spk_m", "scope": ["tts", "voice_clone"]}}

"""Long recordings through `voxpipe ingest` (voxpipe/data/recording.py): cut at pauses by the real Silero VAD,
another voice and two voices at once set aside by the real GE2E encoder, every row placed in its recording,
bad recordings quarantined by name, and a killed run resumed per recording."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from sessions import make_sessions

from voxpipe.data import vad
from voxpipe.data.ingest import ingest_one_pass
from voxpipe.data.ingest_shards import plan as ingest_plan
from voxpipe.data.ingest_step import ingest as ingest_step
from voxpipe.data.manifest import build_manifest
from voxpipe.data.recording import SEGMENTS
from voxpipe.errors import StepError
from voxpipe.steps.ingest import IngestParams
from voxpipe.steps.manifest import ManifestParams

MAIN, OTHER, RATE = make_sessions.MAIN, make_sessions.INTERLOPER, make_sessions.RATE
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def clips() -> dict[str, list[tuple[np.ndarray, str]]]:
    return make_sessions.sample_clips()


def recording(folder: Path, name: str, segments: list[tuple[np.ndarray, str, str]], seed: int = 0
              ) -> list[dict]:
    """folder/spk_m/name: the segments joined with pauses, beside the sample's consent records; the truth."""
    voice = folder / MAIN
    voice.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(make_sessions.HERE / "voices.yaml", voice / "voices.yaml")
    audio, truth = make_sessions.join(segments, random.Random(seed), name)
    sf.write(voice / name, audio, RATE, subtype="PCM_16")
    return truth


def ingest(folder: Path, out: Path, **settings) -> list[dict]:
    """ingest_one_pass over folder/spk_m in this process; the raw.jsonl and quarantine.jsonl rows."""
    segment = settings.pop("segment", {})
    p = IngestParams(input=[str(folder / MAIN)], out=str(out), workers=1, score_quality=False,
                     asr=["pocketsphinx"], segment=segment, **settings)
    ingest_one_pass(p)
    return rows(out)


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for name in ("raw.jsonl", "quarantine.jsonl")
            for line in (out / name).read_text().splitlines()]


def test_another_voice_is_set_aside_with_its_similarity_and_every_row_has_its_place(tmp_path, clips):
    main = [(x, MAIN, t) for x, t in clips[MAIN][:4]]
    y, line = clips[OTHER][0]
    truth = recording(tmp_path, "talk.wav", [*main[:2], (y, OTHER, line), *main[2:]])
    found = ingest(tmp_path, tmp_path / "out")
    assert len(found) == len(truth)
    for row, segment in zip(sorted(found, key=lambda r: r["source"]["row"]), truth, strict=True):
        source = row["source"]
        assert source["file"].endswith("talk.wav")
        # the kept clip is trimmed to its speech (at most max_edge_silence each side); the quarantined one is
        # the cut with its padding
        assert segment["start"] - 0.6 <= source["start"] <= segment["start"] + 0.1
        assert segment["end"] - 0.1 <= source["end"] <= segment["end"] + 0.6
        assert (row.get("reason") == "other_speaker") == (segment["speaker"] == OTHER)
        if "reason" not in row:  # kept: transcribed, its voice's similarity kept with it
            assert row["text"] and row["asr"] == "pocketsphinx" and row["speaker_similarity"] > 0.72
    aside = next(r for r in found if r.get("reason") == "other_speaker")
    assert aside["similarity"] < 0.72 and "speaker similarity" in aside["detail"]
    page = (tmp_path / "out" / "data-report.html").read_text()
    assert 'id="other-voices"' in page and "talk.wav" in page
    manifest = tmp_path / "manifest"
    build_manifest(ManifestParams(input=[str(tmp_path / "out" / "raw.jsonl")], out=str(manifest)))
    carried = [json.loads(line)["source"] for name in ("train.jsonl", "val.jsonl")
               for line in (manifest / name).read_text().splitlines()]
    assert len(carried) == 4
    assert all(c["file"].endswith("talk.wav") and c["end"] > c["start"] for c in carried)


def test_two_voices_at_once_are_quarantined_as_overlap(tmp_path, clips):
    x, text = clips[MAIN][5]
    y = clips[OTHER][1][0]
    mixed = x.copy()
    half = x.size // 2
    n = min(x.size - half, y.size)
    mixed[half:half + n] += y[:n]
    segments = [(x2, MAIN, t) for x2, t in clips[MAIN][6:9]] + [(mixed, MAIN, text)]
    recording(tmp_path, "mixed.wav", segments)
    found = ingest(tmp_path, tmp_path / "out", max_bad_fraction=1.0)
    reasons = {r["source"]["row"]: r.get("reason") for r in found}
    assert reasons[3] == "overlap" and all(reasons[k] != "overlap" for k in range(3))
    row = next(r for r in found if r.get("reason") == "overlap")
    assert "1.6 s window" in row["detail"] and row["similarity"] >= 0.72


def test_bad_recordings_are_quarantined_naming_the_file(tmp_path, clips):
    voice = tmp_path / MAIN
    recording(tmp_path, "speech.wav", [(x, MAIN, t) for x, t in clips[MAIN][:1]])
    (voice / "corrupt.wav").write_bytes(b"RIFF\x10\x00\x00\x00WAVEfmt not really a wav file")
    sf.write(voice / "silence.wav", np.zeros(3 * RATE, dtype=np.float32), RATE)
    found = ingest(tmp_path, tmp_path / "out", max_bad_fraction=1.0, segment={"max_seconds": 0.4})
    by_file = {Path(r["source"]["file"]).name: r for r in found}
    assert by_file["corrupt.wav"]["reason"] == "undecodable"
    silence = by_file["silence.wav"]
    assert silence["reason"] == "no_speech" and "silence.wav" in silence["detail"]
    # speech with no pause longer than max_seconds: left whole and quarantined, never cut inside a word
    unbroken = [r for r in found if r.get("reason") == "no_pause"]
    assert unbroken and all(r["source"]["file"].endswith("speech.wav") for r in unbroken)
    assert all("speech.wav" in r["detail"] and "max_seconds=0.4" in r["detail"] for r in unbroken)


@pytest.mark.slow
def test_a_killed_run_keeps_its_finished_recordings(tmp_path, clips):
    for k in range(3):
        recording(tmp_path, f"part-{k}.wav", [(x, MAIN, t) for x, t in clips[MAIN][4 * k:4 * k + 4]],
                  seed=k)
    out = tmp_path / "out"
    args = [str(BIN / "voxpipe"), "ingest", "--input", str(tmp_path / MAIN), "--out", str(out),
            "--workers", "1", "--set", "ingest.score_quality=false", "--set", "ingest.max_bad_fraction=1"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not list((out / SEGMENTS).glob("*.json")) and time.monotonic() < deadline:
            assert proc.poll() is None, "ingest ended before it was killed"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finished = {p: p.stat().st_mtime_ns for p in (out / SEGMENTS).glob("*.json")}
    assert finished and not (out / "raw.jsonl").exists()
    subprocess.run(args, check=True, capture_output=True)
    assert all(p.stat().st_mtime_ns == mtime for p, mtime in finished.items())  # reused, not cut again
    assert len(list((out / SEGMENTS).glob("*.json"))) == 3
    assert {Path(r["source"]["file"]).name for r in rows(out)} == {f"part-{k}.wav" for k in range(3)}


@pytest.mark.slow
def test_recordings_fan_out_one_per_shard_and_merge_to_the_single_run(tmp_path, clips):
    for k in range(2):
        recording(tmp_path, f"part-{k}.wav", [(x, MAIN, t) for x, t in clips[MAIN][3 * k:3 * k + 3]],
                  seed=k)
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    ingest(tmp_path, single, max_bad_fraction=1.0)
    plan = ingest_plan(IngestParams(input=[str(tmp_path / MAIN)], out=str(tmp_path / "plan"), shards=2))
    assert plan.shards == 2  # a recording is one unit of the plan
    ingest_step(IngestParams(input=[str(tmp_path / MAIN)], out=str(sharded), workers=1, score_quality=False,
                             asr=["pocketsphinx"], shards=2))
    assert (sharded / "quarantine.jsonl").read_bytes() == (single / "quarantine.jsonl").read_bytes()
    # pocketsphinx adapts to the utterances it heard before (its confidence moves in the third decimal
    # between a decoder per shard and one for the run): the rows agree on everything else
    def settled(out: Path) -> list[dict]:
        return [{k: v for k, v in json.loads(line).items() if k not in ("asr_confidence", "review_reason")}
                for line in (out / "raw.jsonl").read_text().splitlines()]

    assert settled(sharded) == settled(single) and settled(single)


def test_a_recordings_script_gives_its_clips_their_text(tmp_path, clips):
    segments = [(x, MAIN, t) for x, t in clips[MAIN][9:13]]
    truth = recording(tmp_path, "read.wav", segments)
    (tmp_path / MAIN / "read.txt").write_text(" ".join(t["text"] for t in truth) + "\n", encoding="utf-8")
    kept = sorted(ingest(tmp_path, tmp_path / "out"), key=lambda r: r["source"]["row"])
    assert [r.get("reason") for r in kept] == [None] * 4
    for row, segment in zip(kept, truth, strict=True):
        assert row["text_raw"] == segment["text"] and row["script"] == "read.txt"
        assert row["asr"] == "pocketsphinx" and "asr_text" in row and 0 <= row["script_match"] <= 1


def test_an_enrolment_clip_names_the_voice_to_keep(tmp_path, clips):
    """The enrolment clip outranks the dominant voice: enrolled as the interloper, the main voice goes."""
    y, line = clips[OTHER][2]
    segments = [*[(x, MAIN, t) for x, t in clips[MAIN][13:16]], (y, OTHER, line)]
    truth = recording(tmp_path, "talk.wav", segments)
    enrolment = tmp_path / "enrolment.wav"
    sf.write(enrolment, clips[OTHER][3][0], RATE)
    found = ingest(tmp_path, tmp_path / "out", max_bad_fraction=1.0, segment={"enrolment": str(enrolment)})
    reasons = [r.get("reason") for r in sorted(found, key=lambda r: r["source"]["row"])]
    assert reasons == ["other_speaker" if t["speaker"] == MAIN else None for t in truth]


def test_an_unreadable_enrolment_clip_is_one_paragraph_naming_it(tmp_path, clips):
    recording(tmp_path, "talk.wav", [(x, MAIN, t) for x, t in clips[MAIN][:1]])
    enrolment = tmp_path / "enrolment.wav"
    enrolment.write_bytes(b"not audio")
    with pytest.raises(StepError, match=r"ingest.segment.enrolment \S*enrolment.wav cannot be read"):
        ingest(tmp_path, tmp_path / "out", segment={"enrolment": str(enrolment)})


def test_without_the_silero_wheel_cutting_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(vad.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(StepError, match="needs the silero-vad wheel"):
        vad.model_file()


def test_with_both_thresholds_at_minus_one_every_voice_is_kept_unembedded(tmp_path, clips):
    y, line = clips[OTHER][0]
    recording(tmp_path, "talk.wav", [(clips[MAIN][0][0], MAIN, ""), (y, OTHER, line)])
    found = ingest(tmp_path, tmp_path / "out", segment={"speaker_threshold": -1, "overlap_threshold": -1})
    assert len(found) == 2 and all("reason" not in r and r["speaker_similarity"] is None for r in found)

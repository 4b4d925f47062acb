"""`ingest.asr`: rows with no text transcribed at ingest by the registry's recognisers (voxpipe/data/
transcribe.py), on the shipped sample's real speech: pocketsphinx's transcript, confidence and review
flag in raw.jsonl, a second backend's disagreement, and each way it can be refused."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from small_sample import SAMPLE, TEST_CONSENT
from test_scoring import tiny_whisper

from voxpipe.backends import ASR
from voxpipe.data.ingest_step import ingest
from voxpipe.data.transcribe import KEYS
from voxpipe.errors import StepError
from voxpipe.params import load_params
from voxpipe.steps.ingest import IngestParams

ROWS = 3  # the sample's first rows: two with their text taken away, one typed


def untexted(folder: Path) -> Path:
    """A parquet of the sample's first rows, the first two with no text (null, and blank)."""
    table = pq.read_table(sorted(SAMPLE.glob("*.parquet"))[0]).slice(0, ROWS)
    rows = table.to_pylist()
    rows[0]["text"], rows[1]["text"] = None, "  "
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.from_pylist(rows, schema=table.schema), folder / "train.parquet")
    return folder / "train.parquet"


def run(tmp_path: Path, asr_config: dict | None = None, **kw) -> tuple[list[dict], list[dict], dict]:
    out = tmp_path / "out"
    p = IngestParams(**TEST_CONSENT, input=[str(untexted(tmp_path / "in"))], out=str(out), workers=1,
                     score_quality=False, max_bad_fraction=1.0, **kw)
    ingest(p, asr_config or {})
    raw = [json.loads(line) for line in (out / "raw.jsonl").read_text().splitlines()]
    bad = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    return raw, bad, json.loads((out / "report.json").read_text())


def test_rows_without_text_are_transcribed_with_the_recogniser_and_its_confidence(tmp_path):
    raw, bad, report = run(tmp_path, asr=["pocketsphinx"], asr_min_confidence=-1000.0)
    assert not bad and len(raw) == ROWS
    heard, typed = raw[:2], raw[2]
    for row in heard:
        assert row["asr"] == "pocketsphinx" and row["asr_model"].startswith("pocketsphinx")
        assert row["text"] and row["text_raw"] and row["text"] == row["text_raw"]  # pocketsphinx: lower case
        assert isinstance(row["asr_confidence"], float) and row["asr_confidence"] <= 0
        assert row["asr_confidence_reason"] is None and row["asr_second"] is None
        assert row["needs_review"] is False and row["review_reason"] is None
        assert row["language"] == "en" and row["locale"] == "en-US"
    assert not set(KEYS) & set(typed)  # a typed row keeps no recogniser's keys
    assert report["conditioning"]["transcribed"] == 2 and report["conditioning"]["needs_review"] == 0

    # the same audio at a bar it cannot reach: both rows are marked for review, with why
    raw, _, report = run(tmp_path, asr=["pocketsphinx"], asr_min_confidence=-1e-9)
    assert [r["needs_review"] for r in raw[:2]] == [True, True]
    assert report["conditioning"]["needs_review"] == 2
    assert all(r["review_reason"].startswith(f"asr_confidence {r['asr_confidence']} < "
                                             "ingest.asr_min_confidence -1e-09") for r in raw[:2])


def test_a_second_recogniser_that_disagrees_marks_the_row_with_its_cer(tmp_path):
    """A random-weights Whisper hears nothing like pocketsphinx: its CER is over the bound."""
    tiny_whisper(tmp_path / "whisper")
    raw, bad, _ = run(tmp_path, {"whisper_model": str(tmp_path / "whisper")}, asr=["pocketsphinx"],
                      asr_second=["whisper"], asr_min_confidence=-1000.0, asr_max_cer=0.2)
    assert not bad
    for row in raw[:2]:
        second = row["asr_second"]
        assert second["asr"] == "whisper" and second["cer"] > 0.2 and row["needs_review"] is True
        assert f"whisper heard {second['text'][:80]!r}: CER {second['cer']} > ingest.asr_max_cer 0.2" in \
            row["review_reason"]


def test_a_language_no_listed_recogniser_covers_is_quarantined_with_the_reason(tmp_path):
    raw, bad, report = run(tmp_path, asr=["pocketsphinx"], locale="zh-CN")
    assert len(raw) == 1 and [b["reason"] for b in bad] == ["no_recogniser", "no_recogniser"]
    assert "no configured recogniser covers language 'zh' (ingest.asr: pocketsphinx" in bad[0]["detail"]
    assert report["reasons"]["no_recogniser"] == 2


def test_without_ingest_asr_a_row_with_no_text_is_quarantined_as_before(tmp_path):
    raw, bad, _ = run(tmp_path)
    assert len(raw) == 1 and [b["reason"] for b in bad] == ["missing_text", "missing_text"]
    assert [b["detail"][:17] for b in bad] == ["the text is null ", "the text is blank"]


def test_an_unknown_recogniser_is_one_error_naming_the_key_and_the_choices():
    with pytest.raises(StepError) as e:
        load_params(None, ["ingest.asr=[pocketsphinx, nosuch]"])
    names = [f"'{n}'" for n in ASR]  # the registry's, as pydantic lists them: 'a', 'b' or 'c'
    assert "ingest.asr.1" in str(e.value) and f"{', '.join(names[:-1])} or {names[-1]}" in str(e.value)
    assert "(got 'nosuch')" in str(e.value)


def test_a_missing_model_folder_is_one_error_naming_the_key_and_folder_before_any_row(tmp_path):
    with pytest.raises(StepError, match=r"asr\.whisper_model \S*nowhere: no such folder.*leave the "
                       r"backend out of ingest\.asr"):
        run(tmp_path, {"whisper_model": str(tmp_path / "nowhere")}, asr=["whisper"])
    assert not (tmp_path / "out" / "raw.jsonl").exists()

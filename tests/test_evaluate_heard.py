"""A voice the recogniser cannot hear in its own real recordings has no WER/CER (voxpipe/evaluate/heard.py):
null with the reason in eval.json's clips and flat figures, the headline table, the run description and
the page; the promotion rule never reads it."""

from __future__ import annotations

import numpy as np

from voxpipe.evaluate.heard import real_rates_by_voice, unheard, voice_report, without_unheard
from voxpipe.evaluate.metrics import ClipMeasures
from voxpipe.evaluate.pages import headline_rows, report_lines, summary_markdown
from voxpipe.evaluate.promotion import Scores, decide
from voxpipe.evaluate.scoring import utterance_rate
from voxpipe.evaluate.step import _rates, intelligibility_by_language
from voxpipe.steps.evaluate import EvaluateParams

BOUND = EvaluateParams().asr_max_real_rate
EN = "the farmer checked the fences before the cattle were let out"
ZH = "今天天气很好我们去公园散步吧"


def heard(speaker: str, text: str, transcript: str, language: str) -> tuple[dict, object]:
    rate = utterance_rate(text, transcript, language)
    metric = "cer" if language == "zh" else "wer"
    return ({"speaker": speaker, "language": language, "metric": metric, metric: rate.rate,
             "asr": "pocketsphinx", "asr_model": "m", "asr_reason": None, "transcript": transcript}, rate)


def clip(speaker: str, text: str, transcript: str, language: str) -> ClipMeasures:
    record, rate = heard(speaker, text, transcript, language)
    return ClipMeasures({"name": f"{speaker}-{language}", "with_reference": True, **record}, np.ones(3), rate)


# the real recordings: the recogniser hears spk_en's English and spk_zh's Mandarin well, but not the
# English of spk_demo (a synthetic voice: every word wrong) nor the Mandarin of spk_accent
REAL = [
    heard("spk_en", EN, EN, "en"),
    heard("spk_demo", EN, "thank you know and really think on me", "en"),
    heard("spk_zh", ZH, ZH, "zh"),
    heard("spk_accent", ZH, "你好", "zh"),
]


def test_the_real_rate_above_the_bound_nulls_that_voices_wer_and_cer_with_the_reason():
    by_voice = real_rates_by_voice([r for r, _ in REAL], [rate for _, rate in REAL])
    assert by_voice["spk_en"]["en"]["rate"] == 0.0 and by_voice["spk_demo"]["en"]["rate"] > BOUND
    assert by_voice["spk_accent"]["zh"]["metric"] == "cer" and by_voice["spk_accent"]["zh"]["rate"] > BOUND
    reasons = unheard(by_voice, BOUND)
    assert sorted(reasons) == [("spk_accent", "zh"), ("spk_demo", "en")]
    assert "cannot hear voice 'spk_demo' in en: its WER" in reasons[("spk_demo", "en")]
    assert "CER" in reasons[("spk_accent", "zh")] and "asr_max_real_rate 0.5" in reasons[("spk_accent", "zh")]
    report = voice_report(by_voice, reasons, "spk_demo")["en"]
    assert report["heard"] is False and report["reason"] == reasons[("spk_demo", "en")]
    assert voice_report(by_voice, reasons, "spk_en")["en"] == {**by_voice["spk_en"]["en"], "heard": True,
                                                               "reason": None}

    # generated clips: a near-perfect one of each voice; the unheard voices' rates go, their transcripts stay
    clips = [clip("spk_en", EN, "the farmer checked the fences", "en"), clip("spk_demo", EN, EN, "en"),
             clip("spk_zh", ZH, ZH[:10], "zh"), clip("spk_accent", ZH, ZH, "zh")]
    kept = without_unheard(clips, reasons)
    assert [c.record["speaker"] for c in kept if c.rate is None] == ["spk_demo", "spk_accent"]
    demo = next(c for c in kept if c.record["speaker"] == "spk_demo")
    assert demo.record["wer"] is None and demo.record["transcript"] == EN
    assert demo.record["asr_reason"] == reasons[("spk_demo", "en")]
    flat = _rates(intelligibility_by_language([c.record for c in kept], [c.rate for c in kept]))
    assert flat == {"wer": clips[0].rate.rate, "cer": clips[2].rate.rate}  # the heard voices only

    # every voice unheard: the flat figures are null, and why says the recogniser's reason
    none_heard = without_unheard(clips[1::2], reasons)
    by_language = intelligibility_by_language([c.record for c in none_heard], [c.rate for c in none_heard])
    assert _rates(by_language) == {"wer": None, "cer": None}
    assert "cannot hear voice" in by_language["en"]["reason"] and by_language["en"]["scored"] == 0


def test_a_null_wer_shows_its_reason_in_the_headline_table_the_report_and_the_page():
    reason = unheard(real_rates_by_voice([REAL[1][0]], [REAL[1][1]]), BOUND)[("spk_demo", "en")]
    figures = {"loss_model": 1.0, "loss_baseline": 1.1, "wer": None, "wer_baseline": None,
               "wer_null_reason": reason, "wer_real": 0.92, "cer": None,
               "intelligibility": {"model": {"en": {"metric": "wer", "rate": None, "reason": reason}}}}
    rows = {label: (model, base) for label, model, base in headline_rows(figures)}
    assert rows["WER"] == (f"n/a ({reason})", "n/a")
    assert f"  wer: n/a: {reason}" in report_lines(figures)
    assert f"| WER | n/a ({reason}) | n/a |" in summary_markdown(figures)


def test_the_promotion_rule_reads_no_voice_wer():
    """The rule's inputs have no per-voice WER/CER at all: a null one cannot move the verdict."""
    assert not {"wer", "cer"} & set(Scores.__dataclass_fields__)
    scores = Scores(1.0, 0.0, {"spk": {"mean": 0.7}}, 0.0, [])
    assert decide(scores, scores, None, 0.05).criteria[-1].name == "did_not_forget"


def test_the_f0_panel_plots_no_pitch_the_tracker_could_not_find(tmp_path):
    """Clips without a pitch have no marker; when none has one, the panel says so in a sentence."""
    from voxpipe.evaluate.figure import plot
    from voxpipe.evaluate.metrics import Voice

    reason = "a steady 400 Hz tone, no intonation"
    records = {tag: [{"name": f"{i}", "speaker": "spk", "similarity_to_speaker": 0.5, "f0_median_hz": f0,
                      "f0_null_reason": None if f0 else reason} for i, f0 in enumerate([None, 210.0])]
               for tag in ("baseline", "model")}
    voices = {"spk": Voice("spk", np.ones(3), 220.0, [0.9, 0.95])}
    f0_ax = plot(tmp_path / "eval.png", records, voices).axes[1]
    plotted = [y for line in f0_ax.get_lines() for y in line.get_ydata() if np.isfinite(y)]
    assert plotted == [210.0, 210.0] and not f0_ax.texts  # one marker per checkpoint, none for the tone
    for tag in records:
        records[tag][1].update(f0_median_hz=None, f0_null_reason=reason)
    f0_ax = plot(tmp_path / "eval.png", records, voices).axes[1]
    assert [t.get_text() for t in f0_ax.texts] == [f"no generated clip has a pitch ({reason})"]
    assert (tmp_path / "eval.png").stat().st_size > 0

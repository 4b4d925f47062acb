"""The promotion rule, criterion by criterion, and the choice of the best export (pure functions: figures in,
verdict out). `evaluate` and `register` both go through these; their own tests run them end to end."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from voxpipe.errors import StepError
from voxpipe.evaluate.exports import Candidate, Scored, choose, find_candidates
from voxpipe.evaluate.promotion import LossReference, Scores, Verdict, decide, mean_ci, with_loss_reference

TOLERANCE = 0.05


def scores(loss=1.0, std=0.01, sims=None, stop=0.0, split=(), mos=3.0, premature=None) -> Scores:
    sims = sims or {"spk_f": [0.80, 0.82, 0.78, 0.80], "spk_m": [0.70, 0.72, 0.68, 0.70]}
    premature = stop if premature is None else premature
    return Scores(loss, std, {k: mean_ci(v) for k, v in sims.items()}, stop, list(split),
                  premature_stop_rate=premature, runaway_stop_rate=stop - premature, mos_ovrl=mos)


BASE = scores(loss=1.0)


def by_name(verdict: Verdict) -> dict[str, bool]:
    return {c.name: c.passed for c in verdict.criteria}


def criterion(verdict: Verdict, name: str):
    return next(c for c in verdict.criteria if c.name == name)


def test_a_candidate_better_in_loss_and_voice_is_promoted_with_every_criterion_recorded():
    v = decide(scores(loss=0.9), BASE, None, TOLERANCE)
    assert v.promoted and v.against == "baseline"
    assert by_name(v) == {"loss": True, "similarity[spk_f]": True, "similarity[spk_m]": True,
                          "stop_failures": True, "voice_split": True, "quality": True,
                          "did_not_forget": True}
    loss = v.criteria[0]
    assert (loss.candidate, loss.reference) == (0.9, 1.0) and loss.limit == pytest.approx(0.99)
    assert "improvement +0.10000" in loss.detail and "seed spread 0.01000" in loss.detail
    assert v.sentence().startswith("promoted over the baseline: loss ok")
    assert Verdict.from_dict(v.as_dict()) == v  # eval.json round trip


def test_loss_within_the_seed_spread_is_not_an_improvement():
    v = decide(scores(loss=0.985, std=0.02), BASE, None, TOLERANCE)
    assert not v.promoted and by_name(v)["loss"] is False
    assert "must exceed the seed spread 0.02000" in v.criteria[0].detail  # the larger of the two stds
    assert not decide(scores(loss=math.nan), BASE, None, TOLERANCE).promoted


def test_better_loss_and_worse_voice_is_not_promoted():
    """The complaint behind the rule: the loss falls while one speaker's voice drifts away."""
    drifted = scores(loss=0.5, sims={"spk_f": [0.80, 0.82, 0.78, 0.80], "spk_m": [0.60, 0.62, 0.58, 0.60]})
    v = decide(drifted, BASE, None, TOLERANCE)
    assert not v.promoted
    assert by_name(v) == {"loss": True, "similarity[spk_f]": True, "similarity[spk_m]": False,
                          "stop_failures": True, "voice_split": True, "quality": True,
                          "did_not_forget": True}
    (failed,) = v.failed()
    assert failed.limit == pytest.approx(0.70 - TOLERANCE) and failed.candidate == pytest.approx(0.60)
    assert "95% CI" in failed.detail and "similarity[spk_m] FAIL" in v.sentence()
    # a drop within the tolerance is not a failure
    within = scores(loss=0.5, sims={"spk_f": [0.80] * 4, "spk_m": [0.66] * 4})
    assert decide(within, BASE, None, TOLERANCE).promoted


def test_a_speaker_without_any_voice_fails_its_similarity():
    v = decide(scores(loss=0.5, sims={"spk_f": [0.8, 0.8], "spk_m": []}), BASE, None, TOLERANCE)
    assert by_name(v)["similarity[spk_m]"] is False and not v.promoted


def test_more_stop_failures_is_not_promoted():
    v = decide(scores(loss=0.5, stop=0.25), scores(stop=0.125), None, TOLERANCE)
    assert by_name(v)["stop_failures"] is False and not v.promoted
    assert decide(scores(loss=0.5, stop=0.125), scores(stop=0.125), None, TOLERANCE).promoted  # equal is fine


def test_premature_stops_count_as_stop_failures_beside_runaway_ones():
    """A model that stops at once (the random-init baseline) fails on stopping: a fine-tune that stops
    prematurely more often than its baseline is refused, and the detail says which way it failed."""
    v = decide(scores(loss=0.5, stop=0.5, premature=0.5), scores(stop=0.25, premature=0.0), None, TOLERANCE)
    stop = criterion(v, "stop_failures")
    assert not stop.passed and not v.promoted
    assert "premature 50%, runaway 0%" in stop.detail and "premature 0%, runaway 25%" in stop.detail


def test_a_quality_drop_beyond_the_tolerance_is_not_promoted():
    assert decide(scores(loss=0.5, mos=2.95), scores(mos=3.0), None, TOLERANCE, mos_tolerance=0.1).promoted
    v = decide(scores(loss=0.5, mos=2.8), scores(mos=3.0), None, TOLERANCE, mos_tolerance=0.1)
    quality = criterion(v, "quality")
    assert not v.promoted and not quality.passed and quality.limit == pytest.approx(2.9)
    assert "DNSMOS ovrl 2.80 vs baseline 3.00" in quality.detail
    # no figure: no pass
    assert not decide(scores(loss=0.5, mos=None), scores(mos=3.0), None, TOLERANCE).promoted
    # an eval.json from before the figure existed: the baseline has none, nothing to compare with
    old = Scores.from_dict({k: v for k, v in scores().as_dict().items() if k != "mos_ovrl"})
    assert old.mos_ovrl is None
    assert criterion(decide(scores(loss=0.5), old, None, TOLERANCE), "quality").passed


def test_a_new_voice_split_is_not_promoted_but_one_the_baseline_had_is_no_worse():
    v = decide(scores(loss=0.5, split=["spk_m/noref"]), BASE, None, TOLERANCE)
    assert by_name(v)["voice_split"] is False and "new: spk_m/noref" in criterion(v, "voice_split").detail
    same = decide(scores(loss=0.5, split=["spk_m/noref"]), scores(split=["spk_m/noref"]), None, TOLERANCE)
    assert same.promoted


def test_against_a_champion_only_the_loss_reference_changes():
    v = decide(scores(loss=0.9), BASE, None, TOLERANCE)
    champion = LossReference("champion v3", 0.88, 0.005)
    again = with_loss_reference(v, scores(loss=0.9), champion)
    assert not again.promoted and again.against == "champion v3"
    assert again.criteria[1:] == v.criteria[1:]  # the voice criteria stay the baseline's
    assert decide(scores(loss=0.85), BASE, champion, TOLERANCE).promoted


def test_confidence_interval():
    ci = mean_ci([0.7, 0.8, 0.9])
    # t(0.975, 2) = 4.3027; std 0.1; half width 4.3027 * 0.1 / sqrt(3)
    assert ci["mean"] == pytest.approx(0.8)
    assert ci["ci_high"] - ci["mean"] == pytest.approx(4.302653 * 0.1 / math.sqrt(3), rel=1e-5)
    assert mean_ci([0.5]) == {"mean": 0.5, "ci_low": None, "ci_high": None, "n": 1}
    assert mean_ci([])["mean"] is None


def scored(step: int, loss: float, similarity_m: float = 0.70) -> Scored:
    s = scores(loss=loss, sims={"spk_f": [0.80] * 4, "spk_m": [similarity_m] * 4})
    return Scored(Candidate(Path(f"exports/step-{step}"), step), s, decide(s, BASE, None, TOLERANCE))


def test_best_export_is_the_lowest_loss_that_keeps_the_voice():
    # step 30 has the lowest loss but lost spk_m's voice; step 20 passes the rule
    table = [scored(10, 0.98), scored(20, 0.90), scored(30, 0.80, similarity_m=0.5)]
    best, why = choose(table)
    assert best.candidate.step == 20 and "pass the rule" in why
    # nothing passes: keep the voice first, then the loss
    best, why = choose([scored(10, 1.2), scored(30, 0.80, similarity_m=0.5)])
    assert best.candidate.step == 10 and "keep the voice" in why
    best, why = choose([scored(10, 1.2, similarity_m=0.4), scored(30, 0.80, similarity_m=0.5)])
    assert best.candidate.step == 30 and "lowest loss" in why


def test_candidates_are_one_checkpoint_or_step_exports(tmp_path):
    one = tmp_path / "export"
    one.mkdir()
    (one / "config.json").write_text("{}")
    assert find_candidates(one) == [Candidate(one, None)]
    exports = tmp_path / "exports"
    for step in (20, 100, 60):
        (exports / f"step-{step}").mkdir(parents=True)
        (exports / f"step-{step}" / "config.json").write_text("{}")
    (exports / ".step-120.tmp").mkdir()  # a half-written export is not a candidate
    assert [c.step for c in find_candidates(exports)] == [20, 60, 100]
    with pytest.raises(StepError, match="neither a checkpoint"):
        find_candidates(tmp_path / "missing")


# -- 6. did not forget (evaluate.benchmark) -----------------------------------------------------------


def bench(loss=0.9, wer=None, cer=None) -> Scores:
    return Scores(loss, 0.01, BASE.similarity, 0.0, [], mos_ovrl=3.0, benchmark={"wer": wer, "cer": cer})


def test_no_benchmark_leaves_the_forgetting_criterion_unchecked_and_says_so():
    c = criterion(decide(scores(loss=0.9), BASE, None, TOLERANCE), "did_not_forget")
    assert c.passed and c.candidate is None and c.limit is None and "no evaluate.benchmark set" in c.detail


def test_the_benchmark_error_rate_may_rise_at_most_the_forget_tolerance():
    base = bench(loss=1.0, wer=0.030, cer=0.010)
    within = decide(bench(wer=0.049, cer=0.029), base, None, TOLERANCE, forget_tolerance=0.02)
    assert within.promoted and criterion(within, "did_not_forget").limit == pytest.approx(
        {"wer": 0.05, "cer": 0.03})
    worse = decide(bench(wer=0.051, cer=0.010), base, None, TOLERANCE, forget_tolerance=0.02)
    c = criterion(worse, "did_not_forget")
    assert not worse.promoted and not c.passed and [x.name for x in worse.failed()] == ["did_not_forget"]
    assert "WER 0.0510 vs baseline 0.0300, must be <= 0.0500" in c.detail
    # CER alone can fail it too; a fine-tune that lost its figure (no scored line) fails
    assert not criterion(decide(bench(wer=0.03, cer=0.04), base, None, TOLERANCE), "did_not_forget").passed
    assert not criterion(decide(bench(wer=None, cer=0.01), base, None, TOLERANCE), "did_not_forget").passed


def test_only_the_metrics_the_base_has_are_compared():
    base = bench(loss=1.0, wer=0.03, cer=None)  # an English set (or no Chinese recogniser): no CER
    c = criterion(decide(bench(wer=0.03, cer=0.9), base, None, TOLERANCE), "did_not_forget")
    assert c.passed and "CER" not in c.detail
    none = criterion(decide(bench(), bench(loss=1.0), None, TOLERANCE), "did_not_forget")
    assert none.passed and "no benchmark WER/CER" in none.detail


def test_scores_from_an_older_eval_json_have_no_benchmark():
    old = {k: v for k, v in BASE.as_dict().items() if k != "benchmark"}
    assert Scores.from_dict(old).benchmark is None

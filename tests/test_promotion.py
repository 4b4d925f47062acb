"""The promotion rule, criterion by criterion, and the choice of the best export (pure functions: figures in,
verdict out). `evaluate` and `register` both go through these; their own tests run them end to end."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from voxpipe.errors import StepError
from voxpipe.evaluate.exports import Candidate, Scored, choose, find_candidates
from voxpipe.evaluate.promotion import (
    CONSTANTS,
    Floor,
    LossReference,
    Scores,
    Verdict,
    decide,
    mean_ci,
    with_loss_reference,
)

TOLERANCE = 0.05


def scores(loss=1.0, std=0.01, sims=None, stop=0.0, split=(), mos=3.0, premature=None,
           paired=False) -> Scores:
    """A checkpoint's scores; `paired`: with per-clip figures too (clip i of a speaker: its i-th
    similarity, with a reference for even i), so the rule reads paired gains."""
    sims = sims or {"spk_f": [0.80, 0.82, 0.78, 0.80], "spk_m": [0.70, 0.72, 0.68, 0.70]}
    premature = stop if premature is None else premature
    clips = {f"{i:03d}-{speaker}": {"speaker": speaker, "with_reference": i % 2 == 0, "similarity": v,
                                    "stop_failures": stop, "quality": mos, "wer": None, "cer": None}
             for speaker, values in sims.items() for i, v in enumerate(values)} if paired else None
    return Scores(loss, std, {k: mean_ci(v) for k, v in sims.items()}, stop, list(split),
                  premature_stop_rate=premature, runaway_stop_rate=stop - premature, mos_ovrl=mos,
                  clips=clips)


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


# -- paired gains (gains.py): the rule reads the interval -------------------------------------------------


def test_identical_outputs_gain_zero_with_interval_zero_and_pass():
    same = scores(paired=True)
    v = decide(scores(loss=0.9, paired=True), same, None, TOLERANCE)
    for figure in ("similarity", "similarity[spk_f]", "similarity[spk_m]", "quality", "stop_failures"):
        g = v.gains[figure]
        assert (g["gain"], g["low"], g["high"]) == (0.0, 0.0, 0.0), figure
    assert v.gains["similarity"]["n"] == 8 and v.gains["similarity"]["strata"] == ["speaker", "reference"]
    assert v.gains["similarity"]["shown"] == "+0.0000 [+0.0000, +0.0000]"
    assert v.gains["wer"]["gain"] is None and "from both" in v.gains["wer"]["null_reason"]
    assert v.promoted and criterion(v, "similarity[spk_m]").gain["high"] == 0.0
    assert Verdict.from_dict(v.as_dict()) == v  # eval.json round trip, gains and tolerances too


def test_a_similarity_interval_that_straddles_minus_the_tolerance_is_refused():
    """The mean drop (0.04) is within the tolerance (0.05), so the means alone pass; but the clips
    disagree so much that a drop beyond 0.05 is not ruled out: refused."""
    base = {"spk_f": [0.80] * 8, "spk_m": [0.70] * 8}
    noisy = {"spk_f": [0.80] * 8, "spk_m": [0.56, 0.72, 0.58, 0.72, 0.57, 0.71, 0.71, 0.71]}
    assert decide(scores(loss=0.5, sims=noisy), scores(sims=base), None, TOLERANCE).promoted  # means: pass
    v = decide(scores(loss=0.5, sims=noisy, paired=True), scores(sims=base, paired=True), None, TOLERANCE)
    c = criterion(v, "similarity[spk_m]")
    assert c.gain["gain"] == pytest.approx(-0.04) and c.gain["low"] < -TOLERANCE < c.gain["high"]
    assert not c.passed and not v.promoted and c.limit == -TOLERANCE
    assert "low bound must be >= -0.05" in c.detail and "evaluate.similarity_tolerance" in c.detail
    # the same mean drop on every clip: the interval is tight, within the tolerance, promoted
    steady = {"spk_f": [0.80] * 8, "spk_m": [0.66] * 8}
    ok = decide(scores(loss=0.5, sims=steady, paired=True), scores(sims=base, paired=True), None, TOLERANCE)
    assert ok.promoted and ok.gains["similarity[spk_m]"]["low"] == pytest.approx(-0.04)


def test_the_bootstrap_is_stratified_by_speaker_and_reference_and_seeded():
    """Clips with a reference gain 0.1 and those without lose 0.1: resampled within each stratum every
    resample keeps the mix, so the interval is the point; pooled it would be wide."""
    from voxpipe.evaluate.gains import Pair, paired_gain

    pairs = [Pair(0.9 if i % 2 == 0 else 0.7, 0.8, "spk", i % 2 == 0) for i in range(8)]
    g = paired_gain(pairs)
    assert g.strata == ["speaker", "reference"] and g.gain == pytest.approx(0.0)
    assert g.low == pytest.approx(0.0) and g.high == pytest.approx(0.0)
    unstratified = paired_gain([Pair(p.candidate, p.reference) for p in pairs])  # one stratum
    assert unstratified.high - unstratified.low > 0.05
    # one clip per (speaker, reference): coarser strata; one clip: a gain, no interval, and why
    assert paired_gain(pairs[:4]).strata == ["speaker", "reference"]
    other = [Pair(0.8, 0.8, "other", True), Pair(0.81, 0.8, "other", False)]
    assert paired_gain([*pairs[:3], *other]).strata == ["speaker"]  # one clip of spk without a reference
    assert paired_gain([pairs[0], pairs[1], pairs[2]]).strata == []  # one speaker left: one stratum
    one = paired_gain(pairs[:1])
    assert one.gain == pytest.approx(0.1) and one.low is None and "one paired clip" in one.null_reason
    noisy = [Pair(0.8 + 0.01 * (i % 3), 0.8, "spk", True) for i in range(9)]
    assert paired_gain(noisy) == paired_gain(noisy)  # seeded: eval.json repeats


def test_a_measured_floor_sets_the_tolerances_and_the_verdict_names_it():
    base = {"spk_f": [0.80] * 8, "spk_m": [0.70] * 8}
    drop = {"spk_f": [0.80] * 8, "spk_m": [0.67] * 8}  # a steady 0.03 drop
    candidate, baseline = scores(loss=0.5, sims=drop, paired=True), scores(sims=base, paired=True)
    constants = decide(candidate, baseline, None, TOLERANCE)
    assert constants.promoted and constants.tolerances["source"] == CONSTANTS
    assert constants.tolerances["similarity[spk_m]"] == {"tolerance": TOLERANCE,
                                                         "from": "evaluate.similarity_tolerance"}
    floor = Floor({"similarity": 0.02, "quality": 0.05}, "the noise floor of noise.json (2 other seed(s))")
    v = decide(candidate, baseline, None, TOLERANCE, floor=floor)
    assert not v.promoted and [c.name for c in v.failed()] == ["similarity[spk_m]"]
    assert v.tolerances["source"] == floor.source
    assert v.tolerances["similarity[spk_m]"]["tolerance"] == 0.02
    assert v.tolerances["quality"]["tolerance"] == 0.05
    assert "noise floor of noise.json" in criterion(v, "similarity[spk_m]").detail
    # a speaker's own floor, where measured, before the pooled one
    own = Floor({"similarity": 0.02, "similarity[spk_m]": 0.04}, "floor")
    assert decide(candidate, baseline, None, TOLERANCE, floor=own).promoted


def test_quality_reads_its_interval_and_stop_and_forgetting_show_their_gains():
    v = decide(scores(loss=0.5, mos=2.85, paired=True), scores(mos=3.0, paired=True), None, TOLERANCE,
               mos_tolerance=0.1)
    quality = criterion(v, "quality")
    assert not quality.passed and quality.gain["gain"] == pytest.approx(-0.15) and quality.limit == -0.1
    stop = criterion(decide(scores(loss=0.5, stop=0.25, paired=True), scores(stop=0.0, paired=True), None,
                            TOLERANCE), "stop_failures")
    assert not stop.passed and stop.gain["gain"] == pytest.approx(0.25) and "gain +0.2500" in stop.detail

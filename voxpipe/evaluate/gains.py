"""Paired gains: how much the fine-tune moved each figure against the base's clip of the same text,
reference and seed, with a 95 % interval from a bootstrap over clips.

Two means with a Student-t interval each ignore that the base and the fine-tune said the same texts
with the same reference and seed: most of a clip's score is its text and its reference, not the
checkpoint. The difference per clip cancels that, so its mean (the gain, candidate minus base, in the
figure's own units: higher is better for similarity and DNSMOS, worse for stop failures and WER/CER)
has a far narrower interval than the two means suggest.

The interval is `scipy.stats.bootstrap`'s (percentile method, seeded: eval.json repeats) of the
mean paired difference, stratified: each stratum (a speaker with or without a reference clip) is one
sample of `data`, and scipy resamples every sample on its own, so a resample keeps each stratum's size
and the statistic (the stratum means weighted by their sizes) is the pooled mean. A stratum needs two
clips to be resampled; when one has fewer, the strata are coarsened (by speaker, then none) and
`strata` says which were used.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 9999
BATCH = 1000  # resamples computed at once: a benchmark of a thousand lines stays within a few MB
SEED = 0  # the bootstrap's own: the same clips give the same interval in every run
# coarser and coarser: (speaker, with/without reference), the speaker, one stratum
STRATA = (("speaker", "reference"), ("speaker",), ())


@dataclass(frozen=True)
class Gain:
    """One figure's paired gain (candidate minus reference) and its interval; null with the reason."""

    gain: float | None
    low: float | None
    high: float | None
    n: int  # paired clips
    strata: list[str]  # what the bootstrap was stratified by ([] = not stratified)
    null_reason: str | None = None  # why there is no gain, or no interval

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "shown": self.shown()}

    def shown(self, spec: str = "+.4f") -> str:
        """`gain [low, high]`, `gain [no interval: why]` or `n/a (why)`."""
        if self.gain is None:
            return f"n/a ({self.null_reason})"
        if self.low is None or self.high is None:
            return f"{self.gain:{spec}} [no interval: {self.null_reason}]"
        return f"{self.gain:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"


@dataclass(frozen=True)
class Pair:
    """One clip's figure from both checkpoints, and what it is stratified by."""

    candidate: float
    reference: float
    speaker: str = ""
    with_reference: bool = True

    def stratum(self, by: tuple[str, ...]) -> tuple[Any, ...]:
        return tuple(self.speaker if key == "speaker" else self.with_reference for key in by)


def _strata(pairs: list[Pair]) -> tuple[tuple[str, ...], list[np.ndarray]]:
    """The finest stratification whose every stratum has two clips or more, and its samples of diffs."""
    for by in STRATA:
        groups: dict[tuple[Any, ...], list[float]] = {}
        for p in pairs:
            groups.setdefault(p.stratum(by), []).append(p.candidate - p.reference)
        if all(len(g) >= 2 for g in groups.values()):
            samples = [np.asarray(groups[k], dtype=np.float64) for k in sorted(groups, key=str)]
            return (by if len(groups) > 1 else ()), samples  # one stratum: not stratified
    raise AssertionError("unreachable: one stratum of two or more clips always qualifies")


def paired_gain(pairs: Iterable[Pair]) -> Gain:
    """The mean paired difference and its stratified bootstrap interval."""
    pairs = list(pairs)
    if not pairs:
        return Gain(None, None, None, 0, [], "no clip has this figure from both checkpoints")
    diffs = np.asarray([p.candidate - p.reference for p in pairs], dtype=np.float64)
    gain = float(diffs.mean())
    if len(pairs) < 2:
        return Gain(gain, None, None, 1, [], "one paired clip: nothing to resample")
    by, samples = _strata(pairs)
    if all(np.ptp(s) == 0 for s in samples):  # every resample is the same: the interval is the point
        point = float(sum(s.sum() for s in samples) / len(diffs))
        return Gain(point, point, point, len(diffs), list(by))
    from scipy.stats import bootstrap

    weights = [len(s) / len(diffs) for s in samples]

    def pooled_mean(*resampled: np.ndarray, axis: int = -1) -> np.ndarray:
        return sum(w * r.mean(axis=axis) for w, r in zip(weights, resampled, strict=True))

    result = bootstrap(samples, pooled_mean, n_resamples=RESAMPLES, batch=BATCH,
                       confidence_level=CONFIDENCE, method="percentile", vectorized=True,
                       rng=np.random.default_rng(SEED))
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    return Gain(gain, low, high, len(diffs), list(by))


def clip_pairs(candidate: dict[str, dict[str, Any]], reference: dict[str, dict[str, Any]], figure: str,
               speaker: str | None = None) -> list[Pair]:
    """The clips (by their key: same text, reference and seed) that have `figure` from both checkpoints;
    only `speaker`'s when given."""
    out = []
    for key in sorted(candidate.keys() & reference.keys()):
        mine, base = candidate[key], reference[key]
        if speaker is not None and mine.get("speaker") != speaker:
            continue
        if mine.get(figure) is None or base.get(figure) is None:
            continue
        out.append(Pair(float(mine[figure]), float(base[figure]), mine.get("speaker", ""),
                        bool(mine.get("with_reference", True))))
    return out


GAIN_METHOD = (f"candidate minus baseline per paired clip (same text, reference and seed), mean; "
               f"{CONFIDENCE:.0%} interval: scipy.stats.bootstrap, percentile, {RESAMPLES} resamples, seed "
               f"{SEED}, stratified by speaker and with/without reference (coarser where a stratum has one "
               "clip)")
# figure -> what it is, in eval.json's `gains` (the per-clip key each Scores.clips entry holds)
FIGURES = {
    "similarity": "similarity_to_speaker of each clip (the rule's similarity)",
    "stop_failures": "1 for a clip that stopped wrong (premature or runaway), else 0",
    "quality": "DNSMOS overall MOS of each clip",
    "wer": "WER of each clip in a word-spaced language",
    "cer": "CER of each clip in Chinese",
    "benchmark_wer": "WER of each line of evaluate.benchmark",
    "benchmark_cer": "CER of each line of evaluate.benchmark",
    "benchmark_sim": "SIM (cosine to its prompt clip) of each line of evaluate.benchmark",
}


def paired_gains(candidate: dict[str, dict[str, Any]], reference: dict[str, dict[str, Any]]
                 ) -> dict[str, Gain]:
    """Every figure's gain, then similarity per speaker (`similarity[<speaker>]`, the rule reads these)."""
    out = {figure: paired_gain(clip_pairs(candidate, reference, figure)) for figure in FIGURES}
    for figure in ("benchmark_wer", "benchmark_cer", "benchmark_sim"):
        if out[figure].n == 0:
            out[figure] = Gain(None, None, None, 0, [], "no evaluate.benchmark line has it from both")
    speakers = sorted({c["speaker"] for c in (*candidate.values(), *reference.values()) if c.get("speaker")})
    for speaker in speakers:
        out[f"similarity[{speaker}]"] = paired_gain(clip_pairs(candidate, reference, "similarity", speaker))
    return out


def flat_gains(gains: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """eval.json's top-level numbers (DVC, MLflow's eval/*): `<figure>_gain`, `_gain_low`, `_gain_high` for
    each FIGURES figure, and `<figure>_gain_null_reason` where there is no interval."""
    out: dict[str, Any] = {}
    for figure in FIGURES:
        g = gains.get(figure) or {"gain": None, "low": None, "high": None, "null_reason": "not compared"}
        out[f"{figure}_gain"] = g["gain"]
        out[f"{figure}_gain_low"], out[f"{figure}_gain_high"] = g["low"], g["high"]
        if g["low"] is None:
            out[f"{figure}_gain_null_reason"] = g["null_reason"]
    return out

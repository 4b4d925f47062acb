"""The promotion rule: is a fine-tuned checkpoint better, without losing the voice?

Loss alone is not enough: upstream users see the validation loss fall while the timbre drifts to
another speaker, and the reverse. A candidate is promoted only when every criterion holds:

1. loss: its fixed-seed loss beats the reference's (the champion's, or the baseline's when there
   is no champion) by more than the seed spread (the larger std over seeds of the two);
2. similarity, per target speaker: its mean speaker similarity is not below the baseline's by more
   than `tolerance` (GE2E cosine; 95 % confidence intervals recorded beside the means);
3. stop failures: its rate of stop failures is not higher, counting both ways a clip can stop wrong:
   a runaway one (no stop predicted within the limit) and a premature one (shorter than
   `evaluate.min_duration_ratio` of the length the speaker's speaking rate gives its text), so a
   model that says nothing at all fails here too;
4. voice split: no (speaker, with/without reference) group splits into two voices that did not
   already split for the baseline;
5. quality: its mean DNSMOS overall MOS is not below the baseline's by more than `mos_tolerance`;
6. did not forget: on the standard test set (`evaluate.benchmark`, voxpipe/evaluate/benchmark_set.py),
   its WER and CER (each the set has) are not above the baseline's by more than `forget_tolerance`
   (absolute: 0.02 = two points); not checked, and said so, when no benchmark is set.

Criterion 2's similarity is `similarity_to_speaker` (each clip against the mean embedding of its
speaker's real clips), not the protocol's `similarity_to_prompt`: the rule asks whether the voice
stayed the speaker's, with or without a reference clip.

The voice criteria always compare with the baseline measured in the same `evaluate` run (same
texts, references and seeds: a paired comparison), so a chain of promotions cannot drift away
from the base voice by a tolerance at a time. `evaluate`, `--require-improvement`, the choice of
the best export and `register` all call `decide`, so they cannot disagree.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from voxpipe.steps.evaluate import EvaluateParams

CONFIDENCE = 0.95
DEFAULT_MOS_TOLERANCE = EvaluateParams.model_fields["mos_tolerance"].default
DEFAULT_FORGET_TOLERANCE = EvaluateParams.model_fields["forget_tolerance"].default


def mean_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """Mean and its Student-t confidence interval (None bounds for fewer than 2 values)."""
    n = len(values)
    if n == 0:
        return {"mean": None, "ci_low": None, "ci_high": None, "n": 0}
    mean = statistics.fmean(values)
    if n < 2:
        return {"mean": mean, "ci_low": None, "ci_high": None, "n": n}
    from scipy.stats import t

    half = float(t.ppf(0.5 + confidence / 2, n - 1)) * statistics.stdev(values) / math.sqrt(n)
    return {"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "n": n}


@dataclass(frozen=True)
class Scores:
    """What the rule needs to know about one checkpoint, from one `evaluate` run."""

    loss: float  # fixed-seed total loss, mean over seeds
    loss_std: float  # std over seeds
    similarity: dict[str, dict[str, Any]]  # speaker -> mean_ci of its utterances' similarity_to_speaker
    stop_failure_rate: float | None  # premature + runaway
    split_groups: list[str]  # "speaker/ref" | "speaker/noref" groups flagged as two voices
    premature_stop_rate: float | None = None
    runaway_stop_rate: float | None = None
    mos_ovrl: float | None = None  # mean DNSMOS overall MOS of the generated clips
    benchmark: dict[str, float | None] | None = None  # {"wer", "cer"} on evaluate.benchmark; None: no set

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Scores:
        """From eval.json's `scores` (an older eval.json lacks the keys with defaults)."""
        fields = cls.__dataclass_fields__
        return cls(**{k: d[k] for k in fields if k in d})


@dataclass(frozen=True)
class LossReference:
    """The loss to beat: the baseline's from the same evaluation, or the champion's on the same val set."""

    label: str  # "baseline", "champion v3"
    loss: float
    loss_std: float


@dataclass(frozen=True)
class Criterion:
    name: str  # "loss", "similarity[spk_f]", "stop_failures", "voice_split", "quality"
    candidate: Any
    reference: Any
    limit: Any  # the bound the candidate had to meet
    passed: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    promoted: bool
    against: str  # the loss reference's label
    criteria: list[Criterion] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"promoted": self.promoted, "against": self.against,
                "criteria": [c.as_dict() for c in self.criteria]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Verdict:
        return cls(d["promoted"], d["against"], [Criterion(**c) for c in d["criteria"]])

    def failed(self) -> list[Criterion]:
        return [c for c in self.criteria if not c.passed]

    def sentence(self) -> str:
        """One line: the verdict, then every criterion as `name ok|FAIL (numbers)`."""
        head = f"{'promoted' if self.promoted else 'not promoted'} over the {self.against}"
        parts = [f"{c.name} {'ok' if c.passed else 'FAIL'} ({c.detail})" for c in self.criteria]
        return f"{head}: " + "; ".join(parts)


def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "n/a" if x is None else format(x, spec)


def loss_criterion(candidate: Scores, reference: LossReference) -> Criterion:
    spread = max(candidate.loss_std, reference.loss_std)
    margin = reference.loss - candidate.loss
    limit = reference.loss - spread
    passed = math.isfinite(candidate.loss) and margin > spread
    detail = (f"{candidate.loss:.5f} vs {reference.label} {reference.loss:.5f}: improvement {margin:+.5f}, "
              f"must exceed the seed spread {spread:.5f}")
    return Criterion("loss", candidate.loss, reference.loss, limit, passed, detail)


def similarity_criteria(candidate: Scores, baseline: Scores, tolerance: float) -> list[Criterion]:
    out = []
    for speaker in sorted(set(candidate.similarity) | set(baseline.similarity)):
        mine = candidate.similarity.get(speaker, {}).get("mean")
        base = baseline.similarity.get(speaker, {}).get("mean")
        name = f"similarity[{speaker}]"
        if base is None:
            out.append(Criterion(name, mine, base, None, True, "the baseline has no voice to compare with"))
            continue
        limit = base - tolerance
        if mine is None:
            out.append(Criterion(name, mine, base, limit, False, "no generated clip of it has a voice"))
            continue
        ci = candidate.similarity[speaker]
        ci_text = "" if ci.get("ci_low") is None else f" (95% CI {ci['ci_low']:.3f}..{ci['ci_high']:.3f})"
        out.append(Criterion(
            name, mine, base, limit, mine >= limit,
            f"{mine:.3f}{ci_text} vs baseline {base:.3f}, must be >= {limit:.3f} (tolerance {tolerance:g})",
        ))
    return out


def stop_criterion(candidate: Scores, baseline: Scores) -> Criterion:
    mine, base = candidate.stop_failure_rate, baseline.stop_failure_rate
    passed = base is None or (mine is not None and mine <= base)

    def split(s: Scores) -> str:
        return f"premature {_fmt(s.premature_stop_rate, '.0%')}, runaway {_fmt(s.runaway_stop_rate, '.0%')}"

    return Criterion("stop_failures", mine, base, base, passed,
                     f"rate {_fmt(mine, '.0%')} ({split(candidate)}) vs baseline {_fmt(base, '.0%')} "
                     f"({split(baseline)}), must not be higher")


def mos_criterion(candidate: Scores, baseline: Scores, tolerance: float) -> Criterion:
    mine, base = candidate.mos_ovrl, baseline.mos_ovrl
    if base is None:
        return Criterion("quality", mine, base, None, True,
                         "the baseline has no DNSMOS figure to compare with")
    limit = base - tolerance
    passed = mine is not None and mine >= limit
    return Criterion("quality", mine, base, limit, passed,
                     f"DNSMOS ovrl {_fmt(mine, '.2f')} vs baseline {base:.2f}, must be >= {limit:.2f} "
                     f"(tolerance {tolerance:g})")


def forget_criterion(candidate: Scores, baseline: Scores, tolerance: float) -> Criterion:
    """The fine-tune's error rates on the standard test set against the base's, each metric the set has."""
    if candidate.benchmark is None or baseline.benchmark is None:
        return Criterion("did_not_forget", None, None, None, True,
                         "not checked: no evaluate.benchmark set (null)")
    parts, passed = [], True
    limits: dict[str, float | None] = {}
    for metric in ("wer", "cer"):
        mine, base = candidate.benchmark.get(metric), baseline.benchmark.get(metric)
        if base is None:
            continue
        limits[metric] = base + tolerance
        ok = mine is not None and mine <= base + tolerance
        passed = passed and ok
        parts.append(f"{metric.upper()} {_fmt(mine)} vs baseline {base:.4f}, must be <= {limits[metric]:.4f}")
    if not parts:
        return Criterion("did_not_forget", candidate.benchmark, baseline.benchmark, None, True,
                         "not checked: the base has no benchmark WER/CER (no recogniser covers the set)")
    return Criterion("did_not_forget", candidate.benchmark, baseline.benchmark, limits, passed,
                     "; ".join(parts) + f" (benchmark, tolerance {tolerance:g})")


def split_criterion(candidate: Scores, baseline: Scores) -> Criterion:
    new = sorted(set(candidate.split_groups) - set(baseline.split_groups))
    detail = (f"{len(candidate.split_groups)} split group(s) vs baseline {len(baseline.split_groups)}"
              + (f"; new: {', '.join(new)}" if new else ""))
    return Criterion("voice_split", candidate.split_groups, baseline.split_groups, baseline.split_groups,
                     not new, detail)


def voice_criteria(
    candidate: Scores, baseline: Scores, tolerance: float, mos_tolerance: float,
    forget_tolerance: float = DEFAULT_FORGET_TOLERANCE,
) -> list[Criterion]:
    """Criteria 2-6: the candidate against the baseline of the same evaluation."""
    return [*similarity_criteria(candidate, baseline, tolerance), stop_criterion(candidate, baseline),
            split_criterion(candidate, baseline), mos_criterion(candidate, baseline, mos_tolerance),
            forget_criterion(candidate, baseline, forget_tolerance)]


def decide(candidate: Scores, baseline: Scores, reference: LossReference | None, tolerance: float,
           mos_tolerance: float = DEFAULT_MOS_TOLERANCE,
           forget_tolerance: float = DEFAULT_FORGET_TOLERANCE) -> Verdict:
    """The whole rule; `reference` None = the baseline's loss is the one to beat."""
    reference = reference or LossReference("baseline", baseline.loss, baseline.loss_std)
    criteria = [loss_criterion(candidate, reference),
                *voice_criteria(candidate, baseline, tolerance, mos_tolerance, forget_tolerance)]
    return Verdict(all(c.passed for c in criteria), reference.label, criteria)


def with_loss_reference(verdict: Verdict, candidate: Scores, reference: LossReference) -> Verdict:
    """The same voice criteria, the loss criterion redone against another reference (the champion)."""
    criteria = [loss_criterion(candidate, reference), *(c for c in verdict.criteria if c.name != "loss")]
    return Verdict(all(c.passed for c in criteria), reference.label, criteria)

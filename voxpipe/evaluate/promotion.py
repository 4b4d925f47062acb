"""The promotion rule: is a fine-tuned checkpoint better, without losing the voice?

Loss alone is not enough: upstream users see the validation loss fall while the timbre drifts to
another speaker, and the reverse. A candidate is promoted only when every criterion holds:

1. loss: its fixed-seed loss beats the reference's (the champion's, or the baseline's when there
   is no champion) by more than the seed spread (the larger std over seeds of the two);
2. similarity, per target speaker: the paired gain over the baseline's clips of the same texts,
   references and seeds (gains.py) is not worse than `-tolerance` anywhere in its 95 % interval: the
   interval's low bound is at least `-tolerance`, so a drop the clips cannot rule out is refused;
3. stop failures: its rate of stop failures is not higher, counting both ways a clip can stop wrong:
   a runaway one (no stop predicted within the limit) and a premature one (shorter than
   `evaluate.min_duration_ratio` of the length the speaker's speaking rate gives its text), so a
   model that says nothing at all fails here too;
4. voice split: no (speaker, with/without reference) group splits into two voices that did not
   already split for the baseline;
5. quality: the paired DNSMOS overall MOS gain's low bound is at least `-mos_tolerance`;
6. did not forget: on the standard test set (`evaluate.benchmark`, voxpipe/evaluate/benchmark_set.py),
   its WER and CER (each the set has) are not above the baseline's by more than `forget_tolerance`
   (absolute: 0.02 = two points); not checked, and said so, when no benchmark is set.

Every compared figure gets its paired gain and interval (`Verdict.gains`, eval.json's `gains`);
criteria 2 and 5 read them (scores without per-clip figures, from an older eval.json, fall back to the
means). The tolerances are the measured noise floor's (evaluate.noise_runs, noise.py) when one fits this
evaluation, else the constants; `Verdict.tolerances` says which, per criterion.

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
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from voxpipe.evaluate.gains import Gain, paired_gains
from voxpipe.steps.evaluate import EvaluateParams

CONFIDENCE = 0.95
DEFAULT_MOS_TOLERANCE = EvaluateParams.model_fields["mos_tolerance"].default
DEFAULT_FORGET_TOLERANCE = EvaluateParams.model_fields["forget_tolerance"].default
CONSTANTS = "the constants (evaluate.similarity_tolerance, mos_tolerance, forget_tolerance)"


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
    # clip key (same text, reference and seed in both checkpoints) -> its figures (gains.FIGURES) and
    # speaker/with_reference: what the paired gains pair; None in an older eval.json
    clips: dict[str, dict[str, Any]] | None = None

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
    gain: dict[str, Any] | None = None  # the paired gain and its interval (Gain.as_dict), where paired

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Floor:
    """A measured noise floor (noise.py): each figure's worst change from the generation seed alone."""

    spreads: dict[str, float]  # gains figure name ("similarity", "similarity[spk_f]", "quality") -> spread
    source: str  # where it was measured: "noise floor of work/eval/noise.json (3 seeds)"


@dataclass(frozen=True)
class Tolerances:
    """The tolerance each criterion used, and where it came from (the floor's figure or a constant)."""

    similarity: float
    mos: float
    forget: float
    floor: Floor | None = None

    def of(self, figure: str) -> tuple[float, str]:
        """(tolerance, its source) for a gains figure; a similarity[speaker] falls back to the pooled one."""
        spreads = self.floor.spreads if self.floor else {}
        constant = {"quality": (self.mos, "evaluate.mos_tolerance")}.get(
            figure, (self.similarity, "evaluate.similarity_tolerance"))
        for key in (figure, figure.split("[")[0]):
            if key in spreads and self.floor:
                return spreads[key], f"{self.floor.source}: {key}"
        return constant

    def source(self) -> str:
        return self.floor.source if self.floor else CONSTANTS


@dataclass(frozen=True)
class Verdict:
    promoted: bool
    against: str  # the loss reference's label
    criteria: list[Criterion] = field(default_factory=list)
    gains: dict[str, dict[str, Any]] = field(default_factory=dict)  # figure -> Gain.as_dict
    tolerances: dict[str, Any] = field(default_factory=dict)  # {"source", criterion -> {tolerance, from}}

    def as_dict(self) -> dict[str, Any]:
        return {"promoted": self.promoted, "against": self.against,
                "criteria": [c.as_dict() for c in self.criteria], "gains": self.gains,
                "tolerances": self.tolerances}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Verdict:
        return cls(d["promoted"], d["against"], [Criterion(**c) for c in d["criteria"]], d.get("gains", {}),
                   d.get("tolerances", {}))

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


def _reads_interval(name: str, gain: Gain, tolerance: float, source: str, mine: float | None,
                    base: float | None, spec: str) -> Criterion:
    """A criterion on a paired gain: its interval's low bound (the gain itself when one clip gives no
    interval) is at least -tolerance."""
    bound = gain.low if gain.low is not None else gain.gain
    passed = bound is not None and bound >= -tolerance
    means = f"{_fmt(mine, spec.lstrip('+'))} vs baseline {_fmt(base, spec.lstrip('+'))}"
    detail = (f"gain {gain.shown(spec)} over {gain.n} paired clip(s) ({means}), low bound must be "
              f">= {-tolerance:+g} (tolerance from {source})")
    return Criterion(name, mine, base, -tolerance, passed, detail, gain.as_dict())


def similarity_criteria(candidate: Scores, baseline: Scores, tolerances: Tolerances,
                        gains: dict[str, Gain] | None = None) -> list[Criterion]:
    out = []
    for speaker in sorted(set(candidate.similarity) | set(baseline.similarity)):
        mine = candidate.similarity.get(speaker, {}).get("mean")
        base = baseline.similarity.get(speaker, {}).get("mean")
        name = f"similarity[{speaker}]"
        tolerance, source = tolerances.of(name)
        if base is None:
            out.append(Criterion(name, mine, base, None, True, "the baseline has no voice to compare with"))
            continue
        if mine is None:
            out.append(Criterion(name, mine, base, base - tolerance, False,
                                 "no generated clip of it has a voice"))
            continue
        if gains is not None and name in gains:
            out.append(_reads_interval(name, gains[name], tolerance, source, mine, base, "+.3f"))
            continue
        limit = base - tolerance
        ci = candidate.similarity[speaker]
        ci_text = "" if ci.get("ci_low") is None else f" (95% CI {ci['ci_low']:.3f}..{ci['ci_high']:.3f})"
        out.append(Criterion(
            name, mine, base, limit, mine >= limit,
            f"{mine:.3f}{ci_text} vs baseline {base:.3f}, must be >= {limit:.3f} (tolerance {tolerance:g}; "
            "no per-clip figures to pair)",
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


def mos_criterion(candidate: Scores, baseline: Scores, tolerances: Tolerances,
                  gains: dict[str, Gain] | None = None) -> Criterion:
    mine, base = candidate.mos_ovrl, baseline.mos_ovrl
    tolerance, source = tolerances.of("quality")
    if base is None:
        return Criterion("quality", mine, base, None, True,
                         "the baseline has no DNSMOS figure to compare with")
    if gains is not None and gains["quality"].gain is not None:
        return _reads_interval("quality", gains["quality"], tolerance, source, mine, base, "+.2f")
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


def _with_gain(criterion: Criterion, gains: dict[str, Gain] | None, *figures: str) -> Criterion:
    """The criterion with its paired gain(s) shown beside it (the rule itself stays as it was)."""
    if gains is None:
        return criterion
    mine = {f: gains[f] for f in figures if gains[f].gain is not None}
    if not mine:
        return criterion
    shown = "; ".join(f"{f} gain {g.shown()}" for f, g in mine.items())
    single = (next(iter(mine.values())).as_dict() if len(mine) == 1 else
              {f: g.as_dict() for f, g in mine.items()})
    return replace(criterion, detail=f"{criterion.detail}; {shown}", gain=single)


def voice_criteria(candidate: Scores, baseline: Scores, tolerances: Tolerances,
                   gains: dict[str, Gain] | None = None) -> list[Criterion]:
    """Criteria 2-6: the candidate against the baseline of the same evaluation."""
    return [*similarity_criteria(candidate, baseline, tolerances, gains),
            _with_gain(stop_criterion(candidate, baseline), gains, "stop_failures"),
            split_criterion(candidate, baseline), mos_criterion(candidate, baseline, tolerances, gains),
            _with_gain(forget_criterion(candidate, baseline, tolerances.forget), gains,
                       "benchmark_wer", "benchmark_cer")]


def tolerance_record(tolerances: Tolerances, criteria: list[Criterion]) -> dict[str, Any]:
    """eval.json's `promotion.tolerances`: the source, then each criterion's tolerance and its origin."""
    out: dict[str, Any] = {"source": tolerances.source()}
    for c in criteria:
        if c.name.startswith(("similarity[", "quality")):
            value, source = tolerances.of(c.name)
            out[c.name] = {"tolerance": value, "from": source}
    out["did_not_forget"] = {"tolerance": tolerances.forget, "from": "evaluate.forget_tolerance"}
    return out


def decide(candidate: Scores, baseline: Scores, reference: LossReference | None, tolerance: float,
           mos_tolerance: float = DEFAULT_MOS_TOLERANCE,
           forget_tolerance: float = DEFAULT_FORGET_TOLERANCE, floor: Floor | None = None) -> Verdict:
    """The whole rule; `reference` None = the baseline's loss is the one to beat; `floor` (a measured noise
    floor) gives the tolerances its figures have, the constants the rest."""
    reference = reference or LossReference("baseline", baseline.loss, baseline.loss_std)
    tolerances = Tolerances(tolerance, mos_tolerance, forget_tolerance, floor)
    gains = (paired_gains(candidate.clips, baseline.clips)
             if candidate.clips is not None and baseline.clips is not None else None)
    criteria = [loss_criterion(candidate, reference), *voice_criteria(candidate, baseline, tolerances, gains)]
    return Verdict(all(c.passed for c in criteria), reference.label, criteria,
                   {k: g.as_dict() for k, g in (gains or {}).items()}, tolerance_record(tolerances, criteria))


def with_loss_reference(verdict: Verdict, candidate: Scores, reference: LossReference) -> Verdict:
    """The same voice criteria, the loss criterion redone against another reference (the champion)."""
    criteria = [loss_criterion(candidate, reference), *(c for c in verdict.criteria if c.name != "loss")]
    return Verdict(all(c.passed for c in criteria), reference.label, criteria, verdict.gains,
                   verdict.tolerances)

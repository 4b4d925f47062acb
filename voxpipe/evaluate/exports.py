"""The best export, not the last: which checkpoints `evaluate` scores, and which one it keeps.

A run that peaks at step 600 of 1000 should ship step 600. With `train.export_every` the trainer
writes `exports/step-N/` (the last `train.keep_exports` of them, the final step always among
them); `evaluate.model` may name that folder, and then every export is scored (fixed-seed loss and
voice metrics against the same baseline) and the promotion rule picks one: among the exports that
pass it the lowest loss; when none passes, the lowest loss among those that keep the voice; else
the lowest loss. `eval.json` records the whole table and the choice; `exports.png` plots it.
Candidates come in kinds: the exports as saved (`live`), their EMA siblings `step-N-ema/` (`ema`,
train.ema_decay) and the average of the best k (`average`, evaluate.average_top_k: average.py); one
rule judges them all, and `candidate_kind` says which kind won.
Only the exports of the run in the folder are scored (`own_exports`); the others are listed, with why.
Whose export it is, is what its signed `voxpipe-run.json` says once it verifies (voxpipe/train/identity.py):
one copied from another export, edited or unsigned is never taken as this run's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voxpipe.errors import StepError
from voxpipe.evaluate.promotion import Scores, Verdict
from voxpipe.files import step_folders
from voxpipe.integrity import KEY_ENV, signing_key
from voxpipe.train.ema import EMA_SUFFIX
from voxpipe.train.identity import IDENTITY_FILE, folder_run, identity_or_why
from voxpipe.voxcpm2_format import is_checkpoint

LIVE, EMA, AVERAGE = "live", "ema", "average"  # candidate kinds


def sample_tag(step: int | None, kind: str = LIVE) -> str:
    """What a checkpoint's sample files start with (`<tag>-<utterance>.wav`): `step-<N>` for an export of
    step N (`step-<N>-ema` for its EMA sibling), `average` for the top-k average, the historical "model" for
    a single checkpoint. register finds the chosen export's clips by it."""
    if kind == AVERAGE:
        return AVERAGE
    return "model" if step is None else f"step-{step}{EMA_SUFFIX if kind == EMA else ''}"


@dataclass(frozen=True)
class Candidate:
    path: Path
    step: int | None  # None: a single checkpoint folder (which step it is, the folder does not say)
    kind: str = LIVE  # LIVE, EMA or AVERAGE

    @property
    def tag(self) -> str:
        """Names its sample files (sample_tag)."""
        return sample_tag(self.step, self.kind)


def find_candidates(path: Path) -> list[Candidate]:
    """One checkpoint folder (has config.json), or a folder of `step-N/` checkpoints, oldest first."""
    if is_checkpoint(path):
        return [Candidate(path, None)]
    found = []
    for step, child in step_folders(path):
        if is_checkpoint(child):
            found.append(Candidate(child, step))
            if is_checkpoint(ema := child.with_name(child.name + EMA_SUFFIX)):
                found.append(Candidate(ema, step, EMA))
    if not found:
        raise StepError(
            f"{path}: neither a checkpoint (no config.json) nor a folder of step-N/ exports; point "
            "evaluate.model at the train step's export/ or, with train.export_every, its exports/"
        )
    return sorted(found, key=lambda c: (c.step or 0, c.kind != LIVE))


@dataclass(frozen=True)
class RunExports:
    """The exports `evaluate` scores: those of the run in its `--model` folder, and the others, with why."""

    candidates: list[Candidate]
    skipped: list[dict[str, Any]]  # {"path", "step", "run", "why"}
    run: str | None  # the run's identity hash (None: nothing records one)
    source: str  # where the run's identity was read, or why there is none

    def as_dict(self) -> dict[str, Any]:
        return {"run": self.run, "identity_from": self.source, "skipped": self.skipped,
                "scored": [str(c.path) for c in self.candidates]}


def own_exports(path: Path) -> RunExports:
    """`find_candidates`, less the exports that another run wrote (voxpipe/train/identity.py).

    A folder of step-N exports belongs to the run in its parent folder (its newest checkpoint, else its
    report.json); without one, to the run of its newest export. One checkpoint folder is scored as named,
    unless it carries a voxpipe-run.json that does not verify."""
    candidates = find_candidates(path)
    # the key only where something claims a run (a folder of plain checkpoints needs none)
    claims = [c.path / IDENTITY_FILE for c in candidates]
    if candidates[0].step is not None:
        claims += [path.parent / "checkpoints", path.parent / "report.json"]
    key = signing_key(path) if any(p.exists() for p in claims) else b""
    if candidates[0].step is None:
        if not (path / IDENTITY_FILE).is_file():
            return RunExports(candidates, [], None, "the checkpoint named by evaluate.model")
        found, why = identity_or_why(path, key)
        if found is None:
            raise StepError(
                f"{path}: not scored, since its {IDENTITY_FILE} does not verify: {why}. Scoring it would "
                "credit these weights to a run that did not write them. Point evaluate.model at the export "
                f"your train wrote (its export/ or exports/), rerun train to write it again, or, to score "
                f"the folder as an anonymous checkpoint, delete its {IDENTITY_FILE}")
        return RunExports(candidates, [], found["run"], "the checkpoint named by evaluate.model")
    identity, source = folder_run(path.parent, key)
    checked = {c.path: identity_or_why(c.path, key) for c in candidates}
    if identity is None:
        for c in reversed(candidates):
            if (found := checked[c.path][0]) is not None:
                identity = found
                source = f"the newest export that verifies ({c.path.name}): no run folder around it"
                break
    if identity is None:
        claimed = [c for c in candidates if (c.path / IDENTITY_FILE).is_file()]
        if claimed:
            raise StepError(
                f"{path}: not scored, since no export's {IDENTITY_FILE} verifies (the first: "
                f"{checked[claimed[0].path][1]}) and nothing else names the run, so these weights cannot "
                "be credited to any run. Point evaluate.model at the exports your train wrote, run evaluate "
                f"with the key that signed them ({KEY_ENV}, else the local key file), or rerun train to "
                "write them again")
        return RunExports(candidates, [], None, "nothing records a run identity (exports written before "
                                                "voxpipe recorded one): all are scored")
    kept, skipped = [], []
    for c in candidates:
        mine, why = checked[c.path]
        if mine is not None and mine["run"] == identity["run"]:
            kept.append(c)
            continue
        if mine is not None:
            why = (f"written by another run ({mine['run']}, not {identity['run']}): "
                   + _differences(mine, identity))
        skipped.append({"path": str(c.path), "step": c.step, "run": mine and mine["run"], "why": why})
    if not kept:
        raise StepError(
            f"{path}: none of its {len(candidates)} exports was written by the run whose identity {source} "
            f"records ({identity['run']}); the first: {skipped[0]['why']}. Rerun train (its exports replace "
            "these), or point evaluate.model at one checkpoint folder to score it as it is"
        )
    return RunExports(kept, skipped, identity["run"], source)


def _differences(mine: dict[str, Any], run: dict[str, Any]) -> str:
    keys = sorted(k for k in mine["params"].keys() | run["params"].keys()
                  if mine["params"].get(k) != run["params"].get(k))
    parts = [f"{k} {mine['params'].get(k)!r} vs {run['params'].get(k)!r}" for k in keys[:5]]
    for key, what in (("data_version", "data version"), ("base_version", "base model version")):
        if mine.get(key) != run.get(key):
            parts.append(f"{what} {mine.get(key)} vs {run.get(key)}")
    return "; ".join(parts) or "same params, data and base, another run"


@dataclass(frozen=True)
class Scored:
    candidate: Candidate
    scores: Scores
    verdict: Verdict

    def row(self) -> dict[str, Any]:
        sims = [s["mean"] for s in self.scores.similarity.values() if s.get("mean") is not None]
        gain = self.verdict.gains.get("similarity") or {}
        return {
            "step": self.candidate.step,
            "kind": self.candidate.kind,
            "path": str(self.candidate.path),
            "loss": self.scores.loss,
            "loss_std": self.scores.loss_std,
            "similarity_to_speaker": {k: v.get("mean") for k, v in self.scores.similarity.items()},
            "similarity_to_speaker_mean": sum(sims) / len(sims) if sims else None,
            # the paired gain over the base's clips and its interval (gains.py): which step moved the voice
            "similarity_gain": gain.get("gain"), "similarity_gain_low": gain.get("low"),
            "similarity_gain_high": gain.get("high"),
            "stop_failure_rate": self.scores.stop_failure_rate,
            "voice_split_groups": len(self.scores.split_groups),
            "promoted": self.verdict.promoted,
            "failed": [c.name for c in self.verdict.failed()],
        }


def choose(scored: list[Scored]) -> tuple[Scored, str]:
    """The export to keep, and why (see the module docstring for the order)."""

    def keeps_voice(s: Scored) -> bool:
        return all(c.passed for c in s.verdict.criteria if c.name != "loss")

    def loss(s: Scored) -> float:
        return s.scores.loss if math.isfinite(s.scores.loss) else math.inf

    for pool, why in (
        ([s for s in scored if s.verdict.promoted], "the lowest loss among the exports that pass the rule"),
        ([s for s in scored if keeps_voice(s)], "no export passes the rule: the lowest loss among those "
                                                "that keep the voice"),
        (scored, "no export keeps the voice: the lowest loss"),
    ):
        if pool:
            best = min(pool, key=loss)
            return best, why if len(scored) > 1 else "the only checkpoint evaluated"
    raise ValueError("no checkpoint was scored")


def plot_exports(path: Path, table: list[dict[str, Any]], baseline: Scores, chosen_step: int | None) -> None:
    """exports.png: fixed-seed loss (± seed std) and mean speaker similarity against the training step."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 6), layout="constrained")
    loss_ax, sim_ax = fig.subplots(2, 1, sharex=True)
    for kind, marker in ((LIVE, "o-"), (EMA, "^--"), (AVERAGE, "D")):  # a line per kind of candidate
        rows = [r for r in table if r.get("kind", LIVE) == kind]
        if not rows:
            continue
        steps = [r["step"] or 0 for r in rows]  # one checkpoint folder: a point at 0 (DVC expects the file)
        label = "export" if kind == LIVE else kind
        loss_ax.errorbar(steps, [r["loss"] for r in rows], yerr=[r["loss_std"] for r in rows], fmt=marker,
                         capsize=3, label=label)
        sim_ax.plot(steps, [r["similarity_to_speaker_mean"] for r in rows], marker, label=label)
    loss_ax.axhline(baseline.loss, color="tab:gray", ls="--", label="baseline")
    loss_ax.set_ylabel("fixed-seed loss")
    base_sims = [s["mean"] for s in baseline.similarity.values() if s.get("mean") is not None]
    if base_sims:
        sim_ax.axhline(sum(base_sims) / len(base_sims), color="tab:gray", ls="--", label="baseline")
    sim_ax.set_ylabel("similarity to speaker (mean)")
    sim_ax.set_xlabel("training step")
    for ax in (loss_ax, sim_ax):
        if chosen_step is not None:
            ax.axvline(chosen_step, color="tab:red", lw=0.8, ls=":", label="chosen")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle("exports scored by evaluate (red: the one chosen by the promotion rule)", fontsize="medium")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)

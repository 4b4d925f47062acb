"""A run's headline: the figures a person decides by, under short stable MLflow names, and its verdict.

The full record (record.py) keeps every figure under its step's prefix (`eval/loss_model`,
`mfu/mfu`, ...); 90 metrics in a row is not what the MLflow runs table or its compare view can show.
These few, logged a second time under the names below, are: the MLflow UI lists them first (short
keys, one place), and `voxpipe compare` reads them. The verdict is the promotion rule's, as a tag
(`voxpipe.verdict`) and as the first line of the run's description (note.py); the val set the losses
were scored on is a tag too, so runs scored on different val sets are never lined up silently.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from voxpipe.evaluate.pages import verdict_lines
from voxpipe.paramspec import keys
from voxpipe.track.artifacts import PipelineArtifacts

# short name -> (file, key) it comes from: eval.json (evaluate), the train report, mfu.json
HEADLINE = (
    ("val_loss", "eval", "loss_model"),  # the fixed-seed val loss of the checkpoint evaluate chose
    ("loss_delta", "eval", "loss_delta"),  # minus the base model's on the same val set and seeds
    ("similarity", "eval", "similarity_to_speaker_mean"),
    # the fine-tune's headline: its paired similarity gain over the base's zero-shot clone (the interval:
    # eval/similarity_gain_low and _high, and the voxpipe.gain.similarity tag)
    ("similarity_gain", "eval", "similarity_gain"),
    ("stop_failure_rate", "eval", "stop_failure_rate"),
    ("wer", "eval", "wer"),
    ("cer", "eval", "cer"),
    ("dnsmos_ovrl", "eval", "mos_ovrl"),
    ("mfu", "mfu", "mfu"),
    ("tokens_per_s", "train", "tokens_per_s"),
)
NAMES = tuple(name for name, _, _ in HEADLINE)
VERDICT_TAG = "voxpipe.verdict"
GAIN_TAG_PREFIX = "voxpipe.gain."  # `voxpipe.gain.<figure>`: its paired gain as `gain [low, high]`
VAL_SET_TAG = "voxpipe.val_digest"  # evaluate's val_digest: the val batches and seeds the losses saw
KIND_TAG = "voxpipe.candidate_kind"  # which kind of candidate evaluate chose: live, ema or average
RECIPE_TAG_PREFIX = "set."  # `set.<key>`: a param that differs from the schema's default (what was chosen)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def headline(art: PipelineArtifacts) -> dict[str, float | None]:
    """The headline figures of one run from its files (None where a file lacks one: a metric that cannot
    apply stays unlogged, e.g. WER with no word-spaced text or of a voice the recogniser cannot hear, MFU
    on a CPU without a recorded peak; eval.json, mfu.json and the run's description say why)."""
    files = {"eval": art.eval, "mfu": art.mfu, "train": art.train_report}
    return {name: _number(files[source].get(key)) for name, source, key in HEADLINE}


def verdict(figures: dict[str, Any]) -> str:
    """The promotion rule's verdict in a few words: `PROMOTE (against baseline)`, `do not promote (...)`."""
    return verdict_lines(figures)[0]


def promoted(verdict_text: str | None) -> bool | None:
    """Whether a verdict (as `verdict` wrote it) says yes; None for no verdict."""
    if not verdict_text or verdict_text.startswith("no verdict"):
        return None
    return verdict_text.startswith(("PROMOTE", "improved"))


def verdict_line(figures: dict[str, Any]) -> str:
    """The verdict in one line: the rule's word, then which criteria failed (or that all passed)."""
    head, criteria = verdict_lines(figures)
    failed = [name for name, passed, _ in criteria if passed != "pass"]
    if not criteria:
        return head
    return f"{head}: " + (f"fails {', '.join(failed)}" if failed else f"all {len(criteria)} criteria pass")


@cache
def setting_keys() -> frozenset[str]:
    """The params keys a person sets to change a result; paths, worker counts and logging are not
    (voxpipe/paramspec.py), nor what the train report, model config and data counts add to the params."""
    return frozenset(k.key for k in keys() if k.changes_result)


def recipe_changes(flat: dict[str, str], defaults: dict[str, str]) -> dict[str, str]:
    """The logged settings whose value is not the schema's default, as `set.<key>` tags: what this run
    chose, a few lines beside the 200-odd params."""
    return {f"{RECIPE_TAG_PREFIX}{k}": v for k, v in sorted(flat.items())
            if k in setting_keys() and defaults.get(k) != v}


def gain_tags(figures: dict[str, Any]) -> dict[str, str]:
    """eval.json's paired gains as tags, `gain [low, high]` as a person reads them (a metric holds one
    number: the three numbers are eval/<figure>_gain{,_low,_high} metrics too)."""
    return {GAIN_TAG_PREFIX + re.sub(r"[^\w\-. /]", "_", name.replace("[", ".").rstrip("]")): str(g["shown"])
            for name, g in (figures.get("gains") or {}).items() if isinstance(g, dict) and "shown" in g}

"""eval.png: per generated utterance, similarity to its speaker and median F0, baseline vs fine-tuned.

Dashed lines mark each speaker's real voice (its real clips' mean similarity to their own centre,
and their median F0), so a drift away from the voice, or a jump between voices, is visible at once.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from voxpipe.evaluate.metrics import Voice

STYLES = {"baseline": ("o", "tab:gray", -0.12), "model": ("s", "tab:blue", 0.12)}  # marker, colour, x shift


def _values(records: list[dict[str, Any]], key: str) -> list[float]:
    return [math.nan if r[key] is None else r[key] for r in records]


def no_pitch_sentence(records: dict[str, list[dict[str, Any]]]) -> str | None:
    """What the F0 panel says instead of points when no generated clip has a pitch (None when one has)."""
    clips = [r for tagged in records.values() for r in tagged]
    if any(r["f0_median_hz"] is not None for r in clips):
        return None
    reasons = sorted({r.get("f0_null_reason") or "no pitch" for r in clips})
    return f"no generated clip has a pitch ({'; '.join(reasons)[:160]})"


def plot(path: Path, records: dict[str, list[dict[str, Any]]], voices: dict[str, Voice],
         similarity: str = "GE2E") -> Any:
    """`similarity`: what the speaker encoder that made the similarities calls its scores. Returns the
    matplotlib Figure it saved. A clip without a pitch (pitch.py: too little voicing, or a steady tone
    such as an untrained decoder's buzz) has no marker; none with one makes the panel a sentence."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed
    from matplotlib.ticker import ScalarFormatter

    names = [r["name"] for r in records["model"]]
    x = np.arange(len(names))
    fig = Figure(figsize=(max(6.0, 0.45 * len(names) + 2.5), 7.0), layout="constrained")
    sim_ax, f0_ax = fig.subplots(2, 1, sharex=True)
    for tag, (marker, colour, shift) in STYLES.items():
        label = "fine-tuned" if tag == "model" else "baseline"
        sims = _values(records[tag], "similarity_to_speaker")
        sim_ax.plot(x + shift, sims, marker, color=colour, label=label)
        f0_ax.plot(x + shift, _values(records[tag], "f0_median_hz"), marker, color=colour, label=label)
    for speaker, voice in voices.items():
        span = [i for i, r in enumerate(records["model"]) if r["speaker"] == speaker]
        if not span:
            continue
        lo, hi = min(span) - 0.4, max(span) + 0.4
        sim_ax.hlines(np.mean(voice.clip_similarities), lo, hi, colors="tab:green", linestyles="dashed")
        if voice.f0_median_hz is not None:
            f0_ax.hlines(voice.f0_median_hz, lo, hi, colors="tab:green", linestyles="dashed")
    sim_ax.plot([], [], "--", color="tab:green", label="real clips of the speaker")
    sim_ax.set_title(f"speaker similarity: {similarity} cosine to the speaker's real voice",
                     fontsize="medium")
    sim_ax.set_ylabel("cosine")
    sim_ax.grid(alpha=0.3)
    f0_ax.set_title("median F0 (pyin; no marker = no pitch found: too little voicing, or a steady tone)",
                    fontsize="medium")
    f0_ax.set_ylabel("Hz (log scale)")
    f0_ax.set_yscale("log")
    f0_ax.yaxis.set_major_formatter(ScalarFormatter())
    f0_ax.yaxis.set_minor_formatter(ScalarFormatter())
    f0_ax.grid(alpha=0.3, which="both")
    sentence = no_pitch_sentence(records)
    if sentence:
        f0_ax.text(0.5, 0.5, sentence, transform=f0_ax.transAxes, ha="center", va="center", wrap=True,
                   fontsize="small")
    fig.legend(*sim_ax.get_legend_handles_labels(), loc="outside upper center", ncols=3, fontsize="small")
    f0_ax.set_xticks(x, names, rotation=60, ha="right", fontsize="small")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return fig

"""Voice consistency across one speaker's generated utterances, and the "two voices" flag.

The complaint users raise most after fine-tuning is a voice that drifts: male one sentence,
female the next. Two independent signs of it, each needing clearly different voices, not the
normal variation of one voice:
- pitch: the utterances' median F0s fall into two groups whose nearest members are more than
  40 % apart (about a musical fifth; one voice's sentences stay within a few semitones, a male
  and a female voice sit about an octave apart);
- timbre: split the utterances' speaker embeddings in two around their least similar pair; the
  two groups' centre voices are less alike than 0.65 (GE2E cosine; on the sample, clips of one
  voice score >= 0.67 against each other, the two voices <= 0.66 and 0.52 on average).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from voxpipe.evaluate.pitch import semitones
from voxpipe.evaluate.speaker import cosine, unit_mean

F0_SPLIT_RATIO = 1.4
VOICE_SPLIT_SIMILARITY = 0.65


def f0_gap_ratio(f0s: Sequence[float]) -> float | None:
    """Ratio across the widest gap between neighbouring sorted F0 medians (None for fewer than 2)."""
    values = sorted(f0s)
    if len(values) < 2:
        return None
    return max(high / low for low, high in zip(values, values[1:], strict=False))


def two_voice_similarity(embeddings: Sequence[np.ndarray]) -> float | None:
    """Cosine between the centres of a two-way split seeded by the least similar pair (None for < 2)."""
    if len(embeddings) < 2:
        return None
    e = np.stack(embeddings)
    sims = e @ e.T
    a, b = np.unravel_index(np.argmin(sims), sims.shape)
    to_a = sims[:, a] >= sims[:, b]
    to_a[a], to_a[b] = True, False
    return cosine(unit_mean(list(e[to_a])), unit_mean(list(e[~to_a])))


def no_f0_spread(records: Sequence[dict]) -> str:
    """Why a checkpoint has no f0_spread: no (speaker, reference) group has two clips with a pitch."""
    reasons = sorted({r["f0_null_reason"] for r in records if r.get("f0_null_reason")})
    return ("no (speaker, with/without reference) group has two clips with a pitch"
            + (f"; {reasons[0]}" if reasons else ""))


def _std(values: Sequence[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


def consistency(
    similarities: Sequence[float | None], f0s: Sequence[float | None], embeddings: Sequence[np.ndarray | None]
) -> dict[str, Any]:
    """Spread of similarity and pitch over a group's utterances, and whether it splits into two voices.

    Utterances without a voice (silence, or too little voicing for a pitch) are left out of the
    figures and counted in `no_voice` / `no_pitch`.
    """
    sims = [s for s in similarities if s is not None]
    pitches = [f for f in f0s if f is not None]
    embeds = [e for e in embeddings if e is not None]
    gap = f0_gap_ratio(pitches)
    voices = two_voice_similarity(embeds)
    reasons = []
    if gap is not None and gap > F0_SPLIT_RATIO:
        reasons.append(f"median F0 splits into two groups {gap:.2f}x apart")
    if voices is not None and voices < VOICE_SPLIT_SIMILARITY:
        reasons.append(f"speaker embeddings split into two voices (centre similarity {voices:.2f})")
    return {
        "utterances": len(similarities),
        "no_voice": len(similarities) - len(sims),
        "no_pitch": len(f0s) - len(pitches),
        "similarity_mean": statistics.fmean(sims) if sims else None,
        "similarity_std": _std(sims),
        "similarity_min": min(sims, default=None),
        "f0_median_hz": statistics.median(pitches) if pitches else None,
        "f0_spread_semitones": _std([semitones(f / 100.0) for f in pitches]),
        "f0_gap_ratio": gap,
        "two_voice_similarity": voices,
        "voice_split": bool(reasons),
        "split_reasons": reasons,
    }

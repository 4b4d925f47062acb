"""Where to cut a long recording: clips between pauses the VAD found, never inside speech.

A pure function of the per-frame speech probabilities (voxpipe/data/vad.py), so it is tested on numbers
as well as on audio:

1. frames are speech or not with hysteresis (in at `threshold`, out below `threshold - 0.15`, Silero's
   own rule), and the speech runs are its voiced regions;
2. regions closer than `min_pause` are one utterance: a pause at least that long ends a clip;
3. an utterance longer than `max_s` is split at its longest internal pause (any gap the VAD heard, even a
   short one) among those that leave both parts at least `min_s` long (the longest of all when none
   does), again until every part fits; one with no gap at all cannot be cut without cutting speech and
   is returned as a problem, not cut. A short utterance between two pauses stays a clip of its own:
   joining it to a neighbour across a pause could join two voices, which the speaker check would then
   have to throw away whole;
4. each clip keeps `pad` seconds of the silence on either side, at most half of the pause, so two clips
   never share a sample and the padding is silence, not the next word.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from voxpipe.data.vad import FRAME, RATE

FRAME_S = FRAME / RATE
HYSTERESIS = 0.15


@dataclass(frozen=True)
class SegmentChecks:
    """ingest.segment, as a decode worker gets it."""

    min_seconds: float
    max_seconds: float
    pad_seconds: float
    min_pause_seconds: float
    vad_threshold: float
    speaker_threshold: float
    overlap_threshold: float
    enrolment: str = ""


@dataclass(frozen=True)
class Cut:
    start: float  # seconds into the recording, padding included
    end: float


@dataclass(frozen=True)
class Uncut:
    start: float  # a voiced stretch longer than max_s with no pause inside: not cut
    end: float


def voiced_regions(probs: np.ndarray, threshold: float) -> list[tuple[int, int]]:
    """[start, end) frame runs of speech, with hysteresis."""
    regions, start, on = [], 0, False
    for i, p in enumerate(probs):
        if not on and p >= threshold:
            on, start = True, i
        elif on and p < threshold - HYSTERESIS:
            on = False
            regions.append((start, i))
    if on:
        regions.append((start, len(probs)))
    return regions


def _split(utterance: list[tuple[int, int]], min_frames: int, max_frames: int
           ) -> list[list[tuple[int, int]]] | None:
    """Parts of at most max_frames, split at the longest internal gap that leaves both sides min_frames
    long (else the longest); None if a part longer than max_frames has no gap."""
    if utterance[-1][1] - utterance[0][0] <= max_frames:
        return [utterance]
    if len(utterance) == 1:
        return None
    start, end = utterance[0][0], utterance[-1][1]

    def rank(k: int) -> tuple[bool, int]:  # k: the gap after region k - 1
        both = utterance[k - 1][1] - start >= min_frames and end - utterance[k][0] >= min_frames
        return both, utterance[k][0] - utterance[k - 1][1]

    k = max(range(1, len(utterance)), key=rank)
    left, right = _split(utterance[:k], min_frames, max_frames), _split(utterance[k:], min_frames, max_frames)
    return None if left is None or right is None else left + right


def cut_points(probs: np.ndarray, *, threshold: float, min_pause: float, min_s: float, max_s: float,
               pad: float) -> list[Cut | Uncut]:
    """The clips of a recording whose frames have these speech probabilities, in time order."""
    regions = voiced_regions(probs, threshold)
    if not regions:
        return []
    pause_frames = max(1, round(min_pause / FRAME_S))
    utterances: list[list[tuple[int, int]]] = [[regions[0]]]
    for region in regions[1:]:
        if region[0] - utterances[-1][-1][1] < pause_frames:
            utterances[-1].append(region)
        else:
            utterances.append([region])
    max_frames = int(max_s / FRAME_S)
    spans: list[tuple[int, int]] = []
    uncut: list[tuple[int, int]] = []
    for utterance in utterances:
        parts = _split(utterance, int(min_s / FRAME_S), max_frames)
        if parts is None:
            uncut.append((utterance[0][0], utterance[-1][1]))
        else:
            spans += [(part[0][0], part[-1][1]) for part in parts]
    total = len(probs) * FRAME_S
    every = sorted([(a, b, True) for a, b in spans] + [(a, b, False) for a, b in uncut])
    found: list[Cut | Uncut] = []
    for k, (a, b, ok) in enumerate(every):
        start, end = a * FRAME_S, b * FRAME_S
        lo = (start + every[k - 1][1] * FRAME_S) / 2 if k > 0 else 0.0
        hi = (end + every[k + 1][0] * FRAME_S) / 2 if k + 1 < len(every) else total
        start, end = max(lo, start - pad), min(hi, end + pad)
        found.append(Cut(round(start, 3), round(end, 3)) if ok else Uncut(round(start, 3), round(end, 3)))
    return found

"""Make a decoded clip fit to train on: clipping measured, edge silence trimmed, loudness evened out.

- **Clipping** is measured on the decoded samples at their own rate, before resampling smooths the
  flat tops away: the share of samples at full scale. Too many, and the clip is quarantined
  (`clipped`): no gain brings back a waveform whose peaks were cut off.
- **Silence** is found by frame energy (10 ms frames), relative to the clip's loudest frame with an
  absolute floor. Energy, not a VAD: it is deterministic, costs one pass, and a VAD calls steady
  noise speech anyway (noise is the quality score's job). Leading and trailing silence is cut to at
  most `max_edge_silence` (upstream's advice: under 0.5 s, or the model learns not to stop); a pause
  inside the clip longer than `max_internal_pause` is flagged, not cut, since cutting it would
  change what the transcript's rhythm says.
- **Loudness** is brought to `target_lufs` (ITU-R BS.1770 integrated loudness, pyloudnorm), then held
  under a peak ceiling so the gain never clips; a clip held back by the ceiling is flagged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FULL_SCALE = 0.999  # |sample| at or above this counts as clipped (int16 full scale is 0.99997)
FRAME_SECONDS = 0.01
RELATIVE_FLOOR_DB = 40.0  # a frame this far below the loudest frame is silence
ABSOLUTE_FLOOR_DBFS = -60.0  # and any frame below this is
PEAK_CEILING = 0.97  # -0.26 dBFS: the loudest sample after loudness normalization
BS1770_BLOCK_SECONDS = 0.4  # integrated loudness needs at least one 400 ms gating block


def clipped_fraction(x: np.ndarray) -> float:
    """The share of samples at full scale."""
    return float(np.count_nonzero(np.abs(x) >= FULL_SCALE)) / max(x.size, 1)


@dataclass(frozen=True)
class Trim:
    start: int  # first sample kept
    stop: int  # sample after the last kept
    longest_pause: float  # seconds: the longest silence between the first and last sound


def _active_frames(x: np.ndarray, sr: int) -> tuple[np.ndarray, int]:
    frame = max(1, int(sr * FRAME_SECONDS))
    n = x.size // frame
    if n == 0:
        return np.ones(1, dtype=bool), frame
    frames = x[: n * frame].reshape(n, frame).astype(np.float64)
    db = 10 * np.log10(np.mean(frames * frames, axis=1) + 1e-20)
    return db > max(db.max() - RELATIVE_FLOOR_DB, ABSOLUTE_FLOOR_DBFS), frame


def find_trim(x: np.ndarray, sr: int, max_edge_silence: float) -> Trim:
    """Where to cut so that at most `max_edge_silence` seconds of silence remain at either edge."""
    active, frame = _active_frames(x, sr)
    where = np.flatnonzero(active)
    if where.size == 0:
        return Trim(0, x.size, 0.0)
    first, last = int(where[0]), int(where[-1])
    edge = int(round(max_edge_silence * sr))
    start = max(0, first * frame - edge)
    stop = x.size if last == active.size - 1 else min(x.size, (last + 1) * frame + edge)
    gaps = np.diff(where) - 1  # silent frames between consecutive sounding frames
    longest = float(gaps.max()) * frame / sr if gaps.size else 0.0
    return Trim(start, stop, round(longest, 3))


@dataclass(frozen=True)
class Level:
    lufs_raw: float | None  # None: shorter than one BS.1770 block, left as it was
    gain_db: float
    peak_limited: bool


def normalize_loudness(x: np.ndarray, sr: int, target_lufs: float) -> tuple[np.ndarray, Level]:
    """x brought to `target_lufs`, the gain held down so that no sample exceeds PEAK_CEILING."""
    if x.size < BS1770_BLOCK_SECONDS * sr:
        return x, Level(None, 0.0, False)
    import pyloudnorm  # scipy: imported by the workers that normalize only

    with np.errstate(divide="ignore"):
        lufs = float(pyloudnorm.Meter(sr).integrated_loudness(x.astype(np.float64)))
    if not np.isfinite(lufs):
        return x, Level(None, 0.0, False)
    gain = 10 ** ((target_lufs - lufs) / 20)
    peak = float(np.abs(x).max()) * gain
    limited = peak > PEAK_CEILING
    if limited:
        gain *= PEAK_CEILING / peak
    return (x * np.float32(gain)).astype(np.float32), Level(round(lufs, 2), round(20 * np.log10(gain), 2),
                                                            limited)

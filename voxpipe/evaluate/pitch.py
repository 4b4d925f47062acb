"""Median fundamental frequency of a clip (probabilistic YIN), the plainest marker of which voice spoke.

A male and a female voice sit roughly an octave apart; one voice's sentences stay within a few
semitones of each other. Settings: 50-500 Hz covers speaking voices; 20 ms hops (fewer frames for
the Viterbi pass than librosa's default 16 ms at this rate).
"""

from __future__ import annotations

import numpy as np

FMIN, FMAX = 50.0, 500.0
SAMPLE_RATE = 16000
FRAME, HOP = 1024, 320  # 64 ms windows (>= 3 periods at FMIN), 20 ms hops
RESOLUTION = 0.1  # semitones (librosa's default; coarser grids lose voicing on low voices)
MIN_VOICED_FRAMES = 5  # 100 ms of voicing, else the clip has no usable pitch


def median_f0(wav: np.ndarray) -> float | None:
    """Median F0 in Hz over the voiced frames of a 16 kHz clip; None when too little of it is voiced."""
    import librosa  # imported here: slow to import and only this step needs it

    f0, voiced, _ = librosa.pyin(
        np.asarray(wav, dtype=np.float32), fmin=FMIN, fmax=FMAX, sr=SAMPLE_RATE,
        frame_length=FRAME, hop_length=HOP, resolution=RESOLUTION,
    )
    voiced = voiced & np.isfinite(f0)
    if int(voiced.sum()) < MIN_VOICED_FRAMES:
        return None
    return float(np.median(f0[voiced]))


def semitones(ratio: float) -> float:
    return 12.0 * float(np.log2(ratio))

"""Median fundamental frequency of a clip (probabilistic YIN), the plainest marker of which voice spoke.

A male and a female voice sit roughly an octave apart; one voice's sentences stay within a few
semitones of each other. Settings: 50-500 Hz covers speaking voices; 20 ms hops (fewer frames for
the Viterbi pass than librosa's default 16 ms at this rate).

`librosa.pyin` with these settings, step for step, except the Viterbi pass: librosa's dense one was two
thirds of pyin's time and held the GIL, viterbi.py's gives the same path. The candidate probabilities
are librosa's own functions; tests/test_pitch.py holds the result to `librosa.pyin`'s, so a librosa
release that changes them fails there, not in a figure.

A clip has no pitch (None, with the reason) when too little of it is voiced, or when its voiced frames
hold one steady tone: a speaking voice's intonation moves (the middle half of the voiced frames of the
sample's espeak voices, the flattest there are, spans 0.7 to 4 semitones, median 1.9, over its 64
clips), while an untrained decoder's frame-rate buzz sits on one frequency (nearly every frame of the
demo's generated clips at exactly 400 Hz). That tone is a pitch the
tracker found, but not a voice's, and plotted beside the real voices' it reads as one.
"""

from __future__ import annotations

import functools

import numpy as np

from voxpipe.evaluate.viterbi import SparseTransitions, viterbi
from voxpipe.voxcpm2_format import SAMPLE_RATE

FMIN, FMAX = 50.0, 500.0
FRAME, HOP = 1024, 320  # 64 ms windows (>= 3 periods at FMIN), 20 ms hops
RESOLUTION = 0.1  # semitones (librosa's default; coarser grids lose voicing on low voices)
MIN_VOICED_FRAMES = 5  # 100 ms of voicing, else the clip has no usable pitch
MIN_INTONATION = 0.2  # semitones between the quartiles of voiced F0 (2 pyin bins): less is a steady tone
# librosa.pyin's defaults, which the figures were first made with
THRESHOLDS, BETA, BOLTZMANN = 100, (2, 18), 2
MAX_TRANSITION_RATE, SWITCH_PROB, NO_TROUGH_PROB = 35.92, 0.01, 0.01


def pyin(wav: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(f0 in Hz, NaN where unvoiced; voiced flags) per 20 ms frame of a 16 kHz clip: what
    `librosa.pyin(wav, fmin=FMIN, fmax=FMAX, sr=SAMPLE_RATE, frame_length=FRAME, hop_length=HOP,
    resolution=RESOLUTION)` returns as its first two arrays."""
    import librosa  # imported here: slow to import and only this step needs it
    import scipy.stats
    from librosa.core import pitch as lp

    y = np.pad(np.asarray(wav, dtype=np.float32), FRAME // 2)  # centred frames, zero padded
    librosa.util.valid_audio(y)
    frames = librosa.util.frame(y, frame_length=FRAME, hop_length=HOP)
    min_period = int(np.floor(SAMPLE_RATE / FMAX))
    max_period = min(int(np.ceil(SAMPLE_RATE / FMIN)), FRAME - 1)
    yin = lp._cumulative_mean_normalized_difference(frames, min_period, max_period)
    shifts = lp._parabolic_interpolation(yin)
    thresholds = np.linspace(0, 1, THRESHOLDS + 1)
    beta_probs = np.diff(scipy.stats.beta.cdf(thresholds, *BETA))
    per_semitone = int(np.ceil(1.0 / RESOLUTION))
    n_bins = int(np.floor(12 * per_semitone * np.log2(FMAX / FMIN))) + 1
    observation, _ = getattr(lp, "__pyin_helper")(
        yin, shifts, SAMPLE_RATE, thresholds, BOLTZMANN, beta_probs, NO_TROUGH_PROB, min_period, FMIN,
        n_bins, per_semitone)
    states = viterbi(observation[0], _transitions(n_bins, per_semitone), np.ones(2 * n_bins) / (2 * n_bins))
    voiced = states < n_bins
    f0 = FMIN * 2 ** (np.arange(n_bins) / (12 * per_semitone))
    return np.where(voiced, f0[states % n_bins], np.nan), voiced


@functools.cache
def _transitions(n_bins: int, per_semitone: int) -> SparseTransitions:
    """pyin's transition matrix: the pitch moves at most MAX_TRANSITION_RATE, voicing switches rarely (the
    same for every clip, so made once)."""
    import librosa

    width = round(MAX_TRANSITION_RATE * 12 * HOP / SAMPLE_RATE) * per_semitone + 1
    local = librosa.sequence.transition_local(n_bins, width, window="triangle", wrap=False)
    return SparseTransitions(np.kron(librosa.sequence.transition_loop(2, 1 - SWITCH_PROB), local))


def f0_or_reason(wav: np.ndarray) -> tuple[float | None, str | None]:
    """(median F0 in Hz over the voiced frames of a 16 kHz clip, None) or (None, why it has no pitch)."""
    f0, voiced = pyin(wav)
    voiced = voiced & np.isfinite(f0)
    if int(voiced.sum()) < MIN_VOICED_FRAMES:
        return None, f"fewer than {MIN_VOICED_FRAMES} voiced frames ({MIN_VOICED_FRAMES * HOP // 16} ms)"
    found = f0[voiced]
    low, high = np.percentile(found, [25, 75])
    if semitones(high / low) < MIN_INTONATION:
        return None, (f"a steady {float(np.median(found)):.0f} Hz tone, no intonation (the middle half of "
                      f"its voiced F0 spans {semitones(high / low):.2f} semitones, under "
                      f"{MIN_INTONATION}): not a voice's pitch")
    return float(np.median(found)), None


def median_f0(wav: np.ndarray) -> float | None:
    """Median F0 in Hz over the voiced frames of a 16 kHz clip; None when it has no pitch (`f0_or_reason`)."""
    return f0_or_reason(wav)[0]


def semitones(ratio: float) -> float:
    return 12.0 * float(np.log2(ratio))

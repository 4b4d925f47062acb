"""Pitch (voxpipe/evaluate/pitch.py) and its Viterbi pass (viterbi.py) against librosa's own, to the bit:
the path on random problems built to make out-of-band transitions and ties win, and `pyin`'s f0 and voicing
on the sample's speech (both voices), on noise, silence, a glide and clipped audio."""

from __future__ import annotations

import librosa
import numpy as np
import pytest
from small_sample import speech_16k

from voxpipe.evaluate import pitch
from voxpipe.evaluate.viterbi import SparseTransitions, viterbi


def _pyin_transition(n_bins: int = 60, width: int = 9) -> np.ndarray:
    local = librosa.sequence.transition_local(n_bins, width, window="triangle", wrap=False)
    return np.kron(librosa.sequence.transition_loop(2, 0.99), local)


def _problem(rng: np.random.Generator, states: int, frames: int, zeros: float, levels: int | None
             ) -> np.ndarray:
    """Observation probabilities with a share of exact zeros (log(tiny) in both decoders: where an
    out-of-band jump can win) and, with `levels`, few distinct values (ties everywhere)."""
    prob = rng.random((states, frames))
    if levels:
        prob = np.round(prob * levels) / levels
    prob[rng.random((states, frames)) < zeros] = 0.0
    return prob


@pytest.mark.parametrize("zeros,levels", [(0.0, None), (0.9, None), (0.99, None), (0.9, 3), (1.0, None)])
def test_viterbi_finds_librosas_path(zeros, levels):
    rng = np.random.default_rng(7)
    transition = _pyin_transition()
    sparse = SparseTransitions(transition)
    p_init = np.ones(len(transition)) / len(transition)
    for _ in range(20):
        prob = _problem(rng, len(transition), 40, zeros, levels)
        expected = librosa.sequence.viterbi(prob, transition, p_init=p_init)
        assert np.array_equal(viterbi(prob, sparse, p_init), expected)


def test_a_transition_near_zero_is_refused():
    transition = _pyin_transition()
    transition[0, :2] = [1e-300, 1 - transition[0, 2:].sum() - 1e-300]
    with pytest.raises(ValueError, match="well above zero"):
        SparseTransitions(transition)


def test_viterbi_on_a_general_sparse_matrix():
    """Any sparsity pattern, not only pyin's band: random zeros in a random row-stochastic matrix."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        transition = rng.random((30, 30)) * (rng.random((30, 30)) < 0.2)
        transition[np.arange(30), rng.integers(0, 30, 30)] += 0.1  # every row somewhere to go
        transition /= transition.sum(axis=1, keepdims=True)
        p_init = rng.dirichlet(np.ones(30))
        prob = _problem(rng, 30, 25, 0.7, 4)
        expected = librosa.sequence.viterbi(prob, transition, p_init=p_init)
        assert np.array_equal(viterbi(prob, SparseTransitions(transition), p_init), expected)


def _made_up() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    t = np.arange(2 * pitch.SAMPLE_RATE) / pitch.SAMPLE_RATE
    glide = np.sin(2 * np.pi * np.cumsum(np.linspace(80, 400, t.size)) / pitch.SAMPLE_RATE)
    return [
        (0.1 * rng.standard_normal(pitch.SAMPLE_RATE)).astype(np.float32),  # noise
        np.zeros(pitch.SAMPLE_RATE // 2, dtype=np.float32),  # silence
        (0.5 * glide).astype(np.float32),  # 80 -> 400 Hz
        np.clip(3 * glide, -1, 1).astype(np.float32),  # clipped
        (0.3 * np.sin(2 * np.pi * 120 * t[:4000])).astype(np.float32),  # 0.25 s
    ]


def test_pyin_is_librosas():
    for wav in speech_16k(3, 3) + _made_up():
        f0, voiced, _ = librosa.pyin(wav, fmin=pitch.FMIN, fmax=pitch.FMAX, sr=pitch.SAMPLE_RATE,
                                     frame_length=pitch.FRAME, hop_length=pitch.HOP,
                                     resolution=pitch.RESOLUTION)
        ours_f0, ours_voiced = pitch.pyin(wav)
        assert np.array_equal(ours_voiced, voiced)
        assert np.array_equal(ours_f0, f0, equal_nan=True)
    assert pitch.median_f0(speech_16k(1)[0]) is not None and pitch.median_f0(_made_up()[1]) is None


def test_a_steady_tone_is_no_voices_pitch_but_speech_and_a_glide_have_one():
    """An untrained decoder's frame-rate buzz (a pulse every 40 samples: every frame at exactly 400 Hz) is
    a tone the tracker follows, not intonation; the sample's speech and a glide keep their pitch."""
    buzz = np.zeros(2 * pitch.SAMPLE_RATE, dtype=np.float32)
    buzz[::40] = 0.5
    f0, reason = pitch.f0_or_reason(buzz)
    assert f0 is None and "steady 400 Hz tone" in reason and pitch.median_f0(buzz) is None
    assert pitch.f0_or_reason(_made_up()[1]) == (None, "fewer than 5 voiced frames (100 ms)")
    for wav in [*speech_16k(3, 3), _made_up()[2]]:
        f0, reason = pitch.f0_or_reason(wav)
        assert reason is None and pitch.FMIN < f0 < pitch.FMAX

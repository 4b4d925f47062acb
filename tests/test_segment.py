"""Cutting long recordings (voxpipe/data/segment.py, vad.py): on numbers, then on real audio through the
real Silero VAD from its wheel."""

from __future__ import annotations

import random

import numpy as np
import pytest
from sessions import make_sessions

from voxpipe.data.segment import FRAME_S, Cut, Uncut, cut_points, voiced_regions
from voxpipe.data.vad import model_file, speech_probabilities

MAIN, INTERLOPER, RATE = make_sessions.MAIN, make_sessions.INTERLOPER, make_sessions.RATE

SETTINGS = {"threshold": 0.5, "min_pause": 0.4, "min_s": 2.0, "max_s": 15.0, "pad": 0.2}


def frames(*runs: tuple[float, float]) -> np.ndarray:
    """Speech probabilities: (seconds, probability) runs."""
    return np.concatenate([np.full(round(s / FRAME_S), p, dtype=np.float32) for s, p in runs])


def test_hysteresis_keeps_a_dip_inside_speech_as_speech():
    probs = frames((1, 0.0), (1, 0.9), (0.2, 0.4), (1, 0.9), (1, 0.0))
    assert len(voiced_regions(probs, 0.5)) == 1  # 0.4 is above 0.5 - 0.15: still speech


def test_clips_end_at_pauses_and_keep_padding_inside_them():
    probs = frames((1, 0), (3, 1), (1, 0), (4, 1), (0.5, 0))
    cuts = cut_points(probs, **SETTINGS)
    # 0.2 s of each pause (to a 32 ms frame); 0.2 s into the last 0.5 s
    assert [(c.start, c.end) for c in cuts] == [pytest.approx((0.8, 4.2), abs=0.04),
                                                pytest.approx((4.8, 9.2), abs=0.04)]


def test_a_stretch_longer_than_max_is_cut_at_its_longest_internal_pause():
    # 6 s + 0.1 pause + 5 s + 0.3 pause + 5 s: 16 s with no pause of min_pause, longer than max_s
    probs = frames((0.5, 0), (6, 1), (0.1, 0), (5, 1), (0.3, 0), (5, 1), (0.5, 0))
    cuts = cut_points(probs, **{**SETTINGS, "max_s": 12.0})
    assert len(cuts) == 2 and all(isinstance(c, Cut) for c in cuts)
    assert 11.55 <= cuts[0].end <= cuts[1].start <= 11.95  # inside the 0.3 s pause (11.6-11.9 s)


def test_speech_longer_than_max_with_no_pause_is_not_cut():
    cuts = cut_points(frames((0.5, 0), (20, 1), (0.5, 0)), **SETTINGS)
    assert len(cuts) == 1 and isinstance(cuts[0], Uncut)


def test_a_long_stretch_is_split_where_both_parts_are_at_least_min_s():
    # 1 s + 0.35 pause + 6 s + 0.2 pause + 6 s: the longest pause would leave a 1 s part; the other does not
    probs = frames((0.5, 0), (1, 1), (0.35, 0), (6, 1), (0.2, 0), (6, 1), (0.5, 0))
    cuts = cut_points(probs, **{**SETTINGS, "max_s": 10.0})
    assert len(cuts) == 2 and 7.5 <= cuts[0].end <= cuts[1].start <= 8.0  # in the 0.2 s pause at 7.85 s


def test_a_short_stretch_between_pauses_stays_a_clip_of_its_own():
    probs = frames((0.5, 0), (3, 1), (1.0, 0), (1, 1), (0.6, 0), (3, 1), (0.5, 0))
    assert len(cut_points(probs, **SETTINGS)) == 3


def test_the_vad_weights_come_from_the_installed_wheel():
    assert model_file().parent.parent.name == "silero_vad" and model_file().stat().st_size > 1_000_000


@pytest.fixture(scope="module")
def session() -> tuple[np.ndarray, list[dict]]:
    """Ten of the sample's clips, the two voices taking turns, 0.6-1.5 s of silence between them."""
    clips = make_sessions.sample_clips()
    speakers = [MAIN if k % 2 == 0 else INTERLOPER for k in range(10)]
    segments = [(*clips[s][k], s) for k, s in enumerate(speakers)]
    return make_sessions.join([(x, s, t) for x, t, s in segments], random.Random(1), "s.wav")


def test_real_speech_is_cut_in_every_inserted_pause_and_never_inside_a_word(session):
    audio, truth = session
    cuts = cut_points(speech_probabilities(audio), **SETTINGS)
    assert all(isinstance(c, Cut) for c in cuts)
    assert len(cuts) == len(truth)
    for cut, segment in zip(cuts, truth, strict=True):
        # each clip holds its segment whole (the VAD's edges within 100 ms of espeak's), and the cut is in the
        # silence around it
        assert cut.start <= segment["start"] + 0.1 and cut.end >= segment["end"] - 0.1
        assert cut.start >= segment["start"] - 1.0 and cut.end <= segment["end"] + 1.0
    for left, right, a, b in zip(cuts, cuts[1:], truth, truth[1:], strict=False):
        assert a["end"] - 0.1 <= left.end <= right.start <= b["start"] + 0.1
    for cut in cuts:  # no word cut: the samples around every edge are silence
        for edge in (cut.start, cut.end):
            i = int(edge * RATE)
            assert np.abs(audio[max(0, i - 160):i + 160]).max(initial=0) < 0.02

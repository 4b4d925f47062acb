"""DNSMOS P.835 (voxpipe/data/quality.py) on the shipped sample's speech, on generated noise, and
against the reference (DNS-Challenge `DNSMOS/dnsmos_local.py`, ported below, and speechmos' runner)
on generated tone and noise mixes of 1 to 40 s."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import soundfile as sf
from small_sample import speech_16k

from voxpipe.data.quality import WINDOW, Dnsmos, model_path, windows

SCORES = ("sig", "bak", "ovrl")
# the reference's non-personalized calibration, as its get_polyfit_val writes it (poly1d, highest power first)
_REFERENCE_FIT = {"sig": np.poly1d([-0.08397278, 1.22083953, 0.0052439]),
                  "bak": np.poly1d([-0.13166888, 1.60915514, -0.39604546]),
                  "ovrl": np.poly1d([-0.06766283, 1.11546468, 0.04602535])}


def _reference_segments(audio: np.ndarray) -> list[np.ndarray]:
    """dnsmos_local.py's ComputeScore.__call__, the part that picks windows, as it reads."""
    fs, input_length = 16_000, 9.01
    len_samples = int(input_length * fs)
    while len(audio) < len_samples:
        audio = np.append(audio, audio)
    num_hops = int(np.floor(len(audio) / fs) - input_length) + 1
    segments = [audio[int(i * fs):int((i + input_length) * fs)] for i in range(num_hops)]
    return [seg for seg in segments if len(seg) >= len_samples]


def _reference_port(session: ort.InferenceSession, path: str) -> dict[str, float]:
    """The rest of __call__ on a 16 kHz file, without the P.808 model (it does not touch sig/bak/ovrl):
    each window through the network, the calibration per window, then the mean."""
    audio, _ = sf.read(path)
    per_window = {k: [] for k in SCORES}
    for seg in _reference_segments(audio):
        raw = session.run(None, {"input_1": np.array(seg).astype("float32")[np.newaxis, :]})[0][0]
        for k, value in zip(SCORES, raw, strict=True):
            per_window[k].append(_REFERENCE_FIT[k](value))
    return {k: float(np.mean(v)) for k, v in per_window.items()}


def _mix(seconds: float, snr_db: float, seed: int) -> np.ndarray:
    """A voiced-like test clip: a 4 Hz amplitude-modulated harmonic tone (gliding f0) in white noise
    at `snr_db`, peak 0.5, float32 at 16 kHz."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(seconds * 16_000))) / 16_000
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.3 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 16_000
    tone = sum(np.sin(h * phase) / h for h in range(1, 9)) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))
    noise = rng.standard_normal(t.size)
    noise *= np.sqrt(np.mean(tone**2) / np.mean(noise**2) / 10 ** (snr_db / 10))
    mix = tone + noise
    return (mix / np.abs(mix).max() * 0.5).astype(np.float32)


@pytest.fixture(scope="module")
def reference_session() -> ort.InferenceSession:
    return ort.InferenceSession(model_path(), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def dnsmos() -> Dnsmos:
    return Dnsmos()


def test_short_clip_is_tiled_to_one_window_for_ingest():
    clip = np.arange(1000, dtype=np.float32)
    (window,) = windows(clip, short="tile")
    assert window.size == WINDOW and np.array_equal(window[1000:2000], clip)


@pytest.mark.parametrize("seconds", [0.05, 1, 2, 3.3, 4.5, 5, 8.99, 9.0, 9.01, 9.02, 10, 12, 16, 16.02, 17,
                                     23.5, 31, 32.99, 33.01, 40, 47])
def test_windows_are_the_references(seconds):
    """Same windows, same order, as the reference picks them: doubled short clips, hops, skipped ends."""
    clip = np.random.default_rng(0).uniform(-1, 1, int(seconds * 16_000)).astype(np.float32)
    ours, theirs = windows(clip), _reference_segments(clip)
    assert len(ours) == len(theirs) and all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_a_40_s_clip_skips_the_windows_the_reference_skips():
    starts = [int(w[0]) for w in windows(np.arange(40 * 16_000, dtype=np.float32))]
    assert starts == [i * 16_000 for i in [*range(7), *range(24, 31)]]


def test_an_unknown_short_rule_is_refused():
    with pytest.raises(ValueError, match="'pad' is not one of double, tile"):
        windows(np.zeros(100, np.float32), short="pad")


def _scored_by_the_port(session: ort.InferenceSession, clip: np.ndarray, folder) -> dict[str, float]:
    sf.write(folder / "clip.wav", clip, 16_000, subtype="FLOAT")  # float32 samples, read back exactly
    return _reference_port(session, str(folder / "clip.wav"))


# The issue asks for 0.01. The same windows through the same network agreed to 2e-7 (onnxruntime's
# thread count moves the last bits), so 1e-4 already means other windows or another calibration.
TOLERANCE = 1e-4


# test-fast keeps a short clip, the window boundary and a long one; make test has every length
@pytest.mark.parametrize(("seconds", "snr_db"), [(1, 20), pytest.param(2, 0, marks=pytest.mark.slow),
                                                 pytest.param(5, 10, marks=pytest.mark.slow), (9.01, 30),
                                                 (12, 5)])
def test_scores_match_a_port_of_the_reference(dnsmos, reference_session, tmp_path, seconds, snr_db):
    clip = _mix(seconds, snr_db, seed=int(seconds * 100) + snr_db)
    ours, theirs = dnsmos.score(clip, 16_000), _scored_by_the_port(reference_session, clip, tmp_path)
    for key in SCORES:
        assert ours[key] == pytest.approx(theirs[key], abs=TOLERANCE), key


@pytest.mark.slow  # ~50 CPU s: 47 windows, each through our network, the port's and speechmos' (with P.808)
@pytest.mark.parametrize(("seconds", "snr_db"),
                         [(1, 0), (2, 10), (5, 30), (9.01, 20), (12, 40), (40, 0), (40, 20)])
def test_scores_match_speechmos_runner_and_the_port(dnsmos, reference_session, tmp_path, seconds, snr_db):
    """speechmos.dnsmos.run is the reference's __call__ packaged (P.808 and all), on the same network file."""
    speechmos = pytest.importorskip("speechmos.dnsmos")  # needs librosa (the dev extra)
    clip = _mix(seconds, snr_db, seed=int(seconds * 100) + snr_db)
    ours, runner = dnsmos.score(clip, 16_000), speechmos.run(clip, 16_000)
    port = _scored_by_the_port(reference_session, clip, tmp_path)
    for key in SCORES:
        assert ours[key] == pytest.approx(float(runner[f"{key}_mos"]), abs=TOLERANCE), key
        assert ours[key] == pytest.approx(port[key], abs=TOLERANCE), key


def test_agrees_with_the_reference_implementation(dnsmos):
    """speechmos' own path (P.808 as well) on 12 s of the sample's speech."""
    speechmos = pytest.importorskip("speechmos.dnsmos")  # needs librosa (the dev extra)
    clip = np.concatenate(speech_16k(5))
    clip = clip / np.abs(clip).max() * 0.9
    ours, theirs = dnsmos.score(clip, 16_000), speechmos.run(clip, 16_000)
    for key in ("sig", "bak", "ovrl"):
        assert ours[key] == pytest.approx(float(theirs[f"{key}_mos"]), abs=1e-6)


def test_noise_scores_below_speech_and_reruns_are_identical(dnsmos):
    rng = np.random.default_rng(0)
    clean = speech_16k(2)
    noisy = [c + rng.standard_normal(c.size).astype(np.float32) * np.sqrt(np.mean(c**2)) for c in clean]
    clean_scores = [dnsmos.score(c, 16_000) for c in clean]
    noisy_scores = [dnsmos.score(np.clip(n, -1, 1), 16_000) for n in noisy]
    for c, n in zip(clean_scores, noisy_scores, strict=True):
        assert n["bak"] < c["bak"] - 1.0 and n["ovrl"] < c["ovrl"]
    assert [Dnsmos().score(c, 16_000) for c in clean] == clean_scores


def test_refuses_another_rate(dnsmos):
    with pytest.raises(ValueError, match="16000 Hz"):
        dnsmos.score(np.zeros(8000, np.float32), 8000)

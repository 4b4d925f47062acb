"""DNSMOS P.835 (voxpipe/data/quality.py) on the shipped sample's speech and on generated noise."""

from __future__ import annotations

import io

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf
import soxr
from small_sample import SAMPLE

from voxpipe.data.quality import WINDOW, Dnsmos, windows


def _speech(count: int) -> list[np.ndarray]:
    rows = pq.read_table(sorted(SAMPLE.glob("*.parquet"))[0]).slice(0, count).to_pylist()
    out = []
    for row in rows:
        wav, sr = sf.read(io.BytesIO(row["audio"]["bytes"]), dtype="float32")
        out.append(soxr.resample(wav, sr, 16_000).astype(np.float32))
    return out


@pytest.fixture(scope="module")
def dnsmos() -> Dnsmos:
    return Dnsmos()


def test_short_clip_is_tiled_to_one_window():
    clip = np.arange(1000, dtype=np.float32)
    (window,) = windows(clip)
    assert window.size == WINDOW and np.array_equal(window[1000:2000], clip)


def test_agrees_with_the_reference_implementation(dnsmos):
    """speechmos' own path (P.808 as well) on a 12 s clip, where its window count and ours agree."""
    speechmos = pytest.importorskip("speechmos.dnsmos")  # needs librosa (the dev extra)
    clip = np.concatenate(_speech(5))
    clip = clip / np.abs(clip).max() * 0.9
    ours, theirs = dnsmos.score(clip, 16_000), speechmos.run(clip, 16_000)
    for key in ("sig", "bak", "ovrl"):
        assert ours[key] == pytest.approx(float(theirs[f"{key}_mos"]), abs=1e-6)


def test_noise_scores_below_speech_and_reruns_are_identical(dnsmos):
    rng = np.random.default_rng(0)
    clean = _speech(3)
    noisy = [c + rng.standard_normal(c.size).astype(np.float32) * np.sqrt(np.mean(c**2)) for c in clean]
    clean_scores = [dnsmos.score(c, 16_000) for c in clean]
    noisy_scores = [dnsmos.score(np.clip(n, -1, 1), 16_000) for n in noisy]
    for c, n in zip(clean_scores, noisy_scores, strict=True):
        assert n["bak"] < c["bak"] - 1.0 and n["ovrl"] < c["ovrl"]
    assert [Dnsmos().score(c, 16_000) for c in clean] == clean_scores


def test_refuses_another_rate(dnsmos):
    with pytest.raises(ValueError, match="16000 Hz"):
        dnsmos.score(np.zeros(8000, np.float32), 8000)

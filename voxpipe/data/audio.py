"""Decode, downmix and resample audio the same way in every step.

libsndfile (through soundfile) reads WAV of any subtype, FLAC, OGG/Vorbis and MP3; soxr is a
proper band-limited resampler. Everything downstream sees float32 mono at the target rate.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr


class AudioDecodeError(ValueError):
    """The bytes or file could not be decoded as audio."""


def to_mono_resampled(samples: np.ndarray, sr: int, target_sr: int) -> np.ndarray:
    """[frames] or [frames, channels] at `sr` → float32 mono [frames'] at `target_sr`."""
    x = np.asarray(samples, dtype=np.float32)
    if x.ndim == 2:
        x = x.mean(axis=1)
    if sr != target_sr and x.size:
        x = soxr.resample(x, sr, target_sr, quality="HQ").astype(np.float32, copy=False)
    return x


def decode_native(source: bytes | str | Path) -> tuple[np.ndarray, int]:
    """Decode encoded bytes or a file path to float32 mono at the file's own rate: (samples, rate)."""
    try:
        handle = io.BytesIO(source) if isinstance(source, bytes) else source
        samples, sr = sf.read(handle, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, TypeError) as e:
        raise AudioDecodeError(str(e).strip() or type(e).__name__) from e
    return to_mono_resampled(samples, sr, sr), sr


def decode(source: bytes | str | Path, target_sr: int) -> np.ndarray:
    """Decode encoded bytes or a file path to float32 mono at `target_sr`."""
    samples, sr = decode_native(source)
    return to_mono_resampled(samples, sr, target_sr)


def flac16_bytes(pcm: np.ndarray, sr: int) -> bytes:
    """int16 samples as FLAC bytes, encoded in memory: libsndfile fsyncs every file it closes,
    which made ingest disk-bound when it wrote each clip straight to disk."""
    buf = io.BytesIO()
    sf.write(buf, pcm, sr, format="FLAC", subtype="PCM_16")
    return buf.getvalue()

"""Is the person who recorded the consent the person in the clips? (`consent_voice_mismatch`)

A consent record of kind person names the recording of its consent statement. After ingest has decoded
a speaker's clips, the recording's speaker embedding is compared (cosine) with the mean embedding of up
to CLIPS of that speaker's kept clips; below `ingest.consent_voice_threshold` every kept row of the
speaker moves to quarantine as `consent_voice_mismatch`: a consent given by someone else does not cover
this voice.

The encoder is Resemblyzer's GE2E (weights in its wheel, as `evaluate.speaker`'s default), called here
directly because ingest sits below evaluate. The threshold's default, 0.72, was measured on the shipped
sample: each of its 64 clips taken as the "consent recording" of its voice scores 0.816-0.97 (mean 0.926)
against the mean of 8 other clips of that voice and 0.50-0.618 (mean 0.555) against the other voice;
0.72 lies midway (tests/test_consent.py feeds both cases).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from functools import cache
from pathlib import Path

import numpy as np

from voxpipe.data.audio import AudioDecodeError, decode_native, to_mono_resampled
from voxpipe.errors import StepError
from voxpipe.voxcpm2_format import SAMPLE_RATE

CLIPS = 8  # a voice's mean embedding is taken over its first clips: enough to be stable, cheap to compute


@cache
def _encoder():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # its scipy.ndimage.morphology import
            from resemblyzer import VoiceEncoder, preprocess_wav
    except ImportError as e:
        raise StepError(f"comparing voices (a consent recording, a long recording's clips) needs Resemblyzer "
                        f"({e}): run `make install`, or `pip install -e '.[eval]' && pip install --no-deps "
                        "resemblyzer==0.1.4`") from e
    return VoiceEncoder("cpu", verbose=False), preprocess_wav


def embed(path: Path) -> np.ndarray:
    """Unit-norm GE2E embedding of an audio file, at 16 kHz with long silences cut (Resemblyzer's own)."""
    native, rate = decode_native(path)
    return embed_samples(to_mono_resampled(native, rate, SAMPLE_RATE))


def embed_samples(wav: np.ndarray, partials: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """`embed` of 16 kHz samples; with `partials`, also the unit-norm embeddings of its 1.6 s windows
    (Resemblyzer's, 1.3 a second), one row each: how the voice varies along the clip."""
    encoder, preprocess = _encoder()
    wav = wav.astype(np.float32)
    trimmed = preprocess(wav)
    chosen = trimmed if trimmed.size >= SAMPLE_RATE // 2 else wav
    if not partials:
        return encoder.embed_utterance(chosen)
    whole, windows, _ = encoder.embed_utterance(chosen, return_partials=True)
    return whole, windows


def similarity(recording: Path, clips: list[Path]) -> float:
    """Cosine of the recording's embedding with the unit mean of the clips' (first CLIPS)."""
    try:
        voice = embed(recording)
    except (AudioDecodeError, ValueError, OSError) as e:
        raise StepError(f"the consent recording {recording} cannot be read as audio ({str(e)[:120]}): give "
                        "the recording of the consent statement (WAV, FLAC, OGG, MP3) in the record's "
                        "`recording`") from None
    mean = np.mean([embed(c) for c in clips[:CLIPS]], axis=0)
    return float(voice @ (mean / np.linalg.norm(mean)))


def mismatched(recordings: Mapping[str, str], clips: Mapping[str, list[Path]], threshold: float
               ) -> dict[str, str]:
    """{speaker: why its rows are quarantined} for each speaker with a consent recording whose voice is not
    the clips' (similarity below `threshold`)."""
    found = {}
    for speaker, recording in sorted(recordings.items()):
        if clips.get(speaker):
            score = similarity(Path(recording), clips[speaker])
            if score < threshold:
                found[speaker] = (f"speaker {speaker[:80]!r}: the consent recording {Path(recording).name} "
                                  f"is another voice (speaker similarity {score:.3f} < "
                                  f"consent_voice_threshold={threshold})")
    return found

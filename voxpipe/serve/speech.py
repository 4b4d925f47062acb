"""Texts to speech, optionally in the voice of a reference clip: what the served model and `voxpipe
synthesize` both run, so a registered model and a checkpoint folder say the same thing.

A reference is a path to an audio file (readable where the model runs) or the file's bytes in
base64 (what a remote client sends: `base64.b64encode(open("me.wav", "rb").read()).decode()`,
optionally with a `data:audio/wav;base64,` prefix). VoxCPM2 takes it as a 16 kHz mono waveform.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from voxpipe.data.audio import AudioDecodeError, decode
from voxpipe.errors import StepError

if TYPE_CHECKING:
    from voxpipe.model.voxcpm2 import GeneratedSpeech, VoxCPM2

SAMPLE_RATE = 16000  # what VoxCPM2's AudioVAE encodes
_DATA_URL = "base64,"


def reference_waveform(value: str, where: str = "reference_audio") -> np.ndarray:
    """16 kHz mono float32 of a path or base64 audio; a StepError naming `where` when it is neither."""
    text = value.strip()
    if len(text) < 4096 and Path(text).is_file():
        source: bytes | Path = Path(text)
    else:
        try:
            source = base64.b64decode(text.partition(_DATA_URL)[2] or text, validate=True)
        except (binascii.Error, ValueError):
            raise StepError(f"{where}: {text[:80]!r} is neither an audio file nor base64 audio") from None
    try:
        wav = decode(source, SAMPLE_RATE)
    except AudioDecodeError as e:
        raise StepError(f"{where}: not decodable audio ({e}); give a WAV/FLAC file or its base64") from e
    if wav.size == 0:
        raise StepError(f"{where}: the reference clip is empty")
    return wav


def speak(
    model: VoxCPM2, texts: list[str], references: list[str | None], *, seed: int, cfg_value: float,
    inference_timesteps: int, max_len: int,
) -> GeneratedSpeech:
    """One batch of generation; row i in the voice of references[i] (None or "": the learned voice)."""
    refs = [
        reference_waveform(r, f"reference_audio of row {i}") if isinstance(r, str) and r.strip() else None
        for i, r in enumerate(references)
    ]
    return model.generate(texts, refs, seed=seed, cfg_value=cfg_value,
                          inference_timesteps=inference_timesteps, max_len=max_len)

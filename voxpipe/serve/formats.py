"""What `/v1/audio/speech` answers in: the formats the soundfile wheel writes (wav, flac, pcm, and mp3 and
opus from its libsndfile), always at the model's own rate (VoxCPM2: 48 kHz) as the header says, and the
input split into sentences so that streamed audio leaves as each sentence is made."""

from __future__ import annotations

import io
import re
import struct

import numpy as np
import soundfile as sf

# response_format -> (soundfile format, subtype, media type); pcm: raw 16-bit little-endian mono
FORMATS = {
    "wav": ("WAV", "PCM_16", "audio/wav"),
    "flac": ("FLAC", "PCM_16", "audio/flac"),
    "mp3": ("MP3", "MPEG_LAYER_III", "audio/mpeg"),
    "opus": ("OGG", "OPUS", "audio/ogg"),
    "pcm": (None, None, "audio/pcm"),
}
STREAMED = ("pcm", "wav")  # the formats that can leave before their length is known
_CJK_ENDS = "。！？；"
_SENTENCE_END = re.compile(rf"(?<=[.!?;:。！？；：…])\s+|(?<=[{_CJK_ENDS}])")
MIN_SENTENCE_CHARS = 12  # shorter pieces ("Hi.") join the next, so that each chunk is worth its prompt


def pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes()


def encode(audio: np.ndarray, rate: int, response_format: str) -> bytes:
    if response_format == "pcm":
        return pcm16(audio)
    fmt, subtype, _ = FORMATS[response_format]
    buf = io.BytesIO()
    # 16-bit formats get pcm16's very samples: a WAV holds what the stream of the same request held
    samples = np.frombuffer(pcm16(audio), "<i2") if subtype == "PCM_16" else np.clip(audio, -1.0, 1.0)
    sf.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def streamed_wav_header(rate: int) -> bytes:
    """A 16-bit mono WAV header whose sizes say "unknown, read to the end" (0xFFFFFFFF), as streaming
    servers send it; players and soundfile read such a stream to its end."""
    unknown = 0xFFFFFFFF
    fmt = struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)  # PCM, mono, 16 bit
    return (b"RIFF" + struct.pack("<I", unknown) + b"WAVEfmt " + fmt
            + b"data" + struct.pack("<I", unknown))


def sentences(text: str) -> list[str]:
    """The text in sentence-sized pieces, in order, nothing dropped (joined back they are the text)."""
    pieces, current = [], ""
    for part in (p.strip() for p in _SENTENCE_END.split(text) if p.strip()):
        current = _join(current, part)
        if len(current) >= MIN_SENTENCE_CHARS:
            pieces.append(current)
            current = ""
    if current:
        if pieces and len(current) < MIN_SENTENCE_CHARS:
            pieces[-1] = _join(pieces[-1], current)
        else:
            pieces.append(current)
    return pieces or [text]


def _join(before: str, after: str) -> str:
    """Two pieces as they stood: CJK punctuation took no space after it."""
    if not before:
        return after
    return before + ("" if before[-1] in _CJK_ENDS else " ") + after

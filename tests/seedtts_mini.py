"""A tiny Seed-TTS-eval test set made with espeak-ng, in the published layout (tests only).

Seed-TTS-eval's sets cannot be downloaded here, so the tests build one the same shape: `meta.lst` with
`utt|prompt_text|prompt_wav|infer_text` lines, `prompt_wav` relative to the list's folder, the prompt clips
under `prompt-wavs/` at espeak's native 22.05 kHz (evaluate resamples, as for the real 16/24/48 kHz ones).
English and Mandarin lines; the prompt voices are none of data/sample's (en-us+m3, en-us+f4), as the real
sets' speakers are not the fine-tune's.
"""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import pytest
import soundfile as sf

ESPEAK = shutil.which("espeak-ng")
needs_espeak = pytest.mark.skipif(
    ESPEAK is None,
    reason="espeak-ng is not installed (Debian: apt-get install espeak-ng; .ci/run installs it)",
)

# (utt, espeak voice, prompt text, text to generate)
LINES = (
    ("en_0001-en_0002", "en-gb-scotland", "The ferry left the harbour before dawn.", "Please call Stella."),
    ("en_0003-en_0004", "en-us+f2", "My brother keeps bees behind the barn.",
     "The museum opens at ten on Sundays."),
    ("zh_0001-zh_0002", "cmn", "今天天气很好。", "我们明天去公园散步。"),
    ("zh_0003-zh_0004", "cmn+f3", "请把窗户关上。", "这本书非常有意思。"),
)


def speak(voice: str, text: str) -> tuple[bytes, int]:
    """espeak-ng's WAV of `text` in `voice`: (wav bytes, sample rate)."""
    wav = subprocess.run([ESPEAK, "-v", voice, "--stdout", text], check=True, capture_output=True).stdout
    return wav, sf.info(io.BytesIO(wav)).samplerate


def make_set(folder: Path, lines: tuple[tuple[str, str, str, str], ...] = LINES) -> Path:
    """Write the set under `folder` (meta.lst, prompt-wavs/*.wav); return the folder."""
    (folder / "prompt-wavs").mkdir(parents=True, exist_ok=True)
    rows = []
    for utt, voice, prompt_text, text in lines:
        wav, _ = speak(voice, prompt_text)
        name = f"prompt-wavs/{utt.split('-')[0]}.wav"
        (folder / name).write_bytes(wav)
        rows.append(f"{utt}|{prompt_text}|{name}|{text}")
    (folder / "meta.lst").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder

"""A voice no fixture has, as a Hugging Face parquet written by the `datasets` library (tests only).

What a user downloads from the Hub or writes with `datasets` themselves: an `audio` column of the `Audio`
feature at 44.1 kHz with the clips' bytes embedded (a struct {bytes, path}, the feature's metadata in the
parquet schema), and a `text` column whose sentences have numbers, dates and money, so ingest's text
normalization has work to do. The speaker is espeak-ng's West Midlands English with the m4 variant,
none of the shipped sample's (`en-us+m3`, `en-us+f4`), the demo base's eight or tests/seedtts_mini.py's
four; espeak speaks at 22.05 kHz, so every clip is resampled to 44.1 kHz here and ingest has a real rate
to bring down.
"""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

ESPEAK = shutil.which("espeak-ng")
needs_espeak = pytest.mark.skipif(
    ESPEAK is None,
    reason="espeak-ng is not installed (Debian: apt-get install espeak-ng; .ci/run installs it)",
)
VOICE = "en-gb-x-gbcwmd+m4"
SAMPLE_RATE = 44100
# 24 clips: enough for manifest's val split (min_val 2 from a speaker with at least 4 rows) and evaluate's
# texts, few enough that ingest's per-clip quality score stays seconds
TEXTS = (
    "The invoice for $12.50 was paid on March 3, 2024.",
    "We sold 1,250 tickets at $8 each on 14 February.",
    "Her flight leaves at 7:45 on June 21, 2025.",
    "The rent went up to $1,400 a month in 2023.",
    "Call me back before 5 pm on Friday, 9 May.",
    "A coffee costs $3.75, and a muffin is $2.",
    "The bridge opened on 1 July 1998, after 6 years of work.",
    "Only 3 of the 17 boxes arrived on 2 October.",
    "The museum raised $2.5 million in 2019.",
    "The bus fare is $1.10, or $0.55 for children.",
    "He turned 40 on December 25, 2021.",
    "The 2 meetings are on Tuesday, 4 March, at 10 and 11.",
    "Our team of 12 finished 3 days early, on 30 April.",
    "The repair came to $349.99, tax included.",
    "She ran 5 kilometres in 27 minutes on 8 August.",
    "The library holds 48,000 books and 300 maps.",
    "The shop was founded in 1887 and sold it for $15.",
    "Please pay the $20 deposit by 31 January.",
    "The storm on 19 November 2022 cut the power for 36 hours.",
    "A ticket to the 1999 final cost only $45.",
    "The train from platform 9 leaves at 6:15.",
    "We planted 250 trees on 22 April, Earth Day.",
    "The report of 16 June lists 7 new members.",
    "Lunch for 4 came to $63.40 on 5 September.",
)


def speak(text: str) -> np.ndarray:
    """espeak-ng's reading of `text` in VOICE, resampled from its native rate to SAMPLE_RATE (float32)."""
    import soxr

    wav = subprocess.run([ESPEAK, "-v", VOICE, "--stdout", text], check=True, capture_output=True).stdout
    audio, rate = sf.read(io.BytesIO(wav), dtype="float32")
    return soxr.resample(audio, rate, SAMPLE_RATE).astype(np.float32)


def write_voice(folder: Path) -> Path:
    """The voice as `folder/train-00000-of-00001.parquet`, written by `datasets` (Dataset.to_parquet), with
    each clip's 44.1 kHz WAV bytes inside; returns the file."""
    from datasets import Audio, Dataset

    clips = []
    for i, text in enumerate(TEXTS):
        buffer = io.BytesIO()
        sf.write(buffer, speak(text), SAMPLE_RATE, format="WAV", subtype="PCM_16")
        clips.append({"bytes": buffer.getvalue(), "path": f"clip-{i:04d}.wav"})
    dataset = Dataset.from_dict({"audio": clips, "text": list(TEXTS)})
    dataset = dataset.cast_column("audio", Audio(sampling_rate=SAMPLE_RATE))
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "train-00000-of-00001.parquet"
    dataset.to_parquet(str(out))
    return out

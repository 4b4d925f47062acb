"""A voice no fixture has, as a Hugging Face parquet written by the `datasets` library (tests only).

What a user downloads from the Hub or writes with `datasets` themselves: an `audio` column of the `Audio`
feature at 44.1 kHz with the clips' bytes embedded (a struct {bytes, path}, the feature's metadata in the
parquet schema), and a `text` column whose sentences have numbers, dates and money, so ingest's text
normalization has work to do. The speaker is espeak-ng's West Midlands English with the m4 variant,
none of the shipped sample's (`en-us+m3`, `en-us+f4`), the demo base's eight or tests/seedtts_mini.py's
four; espeak speaks at 22.05 kHz, so every clip is resampled to 44.1 kHz here and ingest has a real rate
to bring down. Without espeak-ng, a deterministic formant voice reads the same texts (a syllable per
vowel letter, a pulse train through three vowel formants): no words, but speech-like enough that ingest's
DNSMOS check keeps it (background score about 3.5, the floor is 2.0), so the path still runs.
"""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import numpy as np
import soundfile as sf
import yaml

ESPEAK = shutil.which("espeak-ng")
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


FORMANTS = ((730, 1090, 2440), (530, 1840, 2480), (270, 2290, 3010), (570, 840, 2410), (300, 870, 2240))


def formant_voice(text: str) -> np.ndarray:
    """The stand-in voice without espeak-ng: per word, a syllable per vowel letter (at least one), each a
    115-130 Hz pulse train through the three formants of a vowel the letters pick; gaps between words."""
    from scipy.signal import lfilter

    parts = [np.zeros(int(0.1 * SAMPLE_RATE))]
    for word in text.split():
        letters = [c for c in word.lower() if c.isalnum()] or ["a"]
        for k in range(max(1, sum(c in "aeiouy" for c in letters))):
            n = int((0.16 + 0.02 * (len(letters) % 3)) * SAMPLE_RATE)
            pitch = 115 + 15 * np.sin(np.pi * (k + 1) * np.arange(n) / n)
            phase = 2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE
            pulses = np.diff(np.concatenate([[0], (phase % (2 * np.pi)) < 0.6])).astype(float)
            syllable = np.zeros(n)
            for j, f in enumerate(FORMANTS[(ord(letters[k % len(letters)]) + k) % 5]):
                r = np.exp(-np.pi * (80 + 40 * j) / SAMPLE_RATE)  # a resonator of bandwidth 80 + 40 j Hz
                resonator = [1, -2 * r * np.cos(2 * np.pi * f / SAMPLE_RATE), r * r]
                syllable += lfilter([1 - r], resonator, pulses) / (j + 1)
            parts.append(syllable * np.sin(np.pi * np.arange(n) / n) ** 0.5)
        parts.append(np.zeros(int(0.06 * SAMPLE_RATE)))
    audio = np.concatenate([*parts, np.zeros(int(0.15 * SAMPLE_RATE))])
    return (0.3 * audio / np.abs(audio).max()).astype(np.float32)


def speak(text: str) -> np.ndarray:
    """`text` read in VOICE by espeak-ng, resampled from its native rate to SAMPLE_RATE (float32); the
    formant voice where espeak-ng is not installed."""
    import soxr

    if ESPEAK is None:
        return formant_voice(text)
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
    write_consent(folder)
    return out


def write_consent(folder: Path) -> Path:
    """folder/voices.yaml, as the README tells a user to write it: the folder's one voice (named after the
    folder) with a consent record; of kind synthetic, since these voices are made, not anyone's."""
    record = {"id": f"{folder.name}-consent", "speaker": folder.name, "subject": "a test's made voice",
              "kind": "synthetic", "scope": ["tts"], "granted": "2026-01-01", "licence": "CC0-1.0"}
    path = folder / "voices.yaml"
    path.write_text(yaml.safe_dump({"voices": [record]}, sort_keys=False), encoding="utf-8")
    return path

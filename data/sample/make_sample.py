"""Regenerate the shipped sample dataset (needs espeak-ng; nothing else in voxpipe does).

Two clearly different espeak-ng voices read 64 English sentences at espeak's native 22.05 kHz, so
ingest has real resampling to do. Rows are stored the way Hugging Face `datasets` stores audio in
parquet (an `audio` struct {bytes, path} with FLAC bytes, plus `text` and `speaker`), split over two
files with small row groups so streaming by row group is exercised.

    python data/sample/make_sample.py            # writes data/sample/train-0000N-of-00002.parquet
"""

from __future__ import annotations

import io
import json
import random
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import soundfile as sf
import yaml

HERE = Path(__file__).resolve().parent
SAMPLE_RATE = 22050
N_FILES = 2
ROW_GROUP_ROWS = 16
# espeak-ng voice, base pitch (0-99) and base speed (words/min): a low male and a high female voice.
VOICES = {"spk_m": ("en-us+m3", 32, 155), "spk_f": ("en-us+f4", 78, 165)}
SILENCE = 0.01  # trim threshold (full scale)
LEAD_PAD_S, TRAIL_PAD_S = 0.10, 0.20  # keep trailing silence well under 0.5 s

SENTENCES = [
    "Good morning, everyone.",
    "Please close the door behind you.",
    "The train to the city leaves at half past seven.",
    "She found an old map hidden inside the library book.",
    "Could you pass me the salt, please?",
    "We planted tomatoes, beans and a row of sunflowers along the fence this spring.",
    "The weather report promised sunshine, but it rained all afternoon.",
    "Thank you for calling.",
    "My grandfather built this wooden table with his own hands more than forty years ago.",
    "Turn left at the second traffic light and the bakery is on your right.",
    "It is never too late to learn something new.",
    "The children laughed as the puppy chased its own tail around the garden.",
    "Our meeting has been moved to Thursday afternoon.",
    "A cup of hot tea is the best cure for a cold and rainy evening.",
    "How much does this blue jacket cost?",
    "The museum opens at ten and closes at six, except on public holidays when it stays closed.",
    "He forgot his umbrella again.",
    "The river slowly carved a deep valley through the soft rock over thousands of years.",
    "Please remember to water the plants while I am away.",
    "I would like a table for two near the window.",
    "The orchestra played so beautifully that nobody in the hall made a sound.",
    "Where did you put the car keys?",
    "Fresh bread from the oven fills the whole house with a wonderful smell.",
    "Scientists discovered a new species of frog in the rainforest last year.",
    "The library will be closed for repairs until the end of the month.",
    "Let us meet at the station.",
    "She practiced the piano every day, and by winter she could play the whole sonata.",
    "The mountain path was steep and narrow, so we walked carefully in single file.",
    "Do you know what time the pharmacy closes tonight?",
    "A gentle breeze moved the curtains.",
    "After dinner we played cards and told stories until well past midnight.",
    "The package should arrive within three to five working days.",
    "Every autumn the maple trees turn bright red and gold.",
    "Please speak a little more slowly.",
    "The old lighthouse has guided ships safely into the harbor for over a century.",
    "He wrote a long letter to his sister who lives on the other side of the world.",
    "Is this seat taken?",
    "The recipe calls for two eggs, a cup of flour and a pinch of salt.",
    "Bright stars filled the sky above the quiet desert.",
    "Our team finished the project a whole week ahead of schedule.",
    "The cat curled up on the warm windowsill and fell asleep in the afternoon sun.",
    "Could you help me carry these boxes upstairs?",
    "Learning a new language opens doors to other cultures and new friendships.",
    "The storm knocked out the power for several hours.",
    "We watched the sunset from the top of the hill.",
    "Please leave your shoes by the door.",
    "The farmer checked the fences before the cattle were let out to graze.",
    "My favorite season is spring, when the days grow longer and everything turns green again.",
    "The bus was late, so I walked to work instead.",
    "Have you ever seen a whale in the open ocean?",
    "The students listened carefully as the teacher explained the experiment step by step.",
    "Dinner is ready, come and eat.",
    "A small boat drifted lazily across the calm blue lake.",
    "The new bridge will shorten the journey between the two towns by almost an hour.",
    "I think we should leave early to avoid the traffic.",
    "The painter mixed yellow and blue to create the perfect shade of green.",
    "Thank you so much for your kind words and your help today.",
    "Snow covered the roofs and streets by the next morning.",
    "The doctor will see you in a few minutes.",
    "Bees carry pollen from flower to flower, helping fruit and vegetables to grow.",
    "Please write your name at the top of the page.",
    "The little shop on the corner sells the best ice cream in town.",
    "When the concert ended, the audience stood up and applauded for several minutes.",
    "See you tomorrow at noon.",
]


def synthesize(text: str, voice: str, pitch: int, speed: int) -> np.ndarray:
    wav = subprocess.run(
        ["espeak-ng", "-v", voice, "-p", str(pitch), "-s", str(speed), "--stdout", text],
        check=True, capture_output=True,
    ).stdout
    samples, sr = sf.read(io.BytesIO(wav), dtype="float32")
    assert sr == SAMPLE_RATE, f"espeak-ng spoke at {sr} Hz, expected {SAMPLE_RATE}"
    return trim(samples)


def trim(x: np.ndarray) -> np.ndarray:
    """Cut espeak's leading/trailing silence down to short pads."""
    loud = np.flatnonzero(np.abs(x) > SILENCE)
    start = max(0, loud[0] - int(LEAD_PAD_S * SAMPLE_RATE))
    end = min(len(x), loud[-1] + int(TRAIL_PAD_S * SAMPLE_RATE))
    return x[start:end]


def flac_bytes(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, SAMPLE_RATE, format="FLAC", subtype="PCM_16", compression_level=1.0)
    return buf.getvalue()


def build_rows() -> list[dict]:
    rng = random.Random(0)
    speakers = list(VOICES)
    rows = []
    for i, text in enumerate(SENTENCES):
        speaker = speakers[i % len(speakers)]
        voice, pitch, speed = VOICES[speaker]
        x = synthesize(text, voice, pitch + rng.randint(-4, 4), speed + rng.randint(-10, 10))
        seconds = len(x) / SAMPLE_RATE
        assert 1.0 <= seconds <= 12.0, f"{text!r}: {seconds:.2f} s is outside 1-12 s"
        name = f"{speaker}_{i:03d}.flac"
        rows.append({"audio": {"bytes": flac_bytes(x), "path": name}, "text": text, "speaker": speaker})
    return rows


def hf_metadata() -> dict[bytes, bytes]:
    """The schema note `datasets` writes, so the files load there as an Audio dataset too."""
    features = {
        "audio": {"sampling_rate": SAMPLE_RATE, "_type": "Audio"},
        "text": {"dtype": "string", "_type": "Value"},
        "speaker": {"dtype": "string", "_type": "Value"},
    }
    return {b"huggingface": json.dumps({"info": {"features": features}}).encode()}


def consent_records() -> dict:
    """voices.yaml: a consent record of kind synthetic per espeak voice (nobody's voice: no recording),
    so the demo passes ingest's consent check as a user's data must."""
    return {"voices": [
        {"id": f"sample-{speaker}", "speaker": speaker, "subject": f"espeak-ng voice {voice} (synthetic)",
         "kind": "synthetic", "scope": ["tts", "voice_clone"], "granted": "2026-01-01", "expires": None,
         "licence": "CC0-1.0", "recording": None, "recording_sha256": None, "revoked": False,
         "revoked_reason": ""}
        for speaker, (voice, _, _) in VOICES.items()]}


def main() -> None:
    schema = pa.schema(
        [
            ("audio", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
            ("text", pa.string()),
            ("speaker", pa.string()),
        ],
        metadata=hf_metadata(),
    )
    rows = build_rows()
    per_file = -(-len(rows) // N_FILES)
    for k in range(N_FILES):
        chunk = rows[k * per_file:(k + 1) * per_file]
        path = HERE / f"train-{k:05d}-of-{N_FILES:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(chunk, schema=schema), path, row_group_size=ROW_GROUP_ROWS)
        print(f"{path.name}: {len(chunk)} rows, {path.stat().st_size / 1e6:.2f} MB")
    (HERE / "voices.yaml").write_text(yaml.safe_dump(consent_records(), sort_keys=False), encoding="utf-8")


if __name__ == "__main__":
    main()

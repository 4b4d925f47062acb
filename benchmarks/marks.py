"""PerTh's watermark as voxpipe applies it (voxpipe/evaluate/marks.py): does it survive, does it fire on real
speech, what does it cost. Prints one JSON object:

- detection rate on marked clips: as written (16-bit WAV at 48 kHz, voxpipe's rate), after an MP3 encode
  (libsndfile's LAME, its default bitrate) and after resampling to 16 kHz;
- false positives on unmarked clips: the shipped sample's recordings (data/sample) and a hold-out voice
  (espeak-ng en-gb+m4, in neither the sample nor the demo base's data);
- the quality cost, paired clip by clip (marked minus unmarked): DNSMOS P.835 OVRL and SIG with a
  bootstrap 95% interval of the mean difference, and the GE2E speaker similarity of each marked clip to its
  unmarked self;
- milliseconds of CPU wall time per second of audio, to mark and to detect (warm, this machine's threads).

The marked clips are the same clips, marked: the sample's voices and the hold-out voice at 48 kHz.

    .venv/bin/python benchmarks/marks.py [--clips 24] [--holdout 12]
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import parse_args  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RATE = 48000  # what synthesize and serve write
HOLDOUT_VOICE = "en-gb+m4"
HOLDOUT = [
    "A ferry leaves the harbour every morning before the fishing boats come back.",
    "Please keep the receipt until the parcel has arrived at the right address.",
    "The library closes early on Fridays during the summer months.",
    "Our neighbour painted the fence a pale shade of green last weekend.",
    "Heavy snow was forecast for the northern hills by the end of the week.",
    "She tuned the old piano before the concert started in the chapel.",
    "Two trains were delayed because a tree had fallen across the line.",
    "He wrote the recipe on a card and pinned it above the cooker.",
    "The museum is showing maps that were drawn three hundred years ago.",
    "Bring a warm coat, since the evenings by the lake get cold quickly.",
    "The committee agreed to meet again after the results were published.",
    "A small bakery on the corner sells bread that is still warm at dawn.",
]


def sample_clips(count: int) -> list[np.ndarray]:
    """`count` of the sample's recordings, spread over both files and speakers, at RATE."""
    from voxpipe.evaluate.marks import _resample

    rows = [r for f in sorted((ROOT / "data/sample").glob("*.parquet"))
            for r in pq.read_table(f, columns=["audio"]).column("audio").to_pylist()]
    step = max(1, len(rows) // count)
    clips = []
    for row in rows[::step][:count]:
        audio, rate = sf.read(io.BytesIO(row["bytes"]), dtype="float32")
        clips.append(_resample(audio, rate, RATE))
    return clips


def holdout_clips(count: int) -> list[np.ndarray]:
    from voxpipe.evaluate.marks import _resample

    clips = []
    for text in HOLDOUT[:count]:
        wav = subprocess.run(["espeak-ng", "-v", HOLDOUT_VOICE, "--stdout", text], check=True,
                             capture_output=True).stdout
        audio, rate = sf.read(io.BytesIO(wav), dtype="float32")
        clips.append(_resample(audio, rate, RATE))
    return clips


def _through(audio: np.ndarray, fmt: str) -> tuple[np.ndarray, int]:
    """The clip after writing it as `fmt` and reading it back (what a listener's file holds)."""
    from voxpipe.evaluate.marks import _resample

    if fmt == "16k":
        low = _resample(audio, RATE, 16000)
        return np.frombuffer((np.clip(low, -1, 1) * 32767).astype("<i2").tobytes(), "<i2") / 32768.0, 16000
    buffer = io.BytesIO()
    sf.write(buffer, np.clip(audio, -1, 1), RATE, format=fmt.upper(),
             subtype="MPEG_LAYER_III" if fmt == "mp3" else "PCM_16")
    buffer.seek(0)
    return sf.read(buffer, dtype="float32")


def _interval(diffs: np.ndarray, seed: int = 0) -> list[float]:
    """Bootstrap 95% interval of the mean paired difference (10,000 resamples, seeded)."""
    rng = np.random.default_rng(seed)
    means = diffs[rng.integers(0, diffs.size, (10_000, diffs.size))].mean(axis=1)
    return [round(float(np.percentile(means, 2.5)), 4), round(float(np.percentile(means, 97.5)), 4)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=24, help="sample recordings (of 64)")
    parser.add_argument("--holdout", type=int, default=12, help=f"hold-out clips (at most {len(HOLDOUT)})")
    args = parse_args(parser, clips=2, holdout=2)

    from voxpipe.evaluate.marks import THRESHOLD, mark, watermark_score
    from voxpipe.evaluate.quality import DnsmosScorer
    from voxpipe.evaluate.speaker import SpeakerEncoder, cosine

    real, held = sample_clips(args.clips), holdout_clips(args.holdout)
    clips = real + held
    mark(clips[0][:RATE], RATE)  # warm: the weights load once, outside the timing
    seconds = sum(c.size for c in clips) / RATE
    start = time.perf_counter()
    marked = [mark(c, RATE) for c in clips]
    mark_ms = (time.perf_counter() - start) * 1000 / seconds

    detected: dict[str, list[bool]] = {}
    start = time.perf_counter()
    detected["wav"] = [watermark_score(*_through(m, "wav")) > THRESHOLD for m in marked]
    detect_ms = (time.perf_counter() - start) * 1000 / seconds
    for fmt in ("mp3", "16k"):
        detected[fmt] = [watermark_score(*_through(m, fmt)) > THRESHOLD for m in marked]
    false_real = [watermark_score(*_through(c, "wav")) > THRESHOLD for c in real]
    false_held = [watermark_score(*_through(c, "wav")) > THRESHOLD for c in held]
    scores_unmarked = [watermark_score(c, RATE) for c in clips]

    from voxpipe.evaluate.marks import _resample

    dnsmos, encoder = DnsmosScorer(), SpeakerEncoder()
    before = [dnsmos.score(_resample(c, RATE, 16000), 16000) for c in clips]
    after = [dnsmos.score(_resample(m, RATE, 16000), 16000) for m in marked]
    similarity = [cosine(encoder.embed(c, RATE), encoder.embed(m, RATE))
                  for c, m in zip(clips, marked, strict=True)]
    out = {
        "clips_marked": len(clips), "audio_seconds": round(seconds, 1),
        "sample_clips": len(real), "holdout_clips": len(held), "holdout_voice": f"espeak-ng {HOLDOUT_VOICE}",
        "threshold": THRESHOLD,
        **{f"detection_rate_{k}": round(float(np.mean(v)), 4) for k, v in detected.items()},
        "false_positive_rate_sample": round(float(np.mean(false_real)), 4),
        "false_positive_rate_holdout": round(float(np.mean(false_held)), 4),
        "max_score_unmarked": round(float(max(scores_unmarked)), 4),
    }
    for key in ("ovrl", "sig"):
        diffs = np.array([a[key] - b[key] for a, b in zip(after, before, strict=True)])
        out[f"dnsmos_{key}_unmarked"] = round(float(np.mean([b[key] for b in before])), 4)
        out[f"dnsmos_{key}_delta"] = round(float(diffs.mean()), 4)
        out[f"dnsmos_{key}_delta_ci95"] = _interval(diffs)
    out["speaker_similarity_marked_to_unmarked_mean"] = round(float(np.mean(similarity)), 4)
    out["speaker_similarity_marked_to_unmarked_min"] = round(float(np.min(similarity)), 4)
    out["mark_ms_per_audio_s"] = round(mark_ms, 1)
    out["detect_ms_per_audio_s"] = round(detect_ms, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

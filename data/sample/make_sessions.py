"""Long "sessions" built from the shipped sample's clips: raw recordings for `make demo-raw`, its tests and
benchmarks/raw_recordings.py.

A session is one voice's clips read one after another with a pause of 0.6-1.5 s between them, and after
every few clips one of an interloper's (the sample's other voice, an interviewer's line). The sessions are
16 kHz WAVs in FOLDER/spk_m/ (ingest names the voice after the folder: spk_m), beside the sample's consent
records (voices.yaml) and truth.json, which lists every segment: session file, start, end (seconds),
speaker and text. Deterministic (fixed seed).

    .venv/bin/python data/sample/make_sessions.py work/sessions
    .venv/bin/python data/sample/make_sessions.py --score work/sessions/spk_m work/ingest  # after ingest

`--score` says how ingest did against truth.json: the interloper's lines set aside, the main voice's
clips kept, and the recogniser's WER against the script (evaluate's scoring text, per clip, then the mean).
"""

from __future__ import annotations

import argparse
import io
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import soundfile as sf
import soxr

HERE = Path(__file__).resolve().parent
RATE = 16000
MAIN, INTERLOPER = "spk_m", "spk_f"
SEGMENT_MIN_S = 2.0  # the segments a session is made of: at least ingest.segment.min_seconds, never joined


def sample_clips(min_s: float = SEGMENT_MIN_S) -> dict[str, list[tuple[np.ndarray, str]]]:
    """{speaker: [(16 kHz samples, text)]} of the sample's clips at least `min_s` long, in file order."""
    clips: dict[str, list[tuple[np.ndarray, str]]] = {}
    for path in sorted(HERE.glob("train-*.parquet")):
        for row in pq.read_table(path).to_pylist():
            x, rate = sf.read(io.BytesIO(row["audio"]["bytes"]), dtype="float32")
            x = soxr.resample(x, rate, RATE).astype(np.float32)
            if x.size >= min_s * RATE:
                clips.setdefault(row["speaker"], []).append((x, row["text"]))
    return clips


def join(segments: list[tuple[np.ndarray, str, str]], rng: random.Random, name: str,
         pause: tuple[float, float] = (0.6, 1.5)) -> tuple[np.ndarray, list[dict]]:
    """One session from (samples, speaker, text) segments: a pause before, between and after them."""
    parts, truth, at = [], [], 0.0
    for x, speaker, text in segments:
        gap = np.zeros(int(rng.uniform(*pause) * RATE), dtype=np.float32)
        parts += [gap, x]
        at += gap.size / RATE
        truth.append({"session": name, "start": round(at, 3), "end": round(at + x.size / RATE, 3),
                      "speaker": speaker, "text": text})
        at += x.size / RATE
    parts.append(np.zeros(int(pause[0] * RATE), dtype=np.float32))
    return np.concatenate(parts), truth


def write_sessions(folder: Path, sessions: int = 3, interloper_every: int = 4, seed: int = 0) -> Path:
    """FOLDER/spk_m/session-K.wav, voices.yaml and truth.json; returns FOLDER/spk_m."""
    rng = random.Random(seed)
    clips = sample_clips()
    main, other = clips[MAIN], clips[INTERLOPER]
    out = folder / MAIN
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HERE / "voices.yaml", out / "voices.yaml")
    per = len(main) // sessions
    truth: list[dict] = []
    for k in range(sessions):
        segments = []
        for j, (x, text) in enumerate(main[k * per:(k + 1) * per]):
            segments.append((x, MAIN, text))
            if j % interloper_every == interloper_every - 1:
                y, line = other[rng.randrange(len(other))]
                segments.append((y, INTERLOPER, line))
        name = f"session-{k}.wav"
        audio, found = join(segments, rng, name)
        sf.write(out / name, audio, RATE, subtype="PCM_16")
        truth += found
    (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n", encoding="utf-8")
    return out


def _holding(row: dict, truth: list[dict]) -> list[dict]:
    """The segments a row's clip overlaps (by more than 50 ms)."""
    source = row["source"]
    return [t for t in truth if Path(source["file"]).name == t["session"]
            and min(source["end"], t["end"]) - max(source["start"], t["start"]) > 0.05]


def score(folder: Path, out: Path) -> str:
    """One paragraph: how ingest's rows in `out` match the truth of the sessions in `folder`."""
    from voxpipe.evaluate.scoring import mean_rate, utterance_rate

    truth = json.loads((folder / "truth.json").read_text(encoding="utf-8"))
    kept = [json.loads(line) for line in (out / "raw.jsonl").read_text(encoding="utf-8").splitlines()]
    aside = [json.loads(line) for line in (out / "quarantine.jsonl").read_text(encoding="utf-8").splitlines()]
    others = [t for t in truth if t["speaker"] == INTERLOPER]
    caught = [t for t in others
              if any(t in _holding(r, truth) for r in aside if r["reason"] in ("other_speaker", "overlap"))]
    mains = [t for t in truth if t["speaker"] == MAIN]
    found = [t for t in mains if any(t in _holding(r, truth) for r in kept)]
    rates = [utterance_rate(" ".join(t["text"] for t in _holding(r, truth)), r["text_raw"] or "", "en")
             for r in kept if r.get("asr")]
    wer = mean_rate(rates)
    recogniser = kept[0]["asr"] if kept and kept[0].get("asr") else "the recogniser"
    shown = "n/a" if wer is None else f"{wer:.2f}"
    return (f"{len(caught)} of the interloper's {len(others)} lines set aside; {len(found)} of the main "
            f"voice's {len(mains)} lines kept; {recogniser}'s WER against the script: {shown} over "
            f"{len(rates)} clips")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("out", type=Path, nargs="?", help="with --score: the ingest output folder")
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--score", action="store_true", help="score FOLDER's truth against OUT's rows")
    args = parser.parse_args()
    print(score(args.folder, args.out) if args.score else write_sessions(args.folder, args.sessions))


if __name__ == "__main__":
    main()

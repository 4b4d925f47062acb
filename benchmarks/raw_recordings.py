"""Long recordings cut at pauses, their other voice set aside, and transcribed: how well and how fast, on the
demo's sessions (data/sample/make_sessions.py: the sample's spk_m clips with 0.6-1.5 s pauses, one of
spk_f's after every fourth, so the truth of every segment is known).

Prints one JSON object:
- `boundaries`: the VAD's clip edges (before padding) against the segments' true edges, in ms (median,
  p95, max), and the share of the inserted pauses a cut falls in;
- `speaker_filter`: precision and recall of the clips set aside (other_speaker or overlap) against the
  interloper's, the main voice's clips lost, and the similarities of each voice (where the thresholds of
  ingest.segment come from);
- `asr`: pocketsphinx's WER on the kept clips against the script (evaluate's scoring text);
- `seconds_per_audio_hour`: VAD, speaker embedding and ASR, each per hour of recording, on this machine's
  CPU, with its load average (other work on the machine slows every figure).

    .venv/bin/python benchmarks/raw_recordings.py [--sessions 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO / "tests")]
from _bench import parse_args  # noqa: E402
from sessions import make_sessions  # noqa: E402

from voxpipe.data.one_voice import judge_clips  # noqa: E402
from voxpipe.data.segment import Cut, cut_points  # noqa: E402
from voxpipe.data.vad import speech_probabilities  # noqa: E402
from voxpipe.steps.ingest import SegmentParams  # noqa: E402

SET_ASIDE = ("other_speaker", "overlap")


def _label(cut: Cut, truth: list[dict]) -> dict | None:
    """The segment a clip holds most of (None: it holds none)."""
    best = max(truth, key=lambda t: min(cut.end, t["end"]) - max(cut.start, t["start"]))
    return best if min(cut.end, best["end"]) > max(cut.start, best["start"]) else None


def _ms(values: list[float]) -> dict:
    ms = sorted(abs(v) * 1000 for v in values)
    return {"median": round(statistics.median(ms), 1), "p95": round(ms[int(0.95 * (len(ms) - 1))], 1),
            "max": round(ms[-1], 1), "n": len(ms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--no-asr", action="store_true", help="leave pocketsphinx out")
    args = parse_args(parser, sessions=1, no_asr=True)
    s = SegmentParams()
    settings = {"threshold": s.vad_threshold, "min_pause": s.min_pause_seconds, "min_s": s.min_seconds,
                "max_s": s.max_seconds}
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_sessions.write_sessions(Path(tmp), sessions=args.sessions)
        truth = json.loads((folder / "truth.json").read_text())
        audio = {p.name: sf.read(p, dtype="float32")[0] for p in sorted(folder.glob("*.wav"))}
    rate = make_sessions.RATE
    seconds: dict[str, float | None] = {"vad": 0.0, "embedding": 0.0, "asr": 0.0}
    edges, pauses_cut, pauses = [], 0, 0
    judged: list[tuple[dict | None, object, np.ndarray]] = []
    for name, x in audio.items():
        segs = [t for t in truth if t["session"] == name]
        start = time.perf_counter()
        probs = speech_probabilities(x)
        seconds["vad"] += time.perf_counter() - start
        tight = [c for c in cut_points(probs, pad=0.0, **settings) if isinstance(c, Cut)]
        for c in tight:
            t = _label(c, segs)
            if t is not None:
                edges += [c.start - t["start"], c.end - t["end"]]
        cuts = [c for c in cut_points(probs, pad=s.pad_seconds, **settings) if isinstance(c, Cut)]
        for a, b in zip(segs, segs[1:], strict=False):
            pauses += 1
            pauses_cut += any(a["end"] - 0.1 <= c.end <= b["start"] + 0.1 for c in cuts)
        clips = [x[int(c.start * rate):int(c.end * rate)] for c in cuts]
        start = time.perf_counter()
        verdicts = judge_clips(clips, s.speaker_threshold, s.overlap_threshold)
        seconds["embedding"] += time.perf_counter() - start
        judged += [(_label(c, segs), v, clip) for c, v, clip in zip(cuts, verdicts, clips, strict=True)]
    other = [(t, v) for t, v, _ in judged if t and t["speaker"] == make_sessions.INTERLOPER]
    main_ = [(t, v) for t, v, _ in judged if t and t["speaker"] == make_sessions.MAIN]
    caught = sum(v.reason in SET_ASIDE for _, v in other)
    flagged = sum(v.reason in SET_ASIDE for _, v, _ in judged)
    lost = sum(v.reason in SET_ASIDE for _, v in main_)
    result = {
        "sessions": len(audio), "audio_seconds": round(sum(x.size for x in audio.values()) / rate, 1),
        "segments": len(truth), "clips": len(judged),
        "boundaries": {"edge_error_ms": _ms(edges), "pauses_cut": f"{pauses_cut}/{pauses}"},
        "speaker_filter": {
            "precision": round(caught / flagged, 3) if flagged else None,
            "recall": round(caught / len(other), 3) if other else None,
            "main_voice_lost": f"{lost}/{len(main_)}",
            "similarity_main": [round(min(v.similarity for _, v in main_), 3),
                                round(max(v.similarity for _, v in main_), 3)],
            "similarity_other": [round(min(v.similarity for _, v in other), 3),
                                 round(max(v.similarity for _, v in other), 3)] if other else None,
            "lowest_window_main": round(min(v.lowest_window for _, v in main_), 3),
            "thresholds": {"speaker": s.speaker_threshold, "overlap": s.overlap_threshold},
        },
    }
    if args.no_asr:
        result["asr"] = {"wer": None, "wer_null_reason": "--no-asr"}
        seconds["asr"] = None
    else:
        from voxpipe.backends import ASR
        from voxpipe.evaluate.scoring import mean_rate, utterance_rate

        recogniser = ASR["pocketsphinx"].load({})
        rates = []
        start = time.perf_counter()
        for t, v, clip in judged:
            if t and not v.reason:
                rates.append(utterance_rate(t["text"], recogniser.transcribe(clip, "en"), "en"))
        seconds["asr"] = time.perf_counter() - start
        result["asr"] = {"backend": "pocketsphinx", "wer": round(mean_rate(rates), 3), "clips": len(rates)}
    hours = result["audio_seconds"] / 3600
    result["seconds_per_audio_hour"] = {k: None if v is None else round(v / hours, 1)
                                        for k, v in seconds.items()}
    if seconds["asr"] is None:
        result["seconds_per_audio_hour"]["asr_null_reason"] = "--no-asr"
    result["machine"] = {"cpus": os.cpu_count(), "load_average": [round(v, 1) for v in os.getloadavg()],
                         "note": "shared with other work: figures per hour are upper bounds"}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""Does a model stop where a sentence ends? Premature and runaway stops on a voice's val texts; prints JSON.

For each `--model` folder, voxpipe's own generation plan and code (voxpipe.evaluate.generation:
`plan_speakers`, `synthesize`, the limit evaluate uses when evaluate.max_len is 0) say every planned
text, with and without the speaker's reference. Each clip's length is compared with the duration
expected from the speaker's speaking rate: seconds per character of text over the speaker's real
clips (the encoded train and val rows). A clip shorter than `--premature-fraction` of that is a
premature stop; one that reached the limit without a stop is a runaway. The ratio of every clip is
printed, so any other fraction can be read off the same run.

    .venv/bin/python benchmarks/demo_base_stops.py --data work/encoded \
        --model data/demo-base work/base_model [--texts-per-speaker 8] [--premature-fraction 0.5]
    .venv/bin/python benchmarks/demo_base_stops.py --smoke   # data/demo-base, 6 clips, 4 patches: seconds

`--sample-rows N` encodes the shipped sample's first N rows of each speaker (ingest, manifest,
encode with the first model's VAE, in a temporary folder) instead of reading `--data`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from _bench import nulls, parse_args  # noqa: E402
from small_sample import write_small_sample  # noqa: E402

from voxpipe.data.dataset import EncodedDataset  # noqa: E402
from voxpipe.data.encode.step import encode  # noqa: E402
from voxpipe.data.ingest_step import ingest  # noqa: E402
from voxpipe.data.manifest import build_manifest  # noqa: E402
from voxpipe.evaluate.generation import plan_speakers, synthesize  # noqa: E402
from voxpipe.model.io import from_pretrained  # noqa: E402
from voxpipe.params import Params  # noqa: E402
from voxpipe.steps.encode import EncodeParams  # noqa: E402
from voxpipe.steps.ingest import IngestParams  # noqa: E402
from voxpipe.steps.manifest import ManifestParams  # noqa: E402


def encode_sample(work: Path, rows_per_speaker: int, model: Path) -> Path:
    """The sample's first rows of each speaker through ingest (no quality score or loudness normalization:
    a speaking rate needs neither), manifest and encode."""
    sample = write_small_sample(work / "sample", rows_per_speaker)
    ingest(IngestParams(input=[str(sample)], out=str(work / "ingest"), workers=1, score_quality=False,
                        normalize_loudness=False))
    build_manifest(ManifestParams(input=[str(work / "ingest" / "raw.jsonl")], out=str(work / "manifest")))
    encode(Params(model={"base": str(model)}, encode=EncodeParams(
        manifest=[str(work / "manifest" / f"{split}.jsonl") for split in ("train", "val")],
        out=str(work / "encoded"), device="cpu")))
    return work / "encoded"


def seconds_per_char(*splits: EncodedDataset) -> dict[str, float]:
    """Each speaker's speaking rate over its real clips: total seconds / total characters of text."""
    seconds: dict[str, float] = defaultdict(float)
    chars: dict[str, int] = defaultdict(int)
    for data in splits:
        for row in data.rows:
            seconds[row["speaker"]] += float(row["duration"])
            chars[row["speaker"]] += len(row["text"])
    return {s: seconds[s] / chars[s] for s in seconds}


def measure(model_dir: Path, val: EncodedDataset, train: EncodedDataset | None,
            args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    model = from_pretrained(model_dir).eval()
    rate = seconds_per_char(val, *([train] if train is not None else []))
    plans = plan_speakers(val, train, args.texts_per_speaker)
    start = time.perf_counter()
    clips = []
    for plan in plans:
        for g in synthesize(model, plan, max_len=args.max_len, cfg_value=args.cfg_value,
                            inference_timesteps=args.inference_timesteps, seed=args.seed):
            u = g.utterance
            expected = len(u.text) * rate[u.speaker]
            ratio = g.audio_seconds / expected
            clips.append({
                "name": u.name, "source": u.source, "text": u.text,
                "seconds": round(g.audio_seconds, 3), "expected_s": round(expected, 3),
                "real_s": round(u.real_seconds, 3), "ratio": round(ratio, 3),
                "premature": (not g.hit_limit) and ratio < args.premature_fraction,
                "runaway": g.hit_limit, "limit_patches": g.max_len, "patches": g.patches,
            })
    ratios = [c["ratio"] for c in clips if not c["runaway"]]
    n = len(clips)
    premature = sum(c["premature"] for c in clips)
    runaway = sum(c["runaway"] for c in clips)
    return {
        "model": str(model_dir),
        "clips": n,
        "premature": premature,
        "runaway": runaway,
        "stop_failure_rate_both_ways": (premature + runaway) / n if n else None,
        "stop_failure_rate_runaway_only": runaway / n if n else None,
        **({"ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
           if ratios else nulls(("ratio_median", "ratio_min", "ratio_max"), "every clip hit the limit")),
        "generation_s": round(time.perf_counter() - start, 1),
        "per_clip": clips,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, nargs="+", default=[REPO / "data" / "demo-base"],
                    help="checkpoint folders to compare")
    ap.add_argument("--data", type=Path, default=Path("work/encoded"), help="an encoded folder (val + train)")
    ap.add_argument("--texts-per-speaker", type=int, default=8)
    ap.add_argument("--premature-fraction", type=float, default=0.5,
                    help="a clip shorter than this fraction of the expected duration stopped too early")
    ap.add_argument("--max-len", type=int, default=0, help="patch limit; 0 = evaluate's automatic one")
    ap.add_argument("--cfg-value", type=float, default=2.0)
    ap.add_argument("--inference-timesteps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-clip", action="store_true", help="print every clip, not only the totals")
    ap.add_argument("--sample-rows", type=int, default=0, help="encode the sample's first N rows of each "
                    "speaker instead of reading --data (0: read --data)")
    args = parse_args(ap, sample_rows=3, texts_per_speaker=1, max_len=4, inference_timesteps=2)
    with tempfile.TemporaryDirectory(prefix="bench-stops-") as tmp:
        if args.sample_rows:
            args.data = encode_sample(Path(tmp), args.sample_rows, args.model[0])
        val = EncodedDataset(args.data, "val")
        train = EncodedDataset(args.data, "train") if (args.data / "train.jsonl").is_file() else None
        results = [measure(m, val, train, args) for m in args.model]
    if not args.per_clip:
        for r in results:
            r["per_clip"] = [{k: c[k] for k in ("name", "seconds", "expected_s", "ratio")}
                             for c in r["per_clip"]]
    print(json.dumps({"premature_fraction": args.premature_fraction,
                      "texts_per_speaker": args.texts_per_speaker, "data": str(args.data),
                      "results": results}, indent=2))


if __name__ == "__main__":
    main()

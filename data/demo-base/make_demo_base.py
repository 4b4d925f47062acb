"""Make the demo base model in data/demo-base/: a tiny VoxCPM2 pretrained on espeak-ng speech made here.

`make demo` fine-tunes a base toward the two voices of data/sample. A random-init base never learns
when to stop within the demo's 40 steps, so the demo could never pass the promotion rule. This script
makes a base that has learnt it, with no third-party data: espeak-ng reads sentences built from a small
fixed grammar in eight voices, none of them data/sample's two (en-us+m3, en-us+f4), and voxpipe's own
steps do the rest (ingest -> manifest -> init-model -> encode -> train, through the `voxpipe` CLI).

The AudioVAE stays init-model's random-init one (docs/demo-base.md says why), so what the base learns
is the text-to-latent timing and the stop head, not a voice one would want to hear.

    python data/demo-base/make_demo_base.py    # needs espeak-ng; about 30 min on 2 CPU cores

Everything it used (espeak-ng version, voices, a hash of the texts, seeds, steps) goes to
data/demo-base/make_record.json, which tests/test_demo_base.py compares with `inputs()` below; the
files' sha256 go to data/demo-base/SHA256SUMS, which voxpipe checks whenever it loads the folder.
Intermediate outputs go to --build (default work/demo-base-build); rerunning resumes from them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "data" / "sample"))
import make_sample  # noqa: E402  (data/sample's espeak-ng helpers: synthesize, trim, FLAC bytes)

# espeak-ng voice, base pitch (0-99), base speed (words/min): four male, four female, none of the sample's.
VOICES = {
    "base_m1": ("en-gb+m1", 40, 160),
    "base_m2": ("en-us+m5", 28, 150),
    "base_m3": ("en-gb-scotland+m2", 45, 170),
    "base_m4": ("en-029+m7", 35, 155),
    "base_f1": ("en-us+f2", 70, 165),
    "base_f2": ("en-gb+f3", 82, 155),
    "base_f3": ("en-gb-x-rp+f1", 65, 175),
    "base_f4": ("en-us+f5", 74, 160),
}
SENTENCES_PER_VOICE = 150
TEXT_SEED = 20
PRESET, MODEL_SEED = "tiny", 0
NPROC = 2
# the training schedule: a from-scratch tiny model learns fast at 1e-3 (the fine-tune default 1e-5 is for
# pretrained weights); all other train keys are the schema's defaults
TRAIN = {"max_steps": 800, "lr": 1.0e-3, "min_lr": 1.0e-5, "warmup_steps": 50, "max_tokens": 2048, "seed": 0}
SHIPPED = ("config.json", "model.safetensors", "audiovae.safetensors", "tokenizer.json",
           "tokenizer_config.json", "special_tokens_map.json")
RECORD, SUMS = "make_record.json", "SHA256SUMS"

SUBJECTS = [
    "the old man", "my sister", "a small dog", "the teacher", "our neighbor", "the pilot", "a young girl",
    "the baker", "his best friend", "the captain", "every student", "the tired nurse", "a tall stranger",
    "the mayor", "her brother", "the quiet boy", "a busy mechanic", "the gardener", "my uncle", "the farmer",
]
VERBS = [
    "found", "painted", "carried", "opened", "watched", "cleaned", "sold", "lost", "bought", "fixed",
    "borrowed", "wrapped", "counted", "dropped", "noticed", "hid", "measured", "repaired", "described",
    "brought",
]
OBJECTS = [
    "a red bicycle", "the wooden box", "three green apples", "an empty bottle", "the heavy suitcase",
    "a letter from home", "the silver key", "two paper boats", "the broken clock", "a basket of eggs",
    "the blue umbrella", "a warm blanket", "the kitchen window", "an old photograph", "the garden gate",
    "a loaf of bread", "the winter coats", "a box of candles", "the little radio", "a jar of honey",
]
TAILS = [
    "", "", "", "before breakfast", "in the park", "after the long rain", "near the old bridge at dawn",
    "on a cold winter morning", "while everyone else was asleep", "at the market on Saturday",
    "without saying a single word", "just before the storm arrived", "for the second time this week",
    "behind the library", "as the sun went down over the hills", "in less than ten minutes",
]
SHORT = [
    "Yes, of course.", "Not today.", "Thank you very much.", "Good evening.", "Wait for me.", "Come in.",
    "That is fine.", "See you soon.", "Well done.", "Right away.", "Hello there.", "Of course not.",
]
QUESTIONS = ["Did {s} really say that?", "Why did {s} leave so early?", "Where did {s} put {o}?",
             "Has {s} seen {o}?", "When will {s} come back?"]


def _sentence(rng: random.Random) -> str:
    s, v, o, t = rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(TAILS)
    kind = rng.random()
    if kind < 0.1:
        return rng.choice(SHORT)
    if kind < 0.25:
        return rng.choice(QUESTIONS).format(s=s, o=o)
    text = f"{s} {v} {o}" + (f" {t}" if t else "")
    if kind > 0.8:  # a compound sentence: the long end of the durations
        text += f", and {rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
    return text[0].upper() + text[1:] + "."


def texts() -> dict[str, list[str]]:
    """The sentences each voice reads (a pure function of TEXT_SEED)."""
    rng = random.Random(TEXT_SEED)
    return {speaker: [_sentence(rng) for _ in range(SENTENCES_PER_VOICE)] for speaker in VOICES}


def inputs() -> dict:
    """What the base is made from, as make_record.json records it (without the measured parts)."""
    all_texts = texts()
    digest = hashlib.sha256(json.dumps(all_texts, sort_keys=True).encode()).hexdigest()
    return {
        "voices": {k: list(v) for k, v in VOICES.items()},
        "sample_voices_excluded": sorted(v[0] for v in make_sample.VOICES.values()),
        "sentences_per_voice": SENTENCES_PER_VOICE,
        "text_seed": TEXT_SEED,
        "texts_sha256": digest,
        "preset": PRESET,
        "model_seed": MODEL_SEED,
        "nproc": NPROC,
        "train": TRAIN,
    }


def espeak_version() -> str:
    done = subprocess.run(["espeak-ng", "--version"], check=True, capture_output=True, text=True)
    return done.stdout.strip()


def write_speech(folder: Path) -> None:
    """The espeak-ng clips as a Hugging Face style parquet (the layout data/sample uses)."""
    rng = random.Random(TEXT_SEED + 1)  # per-clip pitch/speed jitter
    rows = []
    for speaker, sentences in texts().items():
        voice, pitch, speed = VOICES[speaker]
        for i, text in enumerate(sentences):
            x = make_sample.synthesize(text, voice, pitch + rng.randint(-4, 4), speed + rng.randint(-10, 10))
            rows.append({"audio": {"bytes": make_sample.flac_bytes(x), "path": f"{speaker}_{i:03d}.flac"},
                         "text": text, "speaker": speaker})
    schema = pa.schema(
        [("audio", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
         ("text", pa.string()), ("speaker", pa.string())],
        metadata=make_sample.hf_metadata(),
    )
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), folder / "speech.parquet", row_group_size=64)
    print(f"speech: {len(rows)} clips in {folder}", flush=True)


def voxpipe(args: list[str], torchrun: bool = False) -> None:
    bin_dir = Path(sys.executable).parent
    cmd = ([str(bin_dir / "torchrun"), "--standalone", f"--nproc_per_node={NPROC}", "-m", "voxpipe.cli"]
           if torchrun else [str(bin_dir / "voxpipe")])
    print("+", " ".join(cmd + args), flush=True)
    subprocess.run(cmd + args, check=True, cwd=REPO)


def build(build_dir: Path) -> Path:
    """Run the steps into build_dir (each skipped when its report.json is there); return the export."""
    b = build_dir.resolve()
    params = b / "params.yaml"  # the schema's defaults and these keys only: not the repo's params.yaml
    b.mkdir(parents=True, exist_ok=True)
    params.write_text(json.dumps({
        "ingest": {"input": [str(b / "speech")], "out": str(b / "ingest")},
        "manifest": {"input": [str(b / "ingest" / "raw.jsonl")], "out": str(b / "manifest")},
        "model": {"preset": PRESET, "seed": MODEL_SEED, "out": str(b / "init"), "base": str(b / "init")},
        "encode": {"manifest": [str(b / "manifest" / f"{s}.jsonl") for s in ("train", "val")],
                   "out": str(b / "encoded")},
        "train": {**TRAIN, "data": str(b / "encoded"), "out": str(b / "train"), "export_every": 0,
                  "checkpoint_every": 100, "log_every": 50, "val_every": 100},
        "local": {"nproc": NPROC},
    }, indent=2))
    common = ["--params", str(params)]
    if not (b / "speech" / "speech.parquet").is_file():
        write_speech(b / "speech")
    for step, torchrun in (("ingest", False), ("manifest", False), ("init-model", False), ("encode", True)):
        out = {"ingest": "ingest", "manifest": "manifest", "init-model": "init", "encode": "encoded"}[step]
        if not (b / out / "report.json").is_file():
            voxpipe([step, *common], torchrun=torchrun)
    voxpipe(["train", *common], torchrun=True)  # resumes from its newest checkpoint
    return b / "train" / "export"


def sha256sums(folder: Path) -> str:
    return "".join(f"{hashlib.sha256((folder / n).read_bytes()).hexdigest()}  {n}\n" for n in SHIPPED)


def ship(export: Path, build_dir: Path, out: Path) -> None:
    """Copy the export's files into `out`, with SHA256SUMS and the record of how they were made."""
    out.mkdir(parents=True, exist_ok=True)
    for name in SHIPPED:
        shutil.copyfile(export / name, out / name)
    (out / SUMS).write_text(sha256sums(out))
    report = json.loads((build_dir / "train" / "report.json").read_text())
    ingest = json.loads((build_dir / "ingest" / "report.json").read_text())
    record = {
        **inputs(),
        "espeak_ng": espeak_version(),
        "clips": ingest.get("rows_kept"),
        "minutes_of_speech": round(60 * ingest.get("hours_kept", 0.0), 2),
        "train_report": {k: report.get(k) for k in ("steps", "final_loss", "val/loss", "tokens_per_s")
                         if k in report},
    }
    (out / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    print(f"shipped {out}: {sum((out / n).stat().st_size for n in SHIPPED) / 1e6:.2f} MB", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", type=Path, default=REPO / "work" / "demo-base-build")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    ship(build(args.build), args.build, args.out)


if __name__ == "__main__":
    main()

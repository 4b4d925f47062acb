"""Text normalization engines on the acceptance lists: ours (wetext + voxpipe/data/text_rules.py) against
NVIDIA's nemo-text-processing (WFST grammars on pynini). Prints one JSON object: per engine and language,
the rows read right per kind, seconds per 1,000 characters once warm, peak memory and cold start (import,
grammar load or build, first text).

Each engine runs in a child process of its own, so cold start and memory are its alone. nemo is not a
voxpipe dependency: give `--nemo-python` an interpreter that has nemo-text-processing (and pynini)
installed; its compiled grammars are cached in `--nemo-cache` (built on the first run, loaded after;
never downloaded). Without it, nemo's figures are null with the reason.

    .venv/bin/python benchmarks/text_norm.py --nemo-python /tmp/nemo-venv/bin/python
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import nulls, parse_args  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LISTS = ROOT / "tests" / "data"

# run in the child: read rows (written, locale) from stdin as JSON, print the spoken forms and the figures
CHILD = {
    "ours": """
import json, resource, sys, time
t0 = time.perf_counter()
from voxpipe.data.text_norm import normalize_for_speech
language, rows = json.load(sys.stdin)
normalize_for_speech(rows[0][0], language, rows[0][1])
cold = time.perf_counter() - t0
def read(text, locale):
    return normalize_for_speech(text, language, locale)
""",
    "nemo": """
import json, logging, resource, sys, time
logging.disable(logging.WARNING)
t0 = time.perf_counter()
from nemo_text_processing.text_normalization.normalize import Normalizer
language, rows = json.load(sys.stdin)
normalizer = Normalizer(input_case="cased", lang=language, cache_dir=sys.argv[1] + "/" + language,
                        overwrite_cache=False)
normalizer.normalize(rows[0][0], punct_post_process=True)
cold = time.perf_counter() - t0
def read(text, locale):  # nemo has no locale setting: en is en-US
    try:
        return normalizer.normalize(text, punct_post_process=True)
    except Exception as e:  # a grammar that tags nothing: counted as wrong
        return f"<{type(e).__name__}>"
""",
}
MEASURE = """
t1 = time.perf_counter()
spoken = [read(text, locale) for text, locale in rows]
seconds = time.perf_counter() - t1
chars = sum(len(text) for text, _ in rows)
print(json.dumps({"spoken": spoken, "cold_start_s": round(cold, 2),
                  "s_per_1000_chars": round(seconds / chars * 1000, 4),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))
"""


def rows(language: str) -> list[tuple[str, str, str, str]]:
    """(written, spoken, kind, locale) of an acceptance list."""
    with open(LISTS / f"text_norm_{language}.tsv", encoding="utf-8", newline="") as f:
        lines = list(csv.reader((line for line in f if not line.startswith("#")), delimiter="\t"))
    return [(r[0], r[1], r[2], (r[3] if len(r) > 3 else "") or "") for r in lines[1:]]


def run_engine(python: str, engine: str, language: str, cases: list, cache: str) -> dict:
    done = subprocess.run([python, "-c", CHILD[engine] + MEASURE, cache], cwd=ROOT, capture_output=True,
                          text=True,
                          input=json.dumps([language, [(w, loc) for w, _, _, loc in cases]]), timeout=3600)
    if done.returncode:
        raise RuntimeError(done.stderr[-600:])
    out = json.loads(done.stdout.strip().splitlines()[-1])
    per_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    wrong = []
    for (written, want, kind, locale), got in zip(cases, out.pop("spoken"), strict=True):
        per_kind[kind][0] += got == want
        per_kind[kind][1] += 1
        if got != want:
            wrong.append({"written": written, "locale": locale or None, "want": want, "got": got})
    right = sum(r for r, _ in per_kind.values())
    return {"right": right, "rows": len(cases), "accuracy": round(right / len(cases), 3),
            "per_kind": {k: f"{r}/{n}" for k, (r, n) in sorted(per_kind.items())}, **out, "wrong": wrong}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=0, help="the first N rows of each list (0: all)")
    parser.add_argument("--nemo-python", default="", help="a Python with nemo-text-processing installed")
    parser.add_argument("--nemo-cache", default=str(Path.home() / ".cache" / "voxpipe" / "nemo-grammars"),
                        help="where nemo's compiled grammars are kept between runs")
    parser.add_argument("--languages", nargs="+", default=["en", "zh"])
    args = parse_args(parser, rows=4)
    result: dict = {}
    for language in args.languages:
        cases = rows(language)[: args.rows or None]
        result[language] = {"ours": run_engine(sys.executable, "ours", language, cases, "")}
        if args.nemo_python:
            result[language]["nemo"] = run_engine(args.nemo_python, "nemo", language, cases, args.nemo_cache)
        else:
            result[language].update(nulls(["nemo"], "no --nemo-python given: nemo-text-processing is not a "
                                          "voxpipe dependency (docs/data-quality.md gives a measured run)"))
    print(json.dumps(result, ensure_ascii=False))


if __name__ == "__main__":
    main()

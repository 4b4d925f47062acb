"""docs/measurements.md from the benchmarks' recorded JSON: dated figures live in one generated page.

Each benchmark's latest run is one committed file, `benchmarks/results/<name>.json`: the JSON object
the benchmark printed (`figures`) with the machine, the date and the command that made it.

    make record BENCH=serve ARGS="--model ..."     # runs it, records it, then `make generate`
    python benchmarks/serve.py --model ... | .venv/bin/python tools/measurements.py record serve \\
        --command "benchmarks/serve.py --model ..."   # the same by hand

`render` (what `make generate` runs; `make generate-check` fails when the page differs from it) turns
every results file into one short section, figure by figure, so no page retypes a number a benchmark
printed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
NULL_REASON = "_null_reason"


def machine() -> str:
    """This machine in words: the CPU model and its cores, and an accelerator when torch sees one."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    found = f"{cpu}, {os.cpu_count()} cores"
    try:
        import torch
        if torch.cuda.is_available():
            found += f", {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return found


def record(name: str, figures: dict, command: str, machine_text: str, note: str,
           results: Path = RESULTS) -> Path:
    """benchmarks/results/<name>.json: the benchmark's printed object with where and when it ran."""
    out = results / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {"benchmark": name, "command": command, "machine": machine_text,
            "date": datetime.date.today().isoformat(), "source": note, "figures": figures}
    out.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


def leaves(value, path: str = ""):
    """(dotted path, value) of every number, string or null in a JSON value; a key's null reason goes
    with its null instead of a row of its own."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key.endswith(NULL_REASON):
                continue
            sub = f"{path}.{key}" if path else key
            if item is None and isinstance(value.get(key + NULL_REASON), str):
                yield sub, f"null: {value[key + NULL_REASON]}"
            else:
                yield from leaves(item, sub)
    elif isinstance(value, list) and value and all(isinstance(v, dict | list) for v in value):
        for index, item in enumerate(value):
            yield from leaves(item, f"{path}.{index}")
    else:
        yield path, value


def shown(value) -> str:
    """A figure as the table shows it: floats to 4 significant digits, lists inline, `|` escaped."""
    if isinstance(value, bool) or value is None:
        text = json.dumps(value)
    elif isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, list):
        text = ", ".join(shown(v) for v in value)
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def rows(value, path: str = "", most: int = 8):
    """(path, its figures in one line) per part of the JSON: a part with at most `most` figures, or with
    no part below it, is one line (`key value; key value`); a larger one is a line of its own figures
    and then a line (or more) per part, so a section stays short. The top level's path is ""."""
    found = list(leaves(value, path))
    parts = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    nested = [(str(k), v) for k, v in parts if isinstance(v, dict | list) and v]
    if len(found) <= most or not nested:
        yield path, cell(found, path)
        return
    inner = {f"{path}.{k}" if path else k for k, _ in nested}
    own = [(p, v) for p, v in found if not any(p == n or p.startswith(n + ".") for n in inner)]
    if own:
        yield path, cell(own, path)
    for key, item in nested:
        yield from rows(item, f"{path}.{key}" if path else key, most)


def cell(found: list, path: str) -> str:
    return "; ".join(shown(v) if p == path else f"`{p[len(path):].lstrip('.')}` {shown(v)}" for p, v in found)


def headline(figures: dict) -> str:
    """The ratios and speed-ups of a run (against upstream or the alternative it names), for the index."""
    picked = [f"`{path}` {shown(value)}" for path, value in leaves(figures)
              if any(word in path.rsplit(".", 1)[-1] for word in ("ratio", "speedup", "speed_up"))
              and isinstance(value, int | float) and not isinstance(value, bool)]
    return "; ".join(picked[:3])


def load(path: Path) -> dict:
    data = json.loads(path.read_text(encoding="utf-8"))
    missing = {"benchmark", "command", "machine", "date", "source", "figures"} - set(data)
    if missing:
        sys.exit(f"{path}: no {', '.join(sorted(missing))}: write it with "
                 "`tools/measurements.py record`")
    return data


def section(run: dict) -> list[str]:
    """A run's section: its command, machine, date and note, then its figures: the top level's inline,
    each larger part as a bullet."""
    found = list(rows(run["figures"]))
    top = [text for path, text in found if not path]
    head = f"`{run['command']}` on {run['machine']}, {run['date']}. {run['source'].rstrip()}"
    if top:
        head += f"{'' if head.endswith('.') else '.'} Figures: {top[0]}."
    return ["", f"## {run['benchmark']}", head] + [f"- `{path}`: {text}" for path, text in found if path]


def markdown(results: Path = RESULTS) -> str:
    runs = [load(p) for p in sorted(results.glob("*.json"))]
    lines = [
        "# Measurements",
        "",
        "<!-- generated by tools/measurements.py from benchmarks/results/*.json: edit those, then "
        "`make generate` -->",
        "",
        "Every dated figure of the docs, as the benchmark printed it: one section per recorded run "
        "(`benchmarks/results/<name>.json`), with the machine, the date and the command. No GPU or NPU "
        "ran any of them unless its machine says so. To record a run of your own (it replaces that "
        "benchmark's file), then commit both:",
        "",
        "```sh",
        "make record BENCH=<name> ARGS=\"[flags]\"   # benchmarks/<name>.py, then make generate",
        "benchmarks/gpu_check.sh | .venv/bin/python tools/measurements.py record accel_step "
        "--command benchmarks/gpu_check.sh && make generate",
        "```",
        "",
        "Runs (date; ratios and speed-ups): " + " · ".join(
            f"[{r['benchmark']}](#{r['benchmark']}) {r['date']}"
            + (f" ({headline(r['figures'])})" if headline(r["figures"]) else "") for r in runs) + ".",
    ]
    for r in runs:
        lines += section(r)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = cli.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="stdin's benchmark JSON into benchmarks/results/NAME.json")
    rec.add_argument("name")
    rec.add_argument("--command", dest="run", required=True, help="the benchmark's command line, as run")
    rec.add_argument("--machine", default=None, help="default: this CPU (and GPU)")
    rec.add_argument("--note", default="Written by the benchmark.", help="where the figures come from")
    ren = sub.add_parser("render", help="write docs/measurements.md (or the file given)")
    ren.add_argument("out", nargs="?", type=Path, default=ROOT / "docs" / "measurements.md")
    args = cli.parse_args(argv)
    if args.command == "record":
        try:
            figures = json.load(sys.stdin)
        except json.JSONDecodeError as exc:
            sys.exit(f"tools/measurements.py record: stdin is not the benchmark's one JSON object ({exc})")
        print(record(args.name, figures, args.run, args.machine or machine(), args.note))
    else:
        args.out.write_text(markdown(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

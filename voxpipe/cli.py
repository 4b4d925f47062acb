"""`voxpipe <step>`: one subcommand per pipeline step.

Every step flag maps to a `section.key` in params.yaml; precedence is params file < `--set` < flag.
Step modules are imported only when their step runs, so `voxpipe --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass, field
from typing import Any

from voxpipe.errors import StepError
from voxpipe.params import load_params


@dataclass(frozen=True)
class Flag:
    name: str
    key: str
    help: str
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    name: str
    help: str
    target: str  # "module:function", called with the step's params section
    section: str
    flags: tuple[Flag, ...]


def _f(name: str, key: str, help: str, **kwargs: Any) -> Flag:
    return Flag(name, key, help, kwargs)


STEPS: tuple[Step, ...] = (
    Step(
        "ingest",
        "parquet → 16 kHz mono FLAC + raw.jsonl, bad rows quarantined",
        "voxpipe.data.ingest:ingest",
        "ingest",
        (
            _f("--input", "ingest.input", "parquet files or folders of them", nargs="+"),
            _f("--out", "ingest.out", "output folder"),
            _f("--text-column", "ingest.text_column", "column with the transcript"),
            _f("--audio-column", "ingest.audio_column", "column with the audio (struct, bytes or path)"),
            _f("--speaker-column", "ingest.speaker_column", "column with the speaker id"),
            _f("--min-seconds", "ingest.min_seconds", "shortest clip kept", type=float),
            _f("--max-seconds", "ingest.max_seconds", "longest clip kept", type=float),
            _f("--max-bad-fraction", "ingest.max_bad_fraction", "fail above this quarantined fraction",
               type=float),
            _f("--workers", "ingest.workers", "decode processes (0 = all cores)", type=int),
        ),
    ),
    Step(
        "manifest",
        "raw.jsonl → train.jsonl / val.jsonl in the upstream VoxCPM format",
        "voxpipe.data.manifest:build_manifest",
        "manifest",
        (
            _f("--input", "manifest.input", "raw.jsonl files from ingest", nargs="+"),
            _f("--out", "manifest.out", "output folder"),
            _f("--val-fraction", "manifest.val_fraction", "share of rows held out", type=float),
            _f("--ref-fraction", "manifest.ref_fraction", "share of train rows given a ref_audio",
               type=float),
            _f("--seed", "manifest.seed", "seed for reference choice", type=int),
        ),
    ),
    Step(
        "validate",
        "check a manifest: files exist, decode, durations in bounds",
        "voxpipe.data.validate:validate_manifest",
        "validate",
        (_f("--manifest", "validate.manifest", "manifest .jsonl to check"),),
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voxpipe", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True, metavar="<step>")
    for step in STEPS:
        sp = sub.add_parser(step.name, help=step.help, description=step.help)
        sp.add_argument("--params", default=None, help="params file (default: ./params.yaml)")
        sp.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one params key (repeatable)")
        for flag in step.flags:
            sp.add_argument(flag.name, dest=flag.key, default=None, help=f"{flag.help} [{flag.key}]",
                            **flag.kwargs)
    return parser


def run_step(step: Step, args: argparse.Namespace) -> Any:
    flags = {f.key: getattr(args, f.key) for f in step.flags}
    params = load_params(args.params, args.overrides, flags)
    module, func = step.target.split(":")
    return getattr(importlib.import_module(module), func)(params.section(step.section))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    step = next(s for s in STEPS if s.name == args.step)
    try:
        result = run_step(step, args)
    except StepError as e:
        print(f"voxpipe {step.name}: error: {e}", file=sys.stderr)
        return 1
    summary = getattr(result, "summary", None)
    if callable(summary):
        print(summary())
    return int(getattr(result, "exit_code", 0))


if __name__ == "__main__":
    sys.exit(main())

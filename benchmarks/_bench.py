"""What every benchmark shares: `--smoke`, and figures that are null with a reason.

`--smoke` is the tiny preset, one or two steps, a few clips: a seconds-long run of the benchmark's
whole code path at sizes that say nothing about speed. It exists so that tests/test_benchmarks.py
can run every script and see that it still works and prints the keys the docs quote. Flags given
on the command line still win over the smoke defaults.

A figure that cannot be had here (no GPU or NPU, no upstream voxcpm, no bf16 matmul units, a part
left out by a flag) is null, with `<key>_null_reason` next to it; the benchmark still exits 0.
(Files in benchmarks/ whose name starts with `_` are helpers, not benchmarks.)
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable


def _flag(key: str, value) -> str:
    name = "--" + key.replace("_", "-")
    if value is True:
        return name
    return " ".join([name, *map(str, value if isinstance(value, list | tuple) else [value])])


def parse_args(parser: argparse.ArgumentParser, **smoke) -> argparse.Namespace:
    """parser's arguments plus --smoke, which makes `smoke` the defaults."""
    parser.add_argument("--smoke", action="store_true",
                        help="a seconds-long run of the whole path at toy sizes: " +
                        " ".join(_flag(k, v) for k, v in smoke.items()))
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(**smoke)
        args = parser.parse_args()
    return args


def nulls(keys: Iterable[str], reason: str) -> dict:
    """Each key null, with `<key>_null_reason` next to it."""
    return {k: v for key in keys for k, v in ((key, None), (f"{key}_null_reason", reason))}

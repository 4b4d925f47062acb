"""The one JSONL reader: manifests, raw.jsonl, encoded rows, metrics.jsonl, with errors that name the line.

A manifest saved in another encoding (latin-1, UTF-16) used to fail deep inside a text-mode read
with a traceback and a position in a read buffer. Decoding line by line names the file, the line
and the bytes, so the user can find and fix them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from voxpipe.errors import StepError


def utf8_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of every non-blank line; a StepError at the first non-UTF-8 line."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                near = raw[max(0, e.start - 12) : e.start + 12]
                raise StepError(
                    f"{path}:{n}: not UTF-8 text (byte {e.start} of the line, near {near!r}); save the file "
                    "as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
                ) from None
            if line.strip():
                yield n, line


def jsonl_records(path: Path) -> Iterator[tuple[int, dict[str, Any] | None, str]]:
    """(line number, the line's object, "") for every non-blank line, or (number, None, why) for a line
    that is not a JSON object: the caller quarantines it or stops with the file and line."""
    for number, line in utf8_lines(path):
        try:
            value = json.loads(line.lstrip("\ufeff"))
        except json.JSONDecodeError as e:
            yield number, None, f"not valid JSON ({e.msg})"
            continue
        if isinstance(value, dict):
            yield number, value, ""
        else:
            yield number, None, f"a JSON {type(value).__name__}, not an object"


def read_jsonl(path: Path, what: str) -> list[dict[str, Any]]:
    """Every line's object; a StepError naming the file and line of the first that is not one."""
    if not path.is_file():
        raise StepError(f"{path}: {what} not found")
    rows = []
    for number, row, problem in jsonl_records(path):
        if row is None:
            raise StepError(f"{path}:{number}: {problem} ({what})")
        rows.append(row)
    return rows

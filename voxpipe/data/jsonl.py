"""Reading line-oriented text inputs (jsonl manifests) with errors that point at the line.

A manifest saved in another encoding (latin-1, UTF-16) used to fail deep inside a text-mode read
with a traceback and a position in a read buffer. Decoding line by line names the file, the line
and the bytes, so the user can find and fix them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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

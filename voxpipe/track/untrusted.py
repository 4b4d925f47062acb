"""Run names, tags and params as `compare` shows them: text anyone who can log to the experiment wrote.

A run name is whatever `register.run_name`, the MLflow UI or another client set. Shown raw, its escape
sequences would drive the terminal that prints the table (colours, cursor moves, window titles,
hyperlinks), and a cell such as `=HYPERLINK(...)` in compare.csv is a formula the spreadsheet that opens
it runs (OWASP's "CSV injection"). So: on a terminal, in the text tables and in the csv the control
characters go (whole escape sequences first, then any other); a csv cell that a spreadsheet would read
as a formula gets a leading `'`, which makes it text; matplotlib draws a label as it is (no `$...$`
mathtext).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

# ESC/CSI/OSC/DCS sequences (7- and 8-bit), so that no `[31m` remnant is left behind
_SEQUENCES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC/DCS/SOS/PM/APC
    r"|\x1b[ -/]*[0-~]?"  # other escapes (ESC c, ESC ( B, a lone ESC)
)
_INVISIBLE = {"Cc", "Cf", "Zl", "Zp"}  # controls, format characters (bidi overrides), line separators
_FORMULA = tuple("=+-@\t\r\n＝＋－＠")  # what a spreadsheet starts a formula (or a DDE call) with
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def printable(text: str, keep: str = "") -> str:
    """`text` without escape sequences and invisible characters (those in `keep` stay: "\\n" for a whole
    table); a tab becomes a space."""
    text = _SEQUENCES.sub("", text).replace("\t", " " if "\t" not in keep else "\t")
    return "".join(c for c in text if c in keep or unicodedata.category(c) not in _INVISIBLE)


def spreadsheet_cell(value: Any) -> Any:
    """A csv cell that opens as text: a string a spreadsheet would take for a formula (its first visible
    character `= + - @`, or a tab, CR or LF first) gets a leading `'`; numbers (also a logged param's
    "-1") stay as they are."""
    if not isinstance(value, str) or _NUMBER.fullmatch(value):
        return value
    visible = _SEQUENCES.sub("", value)
    first = next((c for c in visible if not (c.isspace() or unicodedata.category(c) in _INVISIBLE)), "")
    return f"'{value}" if first in _FORMULA or value[:1] in _FORMULA else value

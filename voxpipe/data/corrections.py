"""Proofreading corrections: the decisions saved from the proofreading page (proofread_page.py), which
ingest applies on its next run, so a corrected transcript is data DVC keeps, not a hand edit of raw.jsonl.

The corrections file (`ingest.corrections`) is JSON lines, one decision per row:

    {"id": "3f2a...", "sha256": "<sha256 of the row's text as ingested>", "action": "fix", "text": "new text"}
    {"id": "9b01...", "sha256": "...", "action": "drop"}
    {"id": "77c4...", "sha256": "...", "action": "keep"}

`id` is the row's id in raw.jsonl; `sha256` is of the row's transcript as ingest read or recognised it
(raw.jsonl's `text_raw`, before text normalization), so a correction made against one transcript is
never applied to another: a source whose text changed since, or a row whose recogniser now says
something else, is reported instead. `keep` is written too, though it changes no text: it records that a
person listened and agreed, so the next page shows the row as reviewed and a later change of its text
brings it back (its hash no longer matches).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voxpipe.errors import StepError

ACTIONS = ("keep", "fix", "drop")
REASON = "dropped_in_review"  # quarantine.jsonl's reason for a row dropped on the page
FORMAT_HELP = ('each line one JSON object {"id": <raw.jsonl row id>, "sha256": <the old text\'s sha256>, '
               '"action": "keep" | "fix" | "drop", "text": <the new text, with fix>}')


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def ingested_text(row: dict[str, Any]) -> str:
    """The transcript a correction's hash is of: as ingest read or recognised it, before normalization and
    before any correction (a corrected row keeps it in `review.text_before`)."""
    review = row.get("review") or {}
    if "text_before" in review:
        return review["text_before"]
    return row["text_raw"] if isinstance(row.get("text_raw"), str) else row["text"]


@dataclass(frozen=True)
class Correction:
    line: int  # 1-based, in the corrections file
    id: str
    sha256: str
    action: str
    text: str | None = None

    def line_json(self) -> dict[str, Any]:
        """The decision as the file holds it (the page starts from these)."""
        return {"id": self.id, "sha256": self.sha256, "action": self.action,
                **({"text": self.text} if self.action == "fix" else {})}


def _malformed(path: Path, line: int, what: str) -> StepError:
    return StepError(
        f"the corrections file {path}, line {line}: {what}. It is written by the proofreading page "
        f"(work/ingest/proofread.html, 'Save corrections'); {FORMAT_HELP}. Save it again from the page, mend "
        "or delete that line, or set ingest.corrections to another file; nothing was ingested yet"
    )


def _parse(path: Path, number: int, line: str) -> Correction:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise _malformed(path, number, f"not JSON ({e.msg}: {line[:80]!r})") from None
    if not isinstance(obj, dict):
        raise _malformed(path, number, f"a JSON {type(obj).__name__}, not an object")
    for key in ("id", "sha256", "action"):
        if not isinstance(obj.get(key), str) or not obj[key]:
            raise _malformed(path, number, f"no {key!r} string")
    if obj["action"] not in ACTIONS:
        raise _malformed(path, number, f"action {obj['action'][:80]!r} is none of {', '.join(ACTIONS)}")
    text = obj.get("text")
    if obj["action"] == "fix" and (not isinstance(text, str) or not text.strip()):
        raise _malformed(path, number, "a fix without a new 'text' (to remove the row, its action is drop)")
    fix = obj["action"] == "fix"
    return Correction(number, obj["id"], obj["sha256"], obj["action"], text if fix else None)


def read_corrections(path: Path) -> list[Correction]:
    """Every decision in the file, in order; none for a missing file (nothing proofread yet). A malformed
    line, or a row decided twice, stops the run before anything is ingested."""
    if not path.exists():
        return []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise _malformed(path, path.read_bytes()[:e.start].count(b"\n") + 1, "not UTF-8 text") from None
    except OSError as e:
        raise StepError(f"the corrections file {path} cannot be read ({e.strerror or e}): set "
                        "ingest.corrections to the corrections.jsonl the proofreading page saved (a file), "
                        "or make it readable; nothing was ingested yet") from None
    found: list[Correction] = []
    first: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        c = _parse(path, number, line)
        if c.id in first:
            raise _malformed(path, number, f"row {c.id[:80]!r} is decided again (first on line "
                             f"{first[c.id]}); keep one decision per row")
        first[c.id] = number
        found.append(c)
    return found


Respell = Callable[[str, dict[str, Any]], tuple[str, str]]  # (new text, row) -> (text to train on, language)


class Review:
    """Applies the corrections to raw.jsonl's rows one at a time (streamed: a data set of any size), and says
    what they did: report.json's `corrections` and the data report's. A correction whose row never comes,
    or whose hash is not of its row's ingested text, is listed, not applied."""

    def __init__(self, corrections: list[Correction], file: str, respell: Respell, max_chars: int) -> None:
        self.file, self.lines = file, len(corrections)
        self.pending = {c.id: c for c in corrections}
        self.respell, self.max_chars = respell, max_chars
        self.applied: Counter = Counter()  # action -> rows
        self.not_applied: list[dict[str, Any]] = []  # {line, id, action, why}
        self.decisions: list[tuple[int, dict[str, Any]]] = []  # (line, its JSON): where the page starts

    def _skip(self, c: Correction, why: str) -> None:
        self.not_applied.append({"line": c.line, "id": c.id, "action": c.action, "why": why})

    def apply(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """Apply the row's correction, if any, in place; a dropped row's quarantine.jsonl line, else None."""
        c = self.pending.pop(row["id"], None)
        if c is None:
            return None
        before = ingested_text(row)
        if text_sha256(before) != c.sha256:
            self._skip(c, "the row's text is not the one proofread (its sha256 differs): proofread it again")
            return None
        if c.action == "fix" and len(c.text or "") > self.max_chars:
            self._skip(c, f"the new text is longer than ingest.max_text_chars={self.max_chars}")
            return None
        if c.action == "fix":
            row["text"], row["language"] = self.respell(c.text or "", row)
            row["text_raw"] = c.text
        if "needs_review" in row and c.action != "drop":
            row["needs_review"] = False  # a person has listened
        row["review"] = {"action": c.action, "line": c.line,
                         **({"text_before": before} if c.action == "fix" else {})}
        self.applied[c.action] += 1
        self.decisions.append((c.line, c.line_json()))
        if c.action != "drop":
            return None
        return {"source": row.get("source"), "reason": REASON, "id": row["id"],
                "detail": f"dropped in proofreading (line {c.line} of {self.file[:80]})"}

    def finish(self) -> Review:
        """After the last row: the corrections whose row never came are listed too."""
        for c in self.pending.values():
            self._skip(c, "no row has this id (its audio or text changed, or it is quarantined)")
        self.pending = {}
        self.not_applied.sort(key=lambda n: n["line"])
        self.decisions.sort(key=lambda d: d[0])
        return self

    def report(self) -> dict[str, Any]:
        return {"file": self.file, "lines": self.lines, "applied": {a: self.applied[a] for a in ACTIONS},
                "not_applied": self.not_applied, "decisions": [d for _, d in self.decisions]}

    def summary(self) -> str:
        """`; corrections: fix 2, drop 1, 1 not applied (report.json)` or "" with none."""
        if not self.lines:
            return ""
        done = ", ".join(f"{a} {self.applied[a]}" for a in ACTIONS if self.applied[a]) or "none applied"
        skipped = f", {len(self.not_applied)} not applied (report.json)" if self.not_applied else ""
        return f"; corrections: {done}{skipped}"

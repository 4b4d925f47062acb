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
from dataclasses import dataclass, field
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
    if not path.is_file():
        return []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise _malformed(path, path.read_bytes()[:e.start].count(b"\n") + 1, "not UTF-8 text") from None
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


@dataclass
class Review:
    """What the corrections did: report.json's `corrections` and the data report's."""

    file: str
    lines: int = 0
    applied: Counter = field(default_factory=Counter)  # action -> rows
    not_applied: list[dict[str, Any]] = field(default_factory=list)  # {line, id, action, why}
    decisions: list[dict[str, Any]] = field(default_factory=list)  # the applied lines, for the page

    def report(self) -> dict[str, Any]:
        return {"file": self.file, "lines": self.lines, "applied": {a: self.applied[a] for a in ACTIONS},
                "not_applied": self.not_applied, "decisions": self.decisions}

    def summary(self) -> str:
        """`; corrections: fix 2, drop 1, 1 not applied (report.json)` or "" with none."""
        if not self.lines:
            return ""
        done = ", ".join(f"{a} {self.applied[a]}" for a in ACTIONS if self.applied[a]) or "none applied"
        skipped = f", {len(self.not_applied)} not applied (report.json)" if self.not_applied else ""
        return f"; corrections: {done}{skipped}"


def apply_corrections(rows: list[dict[str, Any]], corrections: list[Correction], file: str, respell: Respell,
                      max_chars: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Review]:
    """(the rows kept, with fixes applied; quarantine.jsonl lines of the rows dropped; what was done). A
    correction whose row is not in `rows` or whose hash is not of the row's ingested text is listed in the
    Review, not applied."""
    review = Review(file=file, lines=len(corrections))
    by_id = {row["id"]: i for i, row in enumerate(rows)}
    dropped: set[int] = set()
    for c in corrections:
        at = by_id.get(c.id)
        if at is None:
            why = "no row has this id (its audio or text changed, or it is quarantined)"
        elif text_sha256(ingested_text(rows[at])) != c.sha256:
            why = "the row's text is not the one proofread (its sha256 differs): proofread it again"
        elif c.action == "fix" and len(c.text or "") > max_chars:
            why = f"the new text is longer than ingest.max_text_chars={max_chars}"
        else:
            why = ""
        if why:
            review.not_applied.append({"line": c.line, "id": c.id, "action": c.action, "why": why})
            continue
        row = rows[at]
        before = ingested_text(row)
        if c.action == "drop":
            dropped.add(at)
        elif c.action == "fix":
            row["text"], row["language"] = respell(c.text or "", row)
            row["text_raw"] = c.text
        if "needs_review" in row and c.action != "drop":
            row["needs_review"] = False  # a person has listened
        row["review"] = {"action": c.action, "line": c.line,
                         **({"text_before": before} if c.action == "fix" else {})}
        review.applied[c.action] += 1
        review.decisions.append(c.line_json())
    quarantined = [{"source": rows[i].get("source"), "reason": REASON, "id": rows[i]["id"],
                    "detail": f"dropped in proofreading (line {rows[i]['review']['line']} of {file[:80]})"}
                   for i in sorted(dropped)]
    return [row for i, row in enumerate(rows) if i not in dropped], quarantined, review

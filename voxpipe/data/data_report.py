"""The ingest's data report: one page (`data-report.html`) and its figure (`data-report.png`) to look at
before training on a data set.

It answers what people ask after a bad fine-tune: how much of each speaker there is, how long the
clips are, how loud and how clean they were, how much silence was cut, what was thrown out and why,
which rows are the worst and the best, and every transcript text normalization changed (before and
after: a wrong reading of a date or a price is found by reading the list, report.json's
`text_changes`), what the proofreading corrections did, next to the proofreading page it writes
beside it (proofread_page.py), and the clips of long recordings set aside as another voice
(quarantine.jsonl's other_speaker and overlap rows). The page embeds its figure, so it is one
self-contained file for KFP's HTML viewer and for MLflow; the PNG beside it is the same figure. Built
from raw.jsonl, quarantine.jsonl and report.json, streamed: a row costs a few floats, whatever the clip.
"""

from __future__ import annotations

import base64
import heapq
import html
import io
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from voxpipe.data.corrections import ACTIONS
from voxpipe.data.proofread_page import PAGE as PROOFREAD_PAGE
from voxpipe.data.proofread_page import write_proofread_page
from voxpipe.files import atomic_write, atomic_write_text

PAGE = "data-report.html"
FIGURE = "data-report.png"
EXAMPLES = 10  # rows shown at each extreme
NOTHING_QUARANTINED = "<p>nothing was quarantined</p>"


def _sort_key(row: dict[str, Any]) -> float:
    """Quality when it was scored (the bound's dimension is not known here: overall), else duration."""
    return row["dnsmos"]["ovrl"] if row.get("dnsmos") else row["duration"]


class _Figures:
    """What the page shows, gathered one raw.jsonl row at a time."""

    def __init__(self) -> None:
        self.durations: list[float] = []
        self.lufs: list[float] = []
        self.quality: dict[str, list[float]] = {"sig": [], "bak": [], "ovrl": []}
        self.speakers: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])  # clips, seconds
        self.low: list[tuple[float, int, dict[str, Any]]] = []  # heaps of (key, order, row)
        self.high: list[tuple[float, int, dict[str, Any]]] = []

    def add(self, n: int, row: dict[str, Any]) -> None:
        self.durations.append(row["duration"])
        if row.get("lufs_raw") is not None:
            self.lufs.append(row["lufs_raw"])
        for k, v in (row.get("dnsmos") or {}).items():
            self.quality[k].append(v)
        self.speakers[str(row["speaker"])][0] += 1
        self.speakers[str(row["speaker"])][1] += row["duration"]
        shown = {k: row.get(k) for k in ("id", "speaker", "duration", "dnsmos", "text", "text_raw", "flags")}
        key = _sort_key(row)
        for heap, sign in ((self.low, -1.0), (self.high, 1.0)):  # keep the EXAMPLES most extreme
            item = (sign * key, -n if sign < 0 else n, shown)
            if len(heap) < EXAMPLES:
                heapq.heappush(heap, item)
            else:
                heapq.heappushpop(heap, item)


def _gather(out: Path) -> _Figures:
    figures = _Figures()
    with open(out / "raw.jsonl", encoding="utf-8") as f:
        for n, line in enumerate(f):
            figures.add(n, json.loads(line))
    return figures


def _sentence(ax: Any, title: str, sentence: str) -> None:
    """A panel with nothing to draw says so instead of showing empty axes."""
    ax.set_title(title)
    ax.set_axis_off()
    ax.text(0.5, 0.5, sentence, transform=ax.transAxes, ha="center", va="center", wrap=True)


def _draw(figures: _Figures, reasons: dict[str, int]) -> Any:
    """The report's four panels as a matplotlib Figure; an empty one is a sentence."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    ax = axes[0][0]
    if figures.durations:
        ax.hist(figures.durations, bins=30, color="#4477aa")
        ax.set(title="clip duration (after trimming)", xlabel="seconds", ylabel="clips")
    else:
        _sentence(ax, "clip duration (after trimming)", "no row was kept")
    ax = axes[0][1]
    if figures.lufs:
        ax.hist(figures.lufs, bins=30, color="#cc6677")
        ax.set(title="loudness as recorded (BS.1770)", xlabel="LUFS", ylabel="clips")
    else:
        _sentence(ax, "loudness as recorded (BS.1770)", "no kept row has a loudness")
    ax = axes[1][0]
    if any(figures.quality.values()):
        for k, color in (("sig", "#228833"), ("bak", "#ccbb44"), ("ovrl", "#4477aa")):
            if figures.quality[k]:
                ax.hist(figures.quality[k], bins=np.linspace(1, 5, 41), alpha=0.6, label=k, color=color)
        ax.set(title="DNSMOS P.835", xlabel="score (1-5)", ylabel="clips")
        ax.legend()
    else:
        _sentence(ax, "DNSMOS P.835", "quality was not scored (ingest.score_quality)" if figures.durations
                  else "no row was kept")
    ax = axes[1][1]
    bad = {r: n for r, n in reasons.items() if n}
    if bad:
        ax.barh(list(bad), list(bad.values()), color="#aa3377")
        ax.set(title="quarantined rows by reason", xlabel="rows")
    else:
        _sentence(ax, "quarantined rows by reason", "nothing was quarantined")
    fig.tight_layout()
    return fig


def _plot(figures: _Figures, reasons: dict[str, int]) -> bytes:
    import matplotlib.pyplot as plt

    fig = _draw(figures, reasons)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _examples(heap: list[tuple[float, int, dict[str, Any]]]) -> str:
    """The rows of a heap, the most extreme first."""
    rows = [item[2] for item in sorted(heap, reverse=True)]
    return _table(
        ["id", "speaker", "seconds", "DNSMOS sig/bak/ovrl", "text", "raw text", "flags"],
        [[r["id"], r["speaker"], r["duration"],
          "/".join(f"{r['dnsmos'][k]:.2f}" for k in ("sig", "bak", "ovrl")) if r.get("dnsmos") else "-",
          r["text"], r["text_raw"] if r.get("text_raw") != r["text"] else "", ", ".join(r.get("flags") or [])]
         for r in rows],
    ) if rows else "<p>no kept rows</p>"


def _text_changes(changes: list[dict[str, Any]]) -> str:
    """Every row whose text normalization changed its transcript, in raw.jsonl order; a row the normalizer
    was unsure of (an abbreviation kept, a digit string read as a number) is marked, with why: those are
    the rows to proofread."""
    unsure = sum(1 for c in changes if c.get("unsure"))
    title = (f'<h2 id="text-changes">Text normalization changed {len(changes)} rows, '
             f'{unsure} marked unsure (proofread these)</h2>')
    if not changes:
        return title + "<p>no transcript was changed</p>"
    rows = [[c["id"], c["before"], c["after"], "⚠ " + "; ".join(c["unsure"]) if c.get("unsure") else ""]
            for c in changes]
    return title + _table(["id", "before", "after (what the model trains on)", "unsure"], rows)


def _proofreading(report: dict[str, Any], to_review: int) -> str:
    """How many rows the proofreading page asks a person about, and what the last corrections did: each
    line not applied is listed with why (its row is gone, or its text is no longer the one proofread)."""
    review = report.get("corrections")
    title = '<h2 id="proofreading">Proofreading</h2>'
    page = (f'<p><a href="{PROOFREAD_PAGE}">{PROOFREAD_PAGE}</a> (beside this page): {to_review} rows need '
            "review.</p>")
    if not review or not review.get("lines"):
        return title + page + "<p>no corrections applied</p>"
    applied = ", ".join(f"{a} {review['applied'].get(a, 0)}" for a in ACTIONS)
    skipped = review.get("not_applied") or []
    done = (f'<p id="corrections">{review["lines"]} corrections in {html.escape(review["file"])}: applied '
            f"{applied}; {len(skipped)} not applied.</p>")
    table = _table(["line", "id", "action", "why not applied"],
                   [[c["line"], c["id"], c["action"], c["why"]] for c in skipped]) if skipped else ""
    return title + page + done + table


OTHER_VOICES = ("other_speaker", "overlap")  # a long recording's clips set aside for their voice


def _other_voices(out: Path) -> list[dict[str, Any]]:
    """The quarantined clips of long recordings that are another voice, or two voices, in order."""
    path = out / "quarantine.jsonl"
    if not path.is_file():
        return []
    with open(path, encoding="utf-8") as f:
        return [row for line in f if (row := json.loads(line))["reason"] in OTHER_VOICES]


def _other_voices_table(rows: list[dict[str, Any]]) -> str:
    title = f'<h2 id="other-voices">Other voices set aside: {len(rows)} clips</h2>'
    if not rows:
        return title + "<p>no clip of a long recording was another voice</p>"
    return title + _table(["recording", "start (s)", "end (s)", "reason", "similarity"], [
        [r["source"]["file"], r["source"].get("start"), r["source"].get("end"), r["reason"],
         r.get("similarity")] for r in rows])


def _page(report: dict[str, Any], figures: _Figures, png: bytes, to_review: int,
          others: list[dict[str, Any]]) -> str:
    c = report.get("conditioning", {})
    speakers = [[s, n, f"{sec / 3600:.3f}", f"{sec / max(n, 1):.2f}"]
                for s, (n, sec) in sorted(figures.speakers.items())]
    reasons = [[r, n] for r, n in Counter(report.get("reasons", {})).most_common() if n]
    key = "DNSMOS overall" if any(figures.quality.values()) else "duration"
    done = [[k.replace("_", " "), c[k]] for k in ("trimmed", "trimmed_seconds", "loudness_normalized",
                                                 "peak_limited", "quality_scored", "text_normalized",
                                                 "long_pause", "transcribed", "needs_review") if k in c]
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>voxpipe data report</title>
<style>body{{font-family:sans-serif;margin:1.5em;max-width:1200px}}
table{{border-collapse:collapse;margin:.5em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:13px}} th{{background:#eee}}</style>
</head><body>
<h1>Data report</h1>
<p id="totals">{report.get("rows_in", 0)} rows in, {report.get("rows_kept", 0)} kept
({report.get("hours_kept", 0):.3f} h), {report.get("rows_quarantined", 0)} quarantined.</p>
<img id="figure" alt="durations, loudness, quality and quarantine reasons" src="data:image/png;base64,\
{base64.b64encode(png).decode()}">
<h2>Speakers</h2>{_table(["speaker", "clips", "hours", "mean seconds"], speakers)}
<h2>Conditioning</h2>{_table(["what", "rows (seconds for trimmed seconds)"], done)}
<p>Languages: {html.escape(", ".join(f"{k or '?'} {v}" for k, v in c.get("languages", {}).items()))}</p>
<h2>Quarantine reasons</h2>{_table(["reason", "rows"], reasons) if reasons else NOTHING_QUARANTINED}
<h2 id="worst">The {EXAMPLES} lowest by {key}</h2>{_examples(figures.low)}
<h2 id="best">The {EXAMPLES} highest by {key}</h2>{_examples(figures.high)}
{_proofreading(report, to_review)}
{_text_changes(report.get("text_changes", []))}
{_other_voices_table(others) if others else ""}
</body></html>
"""


def write_data_report(out: Path) -> Path:
    """out/data-report.html, out/data-report.png and the proofreading page out/proofread.html from the
    ingest outputs already in `out`."""
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    figures = _gather(out)
    png = _plot(figures, report.get("reasons", {}))
    to_review = write_proofread_page(out, report)
    atomic_write(out / FIGURE, lambda tmp: Path(tmp).write_bytes(png), ".tmp")
    atomic_write_text(out / PAGE, _page(report, figures, png, to_review, _other_voices(out)))
    return out / PAGE

"""The proofreading page (`proofread.html`, beside raw.jsonl): listen to a row, correct its transcript, and
save the decisions as the corrections file ingest applies on its next run (corrections.py).

The rows that need a person come first: those the recogniser flagged (`needs_review`, with its
`review_reason`) and those whose text normalization was unsure of a reading; then the rest, in raw.jsonl
order. Each row has its player, its transcript in an editable box (as read or recognised, before
normalization: a fix is normalized as typed text is), what it trains on, why it needs review, and keep, fix
and drop. 'Save corrections' downloads every decision as JSON lines (a Blob: the page is a static file and
sends nothing anywhere); the page starts from the decisions the last run applied, and 'Load' adds those of a
file saved before, so a second session goes on from the first. The audio is linked relative to the page
(audio/..), not embedded: a data set's clips would make one page of gigabytes.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from voxpipe.data.corrections import REASON, ingested_text, text_sha256
from voxpipe.files import atomic_write_text

PAGE = "proofread.html"
MORE_ROWS = 2000  # rows beyond those that need review, at most: the page stays a few MB


def _to_review(row: dict[str, Any], unsure: dict[str, list[str]]) -> str:
    """Why a person should listen to this row ("" = no reason)."""
    if (row.get("review") or {}).get("action"):
        return ""  # decided on an earlier page
    why = []
    if row.get("needs_review"):
        why.append(str(row.get("review_reason") or "flagged by the recogniser"))
    if unsure.get(row["id"]):
        why.append("text normalization unsure: " + "; ".join(unsure[row["id"]]))
    return "; ".join(why)


def _recogniser(row: dict[str, Any]) -> str:
    """The recogniser's fields of the row, whatever ingest names them (asr, asr_confidence, ...)."""
    keys = [k for k in row if k.startswith("asr") or "confidence" in k or k.startswith("recogni")]
    return ", ".join(f"{k}: {row[k]}" for k in sorted(keys))


def _transcript(row: dict[str, Any]) -> str:
    """The transcript as it stands (as read or recognised, or as fixed), before normalization."""
    return row["text_raw"] if isinstance(row.get("text_raw"), str) else row["text"]


def _row(row: dict[str, Any], why: str) -> str:
    e = html.escape
    review = row.get("review") or {}
    facts = f"{e(str(row['speaker']))} · {row['duration']:.2f} s"
    asr = _recogniser(row)
    decided = f"corrected earlier: {review['action']}" if review.get("action") else ""
    return (
        f"<section class='row' data-id='{e(row['id'])}' data-sha256='{text_sha256(ingested_text(row))}' "
        f"data-review='{1 if why else 0}' data-earlier='{e(review.get('action', ''))}'>"
        f"<h3>{e(row['id'])} <small>{facts}</small> <span class='decision'>{e(decided)}</span></h3>"
        + (f"<p class='why'>needs review: {e(why)}</p>" if why else "")
        + (f"<p class='asr'>{e(asr)}</p>" if asr else "")
        + f"<textarea class='text' rows='2'>{e(_transcript(row))}</textarea>"
        f"<p class='trains'>trains on: {e(row['text'])}</p>"
        f"<div class='controls'><audio controls preload='none' src='{e(row['audio'])}'></audio>"
        "<button type='button' class='keep'>keep</button><button type='button' class='fix'>fix</button>"
        "<button type='button' class='drop'>drop</button></div></section>"
    )


SCRIPT = """<script>
const decisions = new Map(JSON.parse(document.getElementById('decisions').textContent).map(d => [d.id, d]));
const status = document.getElementById('status');
const CORRECTIONS = document.body.dataset.corrections;
function show(section) {
  const d = decisions.get(section.dataset.id);
  section.dataset.decision = d ? d.action : '';
  section.querySelector('.decision').textContent = d ? `decided: ${d.action}` : '';
}
function decide(section, action) {
  const box = section.querySelector('textarea');
  const d = {id: section.dataset.id, sha256: section.dataset.sha256, action};
  if (action === 'keep') {
    box.value = box.defaultValue;  // the text as the page opened
    const earlier = decisions.get(d.id);
    if (section.dataset.earlier === 'fix' && earlier) { decisions.set(d.id, earlier); show(section); return; }
  }
  if (action === 'fix') {
    if (!box.value.trim()) { status.textContent = 'An empty text is no fix: drop the row instead.'; return; }
    d.text = box.value.trim();
  }
  decisions.set(d.id, d);
  show(section);
}
for (const section of document.querySelectorAll('section.row')) {
  for (const action of ['keep', 'fix', 'drop'])
    section.querySelector('button.' + action).addEventListener('click', () => decide(section, action));
  section.querySelector('textarea').addEventListener('input', () => {
    section.querySelector('.decision').textContent = 'edited: press fix to keep the edit';
  });
  show(section);
}
document.getElementById('only-review').addEventListener('change', e => {
  for (const s of document.querySelectorAll('section.row'))
    s.hidden = e.target.checked && s.dataset.review !== '1';
});
document.getElementById('save').addEventListener('click', () => {
  const lines = [...decisions.values()].map(d => JSON.stringify(d) + '\\n');
  const count = a => lines.filter(l => JSON.parse(l).action === a).length;
  const link = document.createElement('a');
  link.href = URL.createObjectURL(new Blob(lines, {type: 'application/x-ndjson'}));
  link.download = 'corrections.jsonl';
  document.body.appendChild(link); link.click(); link.remove();
  status.textContent = `Saved ${lines.length} decisions (fix ${count('fix')}, drop ${count('drop')}, ` +
    `keep ${count('keep')}) as corrections.jsonl: put it at ${CORRECTIONS} and run dvc repro.`;
});
document.getElementById('load').addEventListener('change', async e => {
  const file = e.target.files[0];
  if (!file) return;
  const lines = (await file.text()).split('\\n').filter(l => l.trim());
  try {
    for (const line of lines) { const d = JSON.parse(line); decisions.set(d.id, d); }
  } catch (err) { status.textContent = `${file.name} is not a corrections file: ${err.message}`; return; }
  for (const s of document.querySelectorAll('section.row')) {
    const d = decisions.get(s.dataset.id);
    if (d && d.action === 'fix') s.querySelector('textarea').value = d.text;
    show(s);
  }
  status.textContent = `Loaded ${lines.length} decisions from ${file.name}.`;
});
</script>"""


def _rows(raw: Path) -> Iterator[dict[str, Any]]:
    with open(raw, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def proofread_page(raw: Path, unsure: dict[str, list[str]], decisions: list[dict[str, Any]],
                   corrections: str) -> tuple[str, int]:
    """(the page's HTML, how many rows need review) from raw.jsonl (read twice, streamed): the rows to
    review first, then up to MORE_ROWS others; `decisions` are the corrections already applied (the page
    starts from them); `corrections` the file to save to."""
    sections, total, flagged, rest = [], 0, 0, 0
    for row in _rows(raw):
        total += 1
        if why := _to_review(row, unsure):
            flagged += 1
            sections.append(_row(row, why))
    for row in _rows(raw):
        if not _to_review(row, unsure):
            rest += 1
            if rest <= MORE_ROWS:
                sections.append(_row(row, ""))
    left = rest - MORE_ROWS
    e = html.escape
    embedded = json.dumps(decisions, ensure_ascii=False).replace("</", "<\\/")
    return "\n".join([
        "<!doctype html><html><head><meta charset='utf-8'><title>Proofreading</title><style>"
        "body{font-family:sans-serif;margin:0 1.5em 1.5em;max-width:60em}section{border-top:1px solid #ccc;"
        "padding:.3em .5em}section p,h3{margin:.3em 0}h1{margin:.6em 0 .3em}"
        "textarea{width:100%;font-size:14px;box-sizing:border-box}"
        ".why{color:#a33}.asr,.trains{color:#555;font-size:13px}.controls{display:flex;gap:.5em;"
        "align-items:center}.controls audio{height:32px}#bar{position:sticky;top:0;background:#fff;"
        "padding:.5em 0;margin:0;border-bottom:1px solid #888}.decision{color:#247;font-weight:normal}"
        "section[data-decision=keep]{background:#f2faf2}section[data-decision=fix]{background:#f2f5fc}"
        "section[data-decision=drop]{background:#f6f0f0;color:#777}"
        "section[data-decision=drop] textarea{text-decoration:line-through}</style></head>",
        f"<body data-corrections='{e(corrections)}'>",
        f"<h1>Proofreading</h1><p id='totals'>{total} rows, {flagged} need review (first).</p>",
        "<p>Listen, then press <b>keep</b> (the text is right), edit the text and press <b>fix</b>, or "
        f"<b>drop</b> the row (quarantined as {REASON}). <b>Save corrections</b> downloads every decision "
        f"as corrections.jsonl: put it at <code>{e(corrections)}</code> (ingest.corrections) and run "
        "<code>dvc repro</code>; ingest applies it. The page starts from the decisions already applied; "
        "<b>Load</b> adds those of a file saved before.</p>",
        "<p id='bar'><label><input type='checkbox' id='only-review'> only the rows that need review</label> "
        "<button id='save' type='button'>Save corrections</button> "
        "<label>Load <input type='file' id='load' accept='.jsonl,.json,.txt'></label> "
        "<span id='status'></span></p>",
        *sections,
        f"<p id='more'>{left} more rows are not shown here; decide them by id in raw.jsonl.</p>" if left > 0
        else "",
        f"<script type='application/json' id='decisions'>{embedded}</script>",
        SCRIPT,
        "</body></html>",
    ]) + "\n", flagged


def write_proofread_page(out: Path, report: dict[str, Any]) -> int:
    """out/proofread.html from raw.jsonl and report.json (its text changes and applied corrections); how
    many rows need review."""
    unsure = {c["id"]: c["unsure"] for c in report.get("text_changes", []) if c.get("unsure")}
    review = report.get("corrections") or {}
    page, flagged = proofread_page(out / "raw.jsonl", unsure, review.get("decisions", []),
                          review.get("file", "data/corrections.jsonl"))
    atomic_write_text(out / PAGE, page)
    return flagged

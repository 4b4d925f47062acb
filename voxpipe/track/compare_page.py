"""compare.html: the compared runs on one self-contained page, to listen to and to read.

One row per val sentence, one player per run, all playing the fine-tuned model's sample of the same
text with the same generation seed (register logs them as `audio/<val row id>-<ref|noref>.wav`, the
name every run shares); the runs' figures and verdicts above, the val curves overlaid. Everything is
embedded (base64 data URIs, as evaluate's page: voxpipe/evaluate/pages.py), so the page plays as a
KFP HTML artifact (a sandboxed frame that fetches nothing) and as an MLflow artifact of a sweep's
parent run. Runs scored on different val sets get a section each: their sentences are not the same.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxpipe.evaluate.pages import data_uri, html_table, page_head

if TYPE_CHECKING:
    from mlflow import MlflowClient


@dataclass(frozen=True)
class RunMedia:
    audio: dict[str, Path] = field(default_factory=dict)  # `<row id>-<ref|noref>` -> wav
    texts: dict[str, str] = field(default_factory=dict)  # the same key -> the val text
    seed: Any = None  # evaluate's generation_seed


def _texts(figures: dict[str, Any]) -> dict[str, str]:
    out = {}
    for r in (figures.get("utterances") or {}).get("model") or []:
        if r.get("row_id"):
            out[f"{r['row_id']}-{'ref' if r.get('with_reference') else 'noref'}"] = str(r.get("text", ""))
    return out


def run_media(client: MlflowClient, run_id: str, dst: Path) -> RunMedia:
    """A run's `audio/` samples and their texts (its logged eval.json), downloaded under `dst`."""
    names = {f.path for folder in ("audio", "eval") for f in client.list_artifacts(run_id, folder)}
    dst.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {}
    if "eval/eval.json" in names:
        figures = json.loads(Path(client.download_artifacts(run_id, "eval/eval.json", str(dst))).read_text())
    audio = {}
    if any(n.startswith("audio/") for n in names):
        folder = Path(client.download_artifacts(run_id, "audio", str(dst)))
        audio = {wav.stem: wav for wav in sorted(folder.glob("*.wav"))}
    return RunMedia(audio, _texts(figures), (figures.get("settings") or {}).get("generation_seed"))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _players(rows: list[dict[str, Any]], media: dict[str, RunMedia]) -> str:
    """The sentence grid of runs scored on one val set: a row per sentence, a column per run."""
    sentences = sorted({key for row in rows for key in media[row["id"]].audio})
    if not sentences:
        return "<p>No samples: these runs logged no <code>audio/</code> artifacts.</p>"
    head = "".join(
        f"<th>{html.escape(row['run'] or '')} ({row['id']})<br>{html.escape(_cell(row['verdict']))}"
        f"<br>seed {html.escape(_cell(media[row['id']].seed))}</th>" for row in rows)
    body = []
    for key in sentences:
        text = next((media[r["id"]].texts[key] for r in rows if key in media[r["id"]].texts), "")
        cells = []
        for row in rows:
            wav = media[row["id"]].audio.get(key)
            player = f"<audio controls preload='none' src='{data_uri(wav, 'audio/wav')}'></audio>"
            cells.append(f"<td>{player}</td>" if wav else "<td>no sample</td>")
        caption = f"<td><b>{html.escape(text)}</b><br><small>{html.escape(key)}</small></td>"
        body.append(f"<tr>{caption}{''.join(cells)}</tr>")
    return f"<table class='players'><tr><th>val sentence</th>{head}</tr>{''.join(body)}</table>"


def compare_page(rows: list[dict[str, Any]], media: dict[str, RunMedia], curves: Path) -> str:
    """The page for the rows `compare` built (sorted, val set in `val_set`) and each run's media."""
    columns = [c for c in (rows[0] if rows else {}) if c != "val_set"]
    groups = list(dict.fromkeys(r["val_set"] for r in rows))
    parts = [page_head("voxpipe compare"), f"<h1>{len(rows)} runs compared</h1>"]
    if len(groups) > 1:
        parts.append(f"<p><b>These runs were scored on {len(groups)} different val sets</b>: their losses "
                     "and figures compare only within a group, and each group has its own sentences.</p>")
    for group in groups:
        mine = [r for r in rows if r["val_set"] == group]
        title = f" (val set {html.escape(str(group))})" if len(groups) > 1 else ""
        parts += [f"<h2>Figures and verdicts{title}</h2>",
                  html_table(tuple(columns), [tuple(_cell(r[c]) for c in columns) for r in mine])]
    parts += ["<h2>Fixed-seed val loss</h2>",
              f"<img class='plot' alt='val curves' src='{data_uri(curves, 'image/png')}'>"]
    for group in groups:
        mine = [r for r in rows if r["val_set"] == group]
        title = f" (val set {html.escape(str(group))})" if len(groups) > 1 else ""
        parts += [f"<h2>The same sentence from every run{title}</h2>", _players(mine, media)]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"

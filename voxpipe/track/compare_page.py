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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxpipe.evaluate.pages import data_uri, html_table, page_head
from voxpipe.track.untrusted import printable

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import FileInfo


MAX_EVAL_BYTES = 32 << 20  # an eval.json larger than this is no evaluate output (the demo's: 36 kB)
MAX_CLIP_BYTES = 32 << 20  # a clip larger than this is no evaluate sample (a 60 s one: 5.5 MB)
TEXT_CHARS = 500  # of a val text shown above its players


class BadArtifact(Exception):
    """A run's artifact that compare cannot read: the run is left out, and this says why."""


@dataclass(frozen=True)
class RunMedia:
    audio: dict[str, Path] = field(default_factory=dict)  # `<row id>-<ref|noref>` -> wav
    texts: dict[str, str] = field(default_factory=dict)  # the same key -> the val text
    seed: Any = None  # evaluate's generation_seed


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _field(tree: dict[str, Any], key: str, kind: type, where: str) -> Any:
    """tree[key] when it is a `kind` (None when missing or null); another type is a BadArtifact."""
    value = tree.get(key)
    if value is not None and not isinstance(value, kind):
        raise BadArtifact(f"eval/eval.json: {where}{key} is {_kind(value)}, not {_kind(kind())}")
    return value


def _texts(figures: dict[str, Any]) -> dict[str, str]:
    out = {}
    utterances = _field(figures, "utterances", dict, "") or {}
    for number, r in enumerate(_field(utterances, "model", list, "utterances.") or []):
        if not isinstance(r, dict):
            raise BadArtifact(f"eval/eval.json: utterances.model[{number}] is {_kind(r)}, not an object")
        row_id = _field(r, "row_id", str, f"utterances.model[{number}].")
        text = _field(r, "text", str, f"utterances.model[{number}].")
        if row_id:
            out[f"{row_id}-{'ref' if r.get('with_reference') else 'noref'}"] = (text or "")[:TEXT_CHARS]
    return out


def _figures(path: Path) -> dict[str, Any]:
    """The run's logged eval.json, or a BadArtifact that says what is wrong with it."""
    try:
        figures = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, nested past Python's limit
        raise BadArtifact(f"eval/eval.json is not JSON ({type(e).__name__}: {str(e)[:80]})") from None
    if not isinstance(figures, dict):
        raise BadArtifact(f"eval/eval.json is {_kind(figures)}, not an object")
    return figures


def _fetch(client: MlflowClient, run_id: str, info: FileInfo, limit: int, dst: Path) -> Path:
    """One artifact file, downloaded under `dst` unless it is a folder or larger than `limit` bytes."""
    if info.is_dir:
        raise BadArtifact(f"{info.path} is a folder, not a file")
    too_big = f"{info.path} is larger than {limit >> 20} MiB: no evaluate output is"
    if (info.file_size or 0) > limit:
        raise BadArtifact(too_big)
    path = Path(client.download_artifacts(run_id, info.path, str(dst)))
    if not path.is_file() or path.stat().st_size > limit:
        raise BadArtifact(too_big if path.is_file() else f"{info.path} is not a file")
    return path


def run_media(client: MlflowClient, run_id: str, dst: Path) -> RunMedia:
    """A run's `audio/` samples and their texts (its logged eval.json), downloaded under `dst`; a
    BadArtifact when one of them is not what register logs (not JSON, wrong types, too large, no WAV)."""
    files = {f.path: f for folder in ("audio", "eval") for f in client.list_artifacts(run_id, folder)}
    dst.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {}
    if "eval/eval.json" in files:
        figures = _figures(_fetch(client, run_id, files["eval/eval.json"], MAX_EVAL_BYTES, dst))
    audio = {}
    for name in sorted(n for n in files if n.startswith("audio/") and n.endswith(".wav")):
        wav = _fetch(client, run_id, files[name], MAX_CLIP_BYTES, dst)
        with wav.open("rb") as f:
            head = f.read(12)
        if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            raise BadArtifact(f"{name} is not a WAV file")
        audio[wav.stem] = wav
    settings = _field(figures, "settings", dict, "") or {}
    seed = settings.get("generation_seed")
    if isinstance(seed, dict | list):
        raise BadArtifact(f"eval/eval.json: settings.generation_seed is {_kind(seed)}, not a number")
    return RunMedia(audio, _texts(figures), seed)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else printable(str(value))[:TEXT_CHARS]


def _players(rows: list[dict[str, Any]], media: dict[str, RunMedia]) -> str:
    """The sentence grid of runs scored on one val set: a row per sentence, a column per run."""
    sentences = sorted({key for row in rows for key in media[row["id"]].audio})
    if not sentences:
        return ("<p>No samples: these runs logged no <code>audio/</code> artifacts (<code>voxpipe "
                "register</code>, run again on a run's outputs, adds them to a run logged without them).</p>")
    head = "".join(
        f"<th>{html.escape(_cell(row['run']))} ({row['id']})<br>{html.escape(_cell(row['verdict']))}"
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


def compare_page(rows: list[dict[str, Any]], media: dict[str, RunMedia], curves: Path,
                 skipped: Sequence[str] = ()) -> str:
    """The page for the rows `compare` built (sorted, val set in `val_set`) and each run's media; the
    runs left out for a malformed artifact (`skipped`: id and why) are listed under the title."""
    columns = [c for c in (rows[0] if rows else {}) if c != "val_set"]
    groups = list(dict.fromkeys(r["val_set"] for r in rows))
    parts = [page_head("voxpipe compare"), f"<h1>{len(rows)} runs compared</h1>"]
    if skipped:
        parts.append("<p>Left out (a malformed artifact):</p><ul>"
                     + "".join(f"<li>{html.escape(printable(why))}</li>" for why in skipped) + "</ul>")
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

"""evaluate's results as pages a UI shows: a Markdown summary (the headline figures and the promotion
verdict) and one self-contained HTML page with the plots and every generated sample embedded (base64
data URIs), so it plays in the KFP UI, which shows an HTML artifact in a sandboxed frame that cannot
fetch files next to it.

Both read an evaluate output folder (eval.json, *.png, samples/*.wav) and show whatever eval.json has:
a figure evaluate did not write is left out, not invented.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from voxpipe.files import read_json_object

# (eval.json key, label, format) of the headline table, fine-tuned vs baseline where both exist
HEADLINE = (
    ("loss", "fixed-seed val loss", ".5f"),
    ("speaker_similarity_mean", "speaker similarity", ".3f"),
    ("stop_failure_rate", "stop failures", ".2%"),
    ("wer", "WER (pocketsphinx)", ".3f"),
    ("cer", "CER (pocketsphinx)", ".3f"),
    ("rtf", "real-time factor", ".3f"),
)


def _fmt(value: Any, spec: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "n/a" if value is None else str(value)
    return f"{value:{spec}}"


def _pair(figures: dict[str, Any], key: str) -> tuple[Any, Any]:
    if key == "loss":
        return figures.get("loss_model"), figures.get("loss_baseline")
    return figures.get(key), figures.get(f"{key}_baseline")


def headline_rows(figures: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(label, fine-tuned, baseline) for each headline figure eval.json has."""
    rows = []
    for key, label, spec in HEADLINE:
        model, baseline = _pair(figures, key)
        if model is not None or baseline is not None:
            rows.append((label, _fmt(model, spec), _fmt(baseline, spec)))
    return rows


def verdict_lines(figures: dict[str, Any]) -> tuple[str, list[tuple[str, str, str]]]:
    """The promotion verdict's headline and its criteria as (criterion, passed, detail)."""
    promotion = figures.get("promotion") or {}
    if "promoted" in promotion:
        word = "PROMOTE" if promotion["promoted"] else "do not promote"
        head = f"{word} (against {promotion.get('against')})"
    elif "improved" in figures:
        head = "improved" if figures["improved"] else "not improved"
    else:
        head = "no verdict in eval.json"
    criteria = [(c.get("name", "?"), "pass" if c.get("passed") else "FAIL", str(c.get("detail", "")))
                for c in promotion.get("criteria", [])]
    return head, criteria


def summary_markdown(figures: dict[str, Any]) -> str:
    """eval.json as a Markdown summary: the verdict, the headline table, the promotion criteria."""
    head, criteria = verdict_lines(figures)
    lines = [f"# Evaluation: {head}", ""]
    if figures.get("verdict"):
        lines += [str(figures["verdict"]), ""]
    lines += ["| figure | fine-tuned | baseline |", "|---|---|---|"]
    lines += [f"| {label} | {model} | {base} |" for label, model, base in headline_rows(figures)]
    if criteria:
        lines += ["", "## Promotion rule", "", "| criterion | result | detail |", "|---|---|---|"]
        lines += [f"| {name} | {passed} | {detail.replace('|', '/')} |" for name, passed, detail in criteria]
    return "\n".join(lines) + "\n"


def _data_uri(path: Path, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def eval_page(folder: Path) -> str:
    """One HTML page: verdict, headline table, plots (*.png) and a player per sample, all embedded."""
    figures = read_json_object(folder / "eval.json", "evaluate's eval.json")
    head, criteria = verdict_lines(figures)
    texts = {r["name"]: r.get("text", "") for records in (figures.get("utterances") or {}).values()
             for r in records if "name" in r}
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>voxpipe evaluation</title><style>"
        "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin:.5em 0}"
        "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}img{max-width:100%}"
        "</style></head><body>",
        f"<h1>Evaluation: {html.escape(head)}</h1>",
        f"<p>{html.escape(str(figures.get('verdict', '')))}</p>",
        _table(("figure", "fine-tuned", "baseline"), headline_rows(figures)),
    ]
    if criteria:
        parts += ["<h2>Promotion rule</h2>", _table(("criterion", "result", "detail"), criteria)]
    for png in sorted(folder.glob("*.png")):
        parts += [f"<h2>{html.escape(png.stem)}</h2>",
                  f"<img class='plot' alt='{html.escape(png.name)}' src='{_data_uri(png, 'image/png')}'>"]
    samples = sorted((folder / "samples").glob("*.wav"))
    parts.append(f"<h2>Samples ({len(samples)})</h2>")
    for wav in samples:
        text = next((t for name, t in texts.items() if wav.stem.endswith(name)), "")  # <tag>-<name>.wav
        caption = html.escape(f"{wav.stem}: {text}".rstrip(": "))
        parts.append(f"<figure><figcaption>{caption}</figcaption>"
                     f"<audio controls preload='none' src='{_data_uri(wav, 'audio/wav')}'></audio></figure>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"

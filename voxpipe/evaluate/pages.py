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
import textwrap
from pathlib import Path
from typing import Any

from voxpipe.files import read_json_object

WIDTH = 200  # the summary's paragraphs wrap here: a terminal line, not a page of one line

# (eval.json key, label, format) of the headline table, fine-tuned vs baseline where both exist
HEADLINE = (
    ("loss", "fixed-seed val loss", ".5f"),
    ("similarity_to_speaker_mean", "similarity to speaker", ".3f"),
    ("similarity_to_prompt_mean", "similarity to prompt", ".3f"),
    ("stop_failure_rate", "stop failures", ".2%"),
    ("wer", "WER", ".3f"),
    ("cer", "CER", ".3f"),
    ("rtf", "real-time factor", ".3f"),
)
SIMILARITY = ("similarity_to_speaker: the {backend} cosine of each generated clip (with and without a "
              "reference) to the mean of its speaker's real clips, the promotion rule's; the real clips "
              "themselves score {real} (the ceiling)")
PROMPT_SIMILARITY = ("similarity_to_prompt: the {backend} cosine of each clip generated with a reference "
                     "clip to that clip (Seed-TTS-eval's SIM protocol); {comparable}")
BENCHMARK_ROWS = (("wer", "WER", ".2%"), ("cer", "CER", ".2%"), ("sim", "SIM", ".3f"))
FAR_FROM_REAL = 0.25  # a generated voice this far below its real clips' own similarity is not yet theirs
CHARACTER_METRIC = {"wer": False, "cer": True}  # which error rate a language is scored by (CER: Chinese)


def _fmt(value: Any, spec: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "n/a" if value is None else str(value)
    return f"{value:{spec}}"


# eval.json written before it named two similarities called similarity_to_speaker speaker_similarity
LEGACY = {"similarity_to_speaker_mean": "speaker_similarity_mean"}


def _pair(figures: dict[str, Any], key: str) -> tuple[Any, Any]:
    if key == "loss":
        return figures.get("loss_model"), figures.get("loss_baseline")
    if key not in figures and LEGACY.get(key) in figures:
        key = LEGACY[key]
    return figures.get(key), figures.get(f"{key.removesuffix('_mean')}_baseline")


def _asr_label(figures: dict[str, Any]) -> str:
    names = sorted({b.get("backend", "?") for b in (figures.get("backends") or {}).get("asr", [])})
    return f" ({', '.join(names)})" if names else ""


def why_no_rate(figures: dict[str, Any], metric: str) -> str:
    """Why eval.json has no `metric` (wer/cer): the recogniser's reason, or that no row is scored by it."""
    if figures.get(f"{metric}_null_reason"):
        return str(figures[f"{metric}_null_reason"])
    return why_no_rate_in((figures.get("intelligibility") or {}).get("model", {}), metric)


def why_no_rate_in(by_language: dict[str, Any], metric: str) -> str:
    """Why one checkpoint's clips have no `metric`, from eval.json's intelligibility per language."""
    mine = {lang: v for lang, v in by_language.items() if v.get("metric") == metric}
    reasons = sorted({v["reason"] for v in mine.values() if v.get("reason")})
    if reasons:
        return "; ".join(reasons)
    if mine:
        return "not scored"
    return ("no Chinese row in the val set (CER scores Chinese)" if CHARACTER_METRIC[metric] else
            "no row in a word-spaced language in the val set (WER scores those)")


def headline_rows(figures: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(label, fine-tuned, baseline) for each headline figure eval.json has; an error rate it lacks
    says why."""
    rows = []
    for key, label, spec in HEADLINE:
        model, baseline = _pair(figures, key)
        if key in CHARACTER_METRIC:
            label += _asr_label(figures)
            if model is None and baseline is None and "intelligibility" in figures:
                rows.append((label, f"n/a ({why_no_rate(figures, key)})", "n/a"))
                continue
        if model is not None or baseline is not None:
            rows.append((label, _fmt(model, spec), _fmt(baseline, spec)))
    return rows


def real_similarity(figures: dict[str, Any]) -> float | None:
    """The real clips' own mean similarity to their speaker's mean: the most a generated voice can reach."""
    values = [v["clip_similarity_mean"] for v in (figures.get("voices") or {}).values()
              if isinstance(v.get("clip_similarity_mean"), int | float)]
    return sum(values) / len(values) if values else None


def _gain_cell(c: dict[str, Any]) -> str:
    """The criterion's paired gain as `gain [low, high]` (several, by figure, for the benchmark's rates)."""
    gain = c.get("gain")
    if not isinstance(gain, dict):
        return "-"
    if "shown" in gain:
        return str(gain["shown"])
    return "; ".join(f"{k} {g.get('shown')}" for k, g in gain.items() if isinstance(g, dict))


def gain_lines(figures: dict[str, Any]) -> list[str]:
    """Every paired gain eval.json has (candidate minus baseline, `gain [low, high]`), and where the
    rule's tolerances came from."""
    gains = {name: g for name, g in (figures.get("gains") or {}).items() if isinstance(g, dict)}
    text = []
    if gains:
        known = [f"{name} {g.get('shown')}" for name, g in gains.items() if g.get("gain") is not None]
        unknown = [name for name, g in gains.items() if g.get("gain") is None]  # eval.json says why
        text.append("paired gains, candidate - baseline [95% interval]: " + "; ".join(known)
                    + (f"; none for {', '.join(unknown)} (eval.json's gains say why)" if unknown else ""))
    if figures.get("tolerance_source"):
        text.append(f"tolerances: {figures['tolerance_source']}")
    return [line for paragraph in text
            for line in textwrap.wrap(paragraph, WIDTH, initial_indent="  ", subsequent_indent="    ")]


def _limit(c: dict[str, Any]) -> str:
    limit = c.get("limit")
    if isinstance(c.get("gain"), dict) and "shown" in c["gain"] and c.get("name", "").startswith(
            ("similarity[", "quality")) and isinstance(limit, int | float):
        return f"gain low >= {limit:+.3f}"
    if isinstance(limit, list):
        return "no new split"
    if isinstance(limit, dict):  # did_not_forget: a bound per error rate
        return "<= " + ", ".join(f"{k} {_fmt(v, '.4f')}" for k, v in limit.items())
    if not isinstance(limit, int | float) or isinstance(limit, bool):
        return "none"
    sign = "<" if c.get("name") == "loss" else "<=" if c.get("name") == "stop_failures" else ">="
    return f"{sign} {_cell(limit, c.get('name', ''))}"


def _cell(value: Any, name: str) -> str:
    if isinstance(value, list):
        return str(len(value))
    if isinstance(value, dict):  # did_not_forget: the benchmark's error rates
        return ", ".join(f"{k} {_fmt(v, '.4f')}" for k, v in value.items() if v is not None) or "n/a"
    spec = ".5f" if name == "loss" else ".0%" if name == "stop_failures" else ".3f"
    return _fmt(value, spec)


def report_lines(figures: dict[str, Any]) -> list[str]:
    """The verdict as a short report: a criterion table (candidate, reference, limit, pass), the similarity
    figure's definition with the real clips' ceiling, a note when the voice is still far from the real one,
    and each error rate (or why it has none)."""
    head, _ = verdict_lines(figures)
    criteria = (figures.get("promotion") or {}).get("criteria", [])
    rows = [("criterion", "candidate", "reference", "gain [95% interval]", "limit", "pass")]
    rows += [(c["name"], _cell(c.get("candidate"), c["name"]), _cell(c.get("reference"), c["name"]),
              _gain_cell(c), _limit(c), "yes" if c.get("passed") else "NO") for c in criteria]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [head] + ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
                      for r in rows]
    lines += gain_lines(figures)
    real = real_similarity(figures)
    encoder = (figures.get("backends") or {}).get("speaker_similarity") or {}
    backend = encoder.get("backend", "speaker-encoder")
    lines.append("  " + SIMILARITY.format(backend=backend, real=_fmt(real, ".3f")))
    comparable = ("comparable to published SIM" if figures.get("similarity_to_prompt_comparable") else
                  "not comparable to published SIM (that needs evaluate.speaker wavlm-ecapa)")
    lines.append("  " + PROMPT_SIMILARITY.format(backend=backend, comparable=comparable))
    mine = figures.get("similarity_to_speaker_mean", figures.get(LEGACY["similarity_to_speaker_mean"]))
    if isinstance(mine, int | float) and real is not None and real - mine > FAR_FROM_REAL:
        lines.append(f"  note: the generated voice is still far from the real one (similarity {mine:.3f} "
                     f"vs the real clips' {real:.3f}), whatever the rule says: listen to the samples; more "
                     "steps, more data or the real VoxCPM2 base close the gap")
    for metric in CHARACTER_METRIC:
        value = figures.get(metric)
        text = (f"{value:.3f} (real clips {_fmt(figures.get(f'{metric}_real'), '.3f')})"
                if isinstance(value, int | float) else f"n/a: {why_no_rate(figures, metric)}")
        lines.append(f"  {metric}{_asr_label(figures)}: {text}")
    bench = figures.get("benchmark")
    if bench:
        lines.append(f"  benchmark {bench['set']} ({bench['lines']} lines): " + "; ".join(
            f"{label} {' / '.join(cells)}" for label, *cells in benchmark_rows(bench))
            + " (fine-tuned / base / delta / VoxCPM2 published)")
    elif "benchmark_null_reason" in figures:
        lines.append(f"  benchmark: n/a ({figures['benchmark_null_reason']})")
    return lines


def benchmark_rows(bench: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(figure, fine-tuned, base, delta, published) for each protocol figure the set has: WER/CER as
    percentages, SIM a cosine; the published column is VoxCPM2's own figure for the set, labelled so."""
    published = bench.get("published") or {}
    rows = []
    for key, label, spec in BENCHMARK_ROWS:
        mine, base = bench["model"].get(key), bench["baseline"].get(key)
        if mine is None and base is None:
            continue
        delta = bench["delta"].get(key)
        shown = published.get("sim") if key == "sim" else (
            published.get("rate") if published.get("metric") == key else None)
        rows.append((label, _fmt(mine, spec), _fmt(base, spec),
                     "n/a" if delta is None else f"{delta:+{spec}}",
                     "n/a" if shown is None else f"{shown:{spec}} (published)"))
    return rows


def _benchmark_caption(bench: dict[str, Any]) -> str:
    sim = ("SIM comparable to published (wavlm-ecapa)" if bench.get("sim_comparable_to_published") else
           f"SIM by {bench.get('speaker_backend')}: not comparable to published (needs evaluate.speaker "
           "wavlm-ecapa)")
    published = bench.get("published") or {}
    source = published.get("source") or bench.get("published_null_reason") or ""
    return f"Seed-TTS-eval {bench['set']}, {bench['lines']} lines; {sim}; published column: {source}"


def _definitions(figures: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted((figures.get("similarity_definitions") or {}).items())


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
    if _definitions(figures):
        lines += ["", *(f"- `{name}`: {text}" for name, text in _definitions(figures))]
    bench = figures.get("benchmark")
    if bench:
        lines += ["", "## Standard test set", "", _benchmark_caption(bench), "",
                  "| figure | fine-tuned | base | delta | VoxCPM2 |", "|---|---|---|---|---|"]
        lines += ["| " + " | ".join(row) + " |" for row in benchmark_rows(bench)]
    if criteria:
        lines += ["", "## Promotion rule", "", "| criterion | result | detail |", "|---|---|---|"]
        lines += [f"| {name} | {passed} | {detail.replace('|', '/')} |" for name, passed, detail in criteria]
    if figures.get("gains"):
        lines += ["", "## Paired gains (candidate - baseline, 95% interval)", "",
                  "| figure | gain [low, high] |", "|---|---|",
                  *(f"| {name} | {g.get('shown')} |" for name, g in figures["gains"].items())]
    if figures.get("tolerance_source"):
        lines += ["", f"Tolerances: {figures['tolerance_source']}"]
    return "\n".join(lines) + "\n"


def data_uri(path: Path, mime: str) -> str:
    """The file as a base64 data URI: a page that embeds its media plays where it cannot fetch files."""
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def html_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def page_head(title: str) -> str:
    """The start of a self-contained page (inline style), up to and including <body>."""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
            "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin:.5em 0}"
            "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left;vertical-align:top}"
            "img{max-width:100%}</style></head><body>")


def eval_page(folder: Path) -> str:
    """One HTML page: verdict, headline table, plots (*.png) and a player per sample, all embedded."""
    figures = read_json_object(folder / "eval.json", "evaluate's eval.json")
    head, criteria = verdict_lines(figures)
    texts = {r["name"]: r.get("text", "") for records in (figures.get("utterances") or {}).values()
             for r in records if "name" in r}
    parts = [
        page_head("voxpipe evaluation"),
        f"<h1>Evaluation: {html.escape(head)}</h1>",
        f"<p>{html.escape(str(figures.get('verdict', '')))}</p>",
        html_table(("figure", "fine-tuned", "baseline"), headline_rows(figures)),
    ]
    definitions = _definitions(figures)
    if definitions:
        parts.append("<dl>" + "".join(f"<dt>{html.escape(n)}</dt><dd>{html.escape(t)}</dd>"
                                      for n, t in definitions) + "</dl>")
    bench = figures.get("benchmark")
    if bench:
        parts += ["<h2>Standard test set</h2>", f"<p>{html.escape(_benchmark_caption(bench))}</p>",
                  html_table(("figure", "fine-tuned", "base", "delta", "VoxCPM2"), benchmark_rows(bench))]
    if criteria:
        parts += ["<h2>Promotion rule</h2>", html_table(("criterion", "result", "detail"), criteria)]
    if figures.get("gains"):
        parts += ["<h2>Paired gains (candidate - baseline, 95% interval)</h2>",
                  f"<p>{html.escape(str(figures.get('tolerance_source', '')))}</p>",
                  html_table(("figure", "gain [low, high]"),
                             [(name, str(g.get("shown"))) for name, g in figures["gains"].items()])]
    for png in sorted(folder.glob("*.png")):
        parts += [f"<h2>{html.escape(png.stem)}</h2>",
                  f"<img class='plot' alt='{html.escape(png.name)}' src='{data_uri(png, 'image/png')}'>"]
    samples = sorted((folder / "samples").glob("*.wav"))
    parts.append(f"<h2>Samples ({len(samples)})</h2>")
    for wav in samples:
        text = next((t for name, t in texts.items() if wav.stem.endswith(name)), "")  # <tag>-<name>.wav
        caption = html.escape(f"{wav.stem}: {text}".rstrip(": "))
        parts.append(f"<figure><figcaption>{caption}</figcaption>"
                     f"<audio controls preload='none' src='{data_uri(wav, 'audio/wav')}'></audio></figure>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"

"""The MLflow run's description (`mlflow.note.content`, shown at the top of the run page): the verdict in
its first line, then the rule's reasons and the headline figures of the pipeline run, so a run list
reads without opening every run's metrics."""

from __future__ import annotations

from typing import Any

from voxpipe.evaluate.pages import headline_rows
from voxpipe.track.artifacts import PipelineArtifacts
from voxpipe.track.headline import verdict_line

NOTE_TAG = "mlflow.note.content"


def _num(value: Any, spec: str) -> str:
    return f"{value:{spec}}" if isinstance(value, int | float) and not isinstance(value, bool) else "n/a"


def run_note(art: PipelineArtifacts) -> str:
    """Markdown: evaluation verdict and figures, training, MFU and data, from the files register read."""
    r, m = art.train_report, art.mfu
    lines = [f"**Evaluation: {verdict_line(art.eval)}.**", ""]
    if art.eval.get("verdict"):
        lines += [str(art.eval["verdict"]), ""]
    lines += [f"- {label}: {model} (baseline {base})" for label, model, base in headline_rows(art.eval)]
    final = (r.get("final") or {}).get("loss")
    mode = "LoRA" if r.get("lora") else "full fine-tune"
    lines += [
        f"- training: {r.get('steps', 'n/a')} steps, {mode}, {r.get('world_size', '?')} x "
        f"{r.get('device_name', '?')} ({r.get('dtype', '?')}), final loss {_num(final, '.4f')}, "
        f"{_num(r.get('tokens_per_s'), '.0f')} tokens/s",
        f"- MFU: {_num(100 * m['mfu'], '.2f')} % ({m.get('peak_source')})" if m.get("mfu") is not None else
        f"- MFU: n/a ({m.get('mfu_null_reason') or 'no mfu.json figure'})",
    ]
    if art.data is not None:
        d = art.data.report
        lines.append(f"- data: {d.get('rows_kept', 'n/a')} rows, {_num(d.get('hours_kept'), '.2f')} h, "
                     f"version {art.data.version}")
    return "\n".join(lines) + "\n"

"""The model card and the dataset card of a registered version, written from the run's own files.

A voice is shipped only when someone can say what the model is: its base (and the base weights' sha256),
the weights it carries, the data and the consent it was trained under, its figures with their intervals,
the checkpoint evaluate chose and why, how to run it, how its clips are marked, and what it is for. Both
cards are Hugging Face cards (a README.md: YAML front matter, then markdown sections), so the Hub and
any card tool read them; every fact comes from a file of the run (the ingest report, eval.json, the train
report, the base folder) or a tag of the version, and a fact the run did not record says "none recorded"
with the reason, never a guess. `check_card` refuses a card that lacks a required section or whose front
matter is not valid YAML with the required keys: register checks both cards before it logs them.
"""

from __future__ import annotations

import math
import re
import tempfile
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from voxpipe.errors import StepError
from voxpipe.files import file_digest
from voxpipe.params import Params
from voxpipe.track.artifacts import PipelineArtifacts

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from voxpipe.track.registry import Registration

MODEL_CARD, DATA_CARD = "README.md", "DATASET_CARD.md"  # the model card is the model folder's README
CARDS_DIR = "cards"  # where both lie: in the registered model's files, the run's artifacts and register.out
CONSENT_TAG, WATERMARK_TAG, SIGNER_TAG = "voxpipe.consent_ids", "voxpipe.watermark", "voxpipe.c2pa_signer"
MODEL_SECTIONS = ("Summary", "Base model", "Weights", "Training data and consent", "Evaluation",
                  "Chosen checkpoint", "Recommended inference settings", "Marks", "Intended use",
                  "Limitations")
DATA_SECTIONS = ("Summary", "Size", "Speakers", "Locales", "Quarantine", "Licences", "Consent")
MODEL_KEYS = ("license", "language", "base_model", "tags", "pipeline_tag")
DATA_KEYS = ("license", "language", "task_categories", "tags")
UPSTREAM = "openbmb/VoxCPM2"  # the Hub id of the base when model.base is its download
NONE = "none recorded"


def _num(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return "—" if value is None else str(value)
    return f"{value:.{digits}g}"


def _front(meta: dict[str, Any]) -> str:
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _locales(rows: list[dict[str, Any]]) -> Counter:
    return Counter(str(r["locale"]) for r in rows if r.get("locale"))


def _languages(locales: Counter) -> list[str]:
    """ISO 639-1 codes, as the Hub's `language` field wants them: en-US -> en."""
    return sorted({loc.split("-")[0].lower() for loc in locales})


def _licences(art: PipelineArtifacts) -> list[str]:
    """The licences the data records: ingest report's `licences` (a list, or {voice: licence}), else the
    rows' `licence` column; [] when none is recorded."""
    if art.data is None:
        return []
    found = art.data.report.get("licences")
    if isinstance(found, dict):
        return sorted({str(v) for v in found.values() if v})
    if isinstance(found, list):
        return sorted({str(v) for v in found if v})
    return sorted({str(r["licence"]) for r in art.data.rows if r.get("licence")})


def _hub_licence(licences: list[str]) -> tuple[str, str | None]:
    """(license, license_name) for the front matter: the one licence recorded, else `other` named."""
    if len(licences) == 1 and re.fullmatch(r"[a-z0-9.\-]+", licences[0].lower()):
        return licences[0].lower(), None
    return "other", "see-dataset-card" if licences else "unrecorded"


def consent_ids(tags: dict[str, str]) -> list[tuple[str, str]]:
    """(consent id, scopes) from the version's `voxpipe.consent_ids` tag: `id[:scope+scope],...`."""
    out = []
    for item in (tags.get(CONSENT_TAG) or "").replace(";", ",").split(","):
        if item.strip():
            cid, _, scopes = item.strip().partition(":")
            out.append((cid, scopes.replace("+", ", ") or "scope not recorded"))
    return out


def _consent_section(tags: dict[str, str], art: PipelineArtifacts) -> str:
    consent = art.data.report.get("consent") if art.data is not None else None
    recorded = {r.get("id"): r.get("scope") for r in (consent or {}).get("records") or []
                if isinstance(r, dict)}  # ingest's report: each record's scopes
    ids = [(cid, ", ".join(recorded[cid]) if scopes == "scope not recorded" and recorded.get(cid) else scopes)
           for cid, scopes in consent_ids(tags)]
    if ids:
        return _table(("consent id", "scopes"), ids)
    if isinstance(consent, dict) and consent.get("reason"):
        return f"Consent was not required for this data: {consent['reason']}."
    return (f"{NONE}: the version carries no `{CONSENT_TAG}` tag and the ingest report no consent check, "
            "so nothing here says the speakers agreed. Do not ship this voice until they have.")


def base_identity(params: Params, art: PipelineArtifacts) -> dict[str, Any]:
    """The base folder, its Hub id when it is upstream's download, and the sha256 of its weights file
    (None with the reason when the folder is not here: register ran where the base was not pulled)."""
    from voxpipe.model.io import MODEL_FILES  # here: model.io imports torch, which `make sweep` does not need

    recorded = art.train_report.get("params") or {}
    base = Path(str(recorded.get("model.base") or params.model.base))
    weights = next((base / n for n in MODEL_FILES if (base / n).is_file()), None)
    hub = UPSTREAM if base.name.lower() == UPSTREAM.split("/")[1].lower() else None
    return {"path": str(base), "hub_id": hub, "weights": weights.name if weights else None,
            "sha256": file_digest(weights) if weights else None,
            "why_none": None if weights else f"no {' or '.join(MODEL_FILES)} in {base} where register ran"}


def _interval(evaluation: dict[str, Any], name: str, candidate: Any) -> str:
    """The candidate's interval for one gate criterion, where evaluate recorded one: a speaker's similarity
    CI (`scores.model.similarity`), the loss's seed spread, or a criterion's own {ci_low, ci_high}."""
    model = (evaluation.get("scores") or {}).get("model") or {}
    found = candidate if isinstance(candidate, dict) else None
    if speaker := re.fullmatch(r"similarity\[(.+)\]", name):
        found = (model.get("similarity") or {}).get(speaker.group(1))
    if name == "loss" and isinstance(model.get("loss_std"), int | float):
        return f"± {_num(model['loss_std'])} (seed spread)"
    if isinstance(found, dict) and found.get("ci_low") is not None and found.get("ci_high") is not None:
        return f"[{_num(found['ci_low'])}, {_num(found['ci_high'])}]"
    return "—"


def _gate_rows(evaluation: dict[str, Any]) -> list[tuple[str, ...]]:
    """criterion, result, interval, the rule's sentence with its numbers (eval.json `promotion`)."""
    return [(str(c.get("name")), "pass" if c.get("passed") else "FAIL",
             _interval(evaluation, str(c.get("name")), c.get("candidate")), str(c.get("detail") or ""))
            for c in (evaluation.get("promotion") or {}).get("criteria") or []]


def _gain_rows(evaluation: dict[str, Any]) -> list[tuple[str, ...]]:
    """Paired gains over the base: `gains` ({figure: {gain, low, high}}), or flat `<figure>_gain[_low|_high]`
    figures."""
    rows = []
    gains = evaluation.get("gains")
    if isinstance(gains, dict):
        for fig, g in sorted(gains.items()):
            if isinstance(g, dict):
                point = g.get("gain", g.get("mean"))
                low, high = g.get("low", g.get("ci_low")), g.get("high", g.get("ci_high"))
                rows.append((fig, _num(point), "—" if low is None else f"[{_num(low)}, {_num(high)}]"))
    for key in sorted(k for k in evaluation if k.endswith("_gain")):
        low, high = evaluation.get(f"{key}_low"), evaluation.get(f"{key}_high")
        rows.append((key.removesuffix("_gain"), _num(evaluation[key]),
                     "—" if low is None else f"[{_num(low)}, {_num(high)}]"))
    return rows


def _settings(params: Params, evaluation: dict[str, Any]) -> dict[str, Any]:
    used = evaluation.get("settings") if isinstance(evaluation.get("settings"), dict) else {}
    return {k: used.get(k, getattr(params.evaluate, k)) for k in ("cfg_value", "inference_timesteps")}


def summary(name: str, art: PipelineArtifacts, lora: bool) -> str:
    """One paragraph: what the model is (also the model version's description)."""
    chosen = art.eval.get("chosen") or {}
    step = chosen.get("step")
    hours = art.data.report.get("hours_kept") if art.data is not None else None
    speakers = len(art.data.report.get("speakers") or {}) if art.data is not None else None
    data = (f"{_num(hours, 3)} h of speech from {speakers} speaker(s)" if hours is not None
            else "data not recorded (register.ingest unset)")
    return (f"{name}: VoxCPM2 fine-tuned ({'LoRA adapter' if lora else 'full weights'}) on {data}; "
            f"checkpoint {'step ' + str(step) if step is not None else 'the only export'}. "
            f"Verdict: {str(art.eval.get('verdict') or NONE).split(':')[0]} (the model card's Evaluation).")


def model_card(name: str, params: Params, art: PipelineArtifacts, tags: dict[str, str]) -> str:
    lora = bool(art.train_report.get("lora"))
    base = base_identity(params, art)
    locales = _locales(art.data.rows) if art.data is not None else Counter()
    licence, licence_name = _hub_licence(_licences(art))
    meta: dict[str, Any] = {"license": licence, **({"license_name": licence_name} if licence_name else {}),
                            "language": _languages(locales) or ["en"],
                            "base_model": base["hub_id"] or base["path"],
                            "tags": ["text-to-speech", "voxcpm2", "voice-clone",
                                     "lora" if lora else "full-finetune", "voxpipe"],
                            "pipeline_tag": "text-to-speech"}
    chosen = art.eval.get("chosen") or {}
    settings = _settings(params, art.eval)
    gains = _gain_rows(art.eval)
    watermark, signer = tags.get(WATERMARK_TAG), tags.get(SIGNER_TAG)
    sha = base["sha256"] or f"{NONE} ({base['why_none']})"
    rank = ((art.train_report.get("params") or {}).get("lora") or {}).get("r", "not recorded")
    parts = [
        _front(meta), f"# {name}\n",
        "## Summary\n", summary(name, art, lora) + "\n",
        "## Base model\n", f"- base: `{base['path']}`" + (f" ({base['hub_id']})" if base["hub_id"] else ""),
        f"- weights file: {base['weights'] or NONE}; sha256: `{sha}`\n",
        "## Weights\n",
        (f"A LoRA adapter (`lora/`, rank {rank}) and the weights merged with the base, in the export folder"
         if lora else "The full fine-tuned weights (every parameter trained), in the export folder")
        + f" (DVC md5 `{art.export_md5}`).\n",
        "## Training data and consent\n",
        f"The data is described in its dataset card, [{DATA_CARD}]({DATA_CARD}) (data version "
        f"`{art.data.version if art.data is not None else NONE}`).\n",
        _consent_section(tags, art) + "\n",
        "## Evaluation\n",
        "The promotion gate, as evaluate judged this checkpoint against the base (interval: the candidate's "
        "confidence interval where evaluate recorded one):\n",
        _table(("criterion", "result", "interval", "figures"), _gate_rows(art.eval)),
        "",
        "Paired gains over the base, with intervals:\n\n" + _table(("figure", "gain", "interval"), gains)
        if gains else "Paired gains: none recorded in eval.json (point figures only, above).",
        "",
        "## Chosen checkpoint\n",
        f"- step: {chosen.get('step', NONE)}; kind: {'LoRA' if lora else 'full'}",
        f"- why: {chosen.get('why') or NONE}",
        f"- verdict: {art.eval.get('verdict') or NONE}\n",
        "## Recommended inference settings\n",
        f"- `cfg_value`: {settings['cfg_value']}",
        f"- `inference_timesteps`: {settings['inference_timesteps']}",
        "(the settings evaluate scored this checkpoint with)\n",
        "## Marks\n",
        f"- watermark: {watermark or 'not marked (the version carries no ' + WATERMARK_TAG + ' tag)'}",
        f"- C2PA signer: {signer or 'not signed (the version carries no ' + SIGNER_TAG + ' tag)'}\n",
        "## Intended use\n",
        "Speech synthesis in the voice(s) of the dataset card, by their speakers' consent and within its "
        "scopes; served through `voxpipe serve` or `voxpipe synthesize`. Clips it makes are synthetic and "
        "are to be presented as such.\n",
        "## Limitations\n",
        "- Not for impersonation, fraud, or any voice whose speaker did not consent; a revoked consent "
        "(`voxpipe consent revoke`) withdraws this version.",
        f"- Trained and scored in {', '.join(sorted(locales)) or 'the locale(s) of the data'} only; other "
        "languages and styles are untested.",
        "- The figures come from a small held-out set: read the intervals, not only the points.",
        "- A watermark can be removed by a determined attacker; its absence does not prove a clip is real.\n",
    ]
    return "\n".join(parts)


def _size_category(rows: int) -> str:
    for bound, label in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
                         (1_000_000, "100K<n<1M")):
        if rows < bound:
            return label
    return "n>1M"


def data_card(name: str, art: PipelineArtifacts, tags: dict[str, str]) -> str:
    report = art.data.report if art.data is not None else {}
    rows = art.data.rows if art.data is not None else []
    locales = _locales(rows)
    licences = _licences(art)
    licence, licence_name = _hub_licence(licences)
    meta: dict[str, Any] = {"license": licence, **({"license_name": licence_name} if licence_name else {}),
                            "language": _languages(locales) or ["en"], "task_categories": ["text-to-speech"],
                            "size_categories": [_size_category(int(report.get("rows_kept") or 0))],
                            "pretty_name": f"{name} training data", "tags": ["speech", "voxpipe"]}
    speakers = report.get("speakers") or {}
    reasons = {k: v for k, v in (report.get("reasons") or {}).items() if v}
    absent = "" if art.data is not None else " (register.ingest unset: no ingest report)"
    parts = [
        _front(meta), f"# {name} training data\n",
        "## Summary\n",
        f"The rows ingest kept for training {name}; data version (DVC md5 of the ingest folder) "
        f"`{art.data.version if art.data is not None else NONE}`.{absent}\n",
        "## Size\n",
        f"- hours kept: {_num(report.get('hours_kept'), 4) if 'hours_kept' in report else NONE}",
        f"- rows: {report.get('rows_in', NONE)} in, {report.get('rows_kept', NONE)} kept, "
        f"{report.get('rows_quarantined', NONE)} quarantined\n",
        "## Speakers\n",
        _table(("speaker", "clips"), [(str(k), str(v)) for k, v in speakers.items()]) if speakers else NONE,
        "",
        "## Locales\n",
        _table(("locale", "rows"), [(k, str(v)) for k, v in sorted(locales.items())]) if locales else
        f"{NONE} (ingested before ingest recorded locales)", "",
        "## Quarantine\n",
        _table(("reason", "rows"), [(k, str(v)) for k, v in reasons.items()]) if reasons else
        "No row was quarantined.", "",
        "## Licences\n",
        ", ".join(licences) if licences else f"{NONE}: neither the ingest report nor the rows name one.",
        "",
        "## Consent\n",
        _consent_section(tags, art) + "\n",
    ]
    return "\n".join(parts)


def check_card(text: str, sections: tuple[str, ...], keys: tuple[str, ...], what: str) -> None:
    """StepError naming what is missing: the YAML front matter, one of its `keys`, or a `## section`."""
    match = re.match(r"---\n(.*?)\n---\n", text, re.DOTALL)
    try:
        meta = yaml.safe_load(match.group(1)) if match else None
    except yaml.YAMLError as e:
        raise StepError(f"{what}: its front matter is not valid YAML ({str(e)[:80]})") from None
    if not isinstance(meta, dict):
        raise StepError(f"{what}: no YAML front matter (`---` block) at its top; a Hugging Face card has one")
    if missing := [k for k in keys if not meta.get(k)]:
        raise StepError(f"{what}: its front matter lacks {', '.join(missing)}")
    headings = set(re.findall(r"^## +(.+?) *$", text, re.MULTILINE))
    if missing := [s for s in sections if s not in headings]:
        raise StepError(f"{what}: no section {', '.join(repr(s) for s in missing)}; a card names every one "
                        f"of {', '.join(sections)}")


def write_cards(
    folder: Path, name: str, params: Params, art: PipelineArtifacts, tags: dict[str, str]
) -> Path:
    """Both cards into `folder`, checked first; returns `folder`."""
    model, data = model_card(name, params, art, tags), data_card(name, art, tags)
    check_card(model, MODEL_SECTIONS, MODEL_KEYS, f"the model card of {name}")
    check_card(data, DATA_SECTIONS, DATA_KEYS, f"the dataset card of {name}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MODEL_CARD).write_text(model, encoding="utf-8")
    (folder / DATA_CARD).write_text(data, encoding="utf-8")
    return folder


def publish_cards(
    client: MlflowClient, params: Params, art: PipelineArtifacts, out: Path, run_id: str,
    reg: Registration | None, name: str, extra_tags: dict[str, str],
) -> dict[str, Path]:
    """Both cards from the run and the version's tags (the consent ids, the marks), written to
    `out/cards`, logged as the run's `cards/` artifacts and, for a model version, into the registered
    model's files (the model card as its README.md) with the model card's summary as the version's
    description. A sweep's child (`reg` None) gets the run's copies only."""
    tags = dict(extra_tags)
    if reg is not None:
        tags.update(client.get_model_version(reg.name, reg.version).tags)
    folder = write_cards(out / CARDS_DIR, name, params, art, tags)
    client.log_artifacts(run_id, str(folder), CARDS_DIR)
    if reg is not None:
        model_id = _model_id(client, reg)
        if model_id is not None:
            client.log_model_artifacts(model_id, str(folder))
        description = card_summary((folder / MODEL_CARD).read_text(encoding="utf-8"))
        client.update_model_version(reg.name, reg.version, description=description)
    return {"model": folder / MODEL_CARD, "data": folder / DATA_CARD}


def _model_id(client: MlflowClient, reg: Registration) -> str | None:
    """The logged model a version was made from (MLflow 3's `models:/<model id>` source)."""
    version = client.get_model_version(reg.name, reg.version)
    return getattr(version, "model_id", None) or (
        version.source.removeprefix("models:/") if version.source.startswith("models:/m-") else None)


def card_summary(card: str) -> str:
    """The model card's Summary paragraph (what the version's description says)."""
    match = re.search(r"^## Summary\n+(.+?)\n", card, re.MULTILINE)
    return match.group(1) if match else ""


def carry_cards(client: MlflowClient, uri: str, run_id: str, reg: Registration, model_id: str) -> None:
    """A sweep's best child's cards (its run's `cards/`, which its register wrote) into the version
    `sweep-close` made of it: the registered model's files and the version's description, as register
    does."""
    import mlflow

    if not client.list_artifacts(run_id, CARDS_DIR):  # the child's register predates the cards
        return
    with tempfile.TemporaryDirectory(prefix="voxpipe-cards-") as tmp:
        folder = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=CARDS_DIR,
                                                          dst_path=tmp, tracking_uri=uri))
        client.log_model_artifacts(model_id, str(folder))
        description = card_summary((folder / MODEL_CARD).read_text(encoding="utf-8"))
    client.update_model_version(reg.name, reg.version, description=description)

"""The model card and dataset card `register` writes (voxpipe/track/cards.py), from a real register run:
the shipped sample through the real `ingest`, a real tiny export and base from `init-model`, the train
report and eval.json in their steps' formats (test_track.py's writers), the embedded sqlite MLflow store."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import mlflow
import pytest
import yaml
from mlflow import MlflowClient
from test_track import write_eval, write_mfu, write_training

from voxpipe.data.ingest_step import ingest
from voxpipe.errors import StepError
from voxpipe.files import file_digest
from voxpipe.params import Params
from voxpipe.steps.ingest import IngestParams
from voxpipe.steps.model import ModelParams
from voxpipe.track.artifacts import load_artifacts
from voxpipe.track.cards import (
    DATA_KEYS,
    DATA_SECTIONS,
    MODEL_KEYS,
    MODEL_SECTIONS,
    check_card,
    model_card,
)
from voxpipe.track.register import register
from voxpipe.track.tracking import session
from voxpipe.train.init_model import init_model

ROOT = Path(__file__).resolve().parents[1]
NAME = "voxpipe-cards"
GAINS = {"similarity_gain": 0.04, "similarity_gain_low": 0.01, "similarity_gain_high": 0.07}


@pytest.fixture(scope="module")
def carded(tmp_path_factory):
    """One real register run (sqlite store); its params, registered.json and the cards it wrote."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.delenv("MLFLOW_RUN_ID", raising=False)
        root = tmp_path_factory.mktemp("cards")
        ingest(IngestParams(input=[str(ROOT / "data" / "sample")], out=str(root / "ingest"), workers=1,
                            score_quality=False))
        init_model(ModelParams(preset="tiny", seed=5, out=str(root / "base")))
        init_model(ModelParams(preset="tiny", seed=0, out=str(root / "export")))
        write_training(root / "train", 1e-4, [2.0, 1.9, 1.8])
        eval_path = write_eval(root / "eval", 1.9, 2.0)
        evaluation = json.loads(eval_path.read_text())
        eval_path.write_text(json.dumps({**evaluation, **GAINS,
                                         "settings": {"cfg_value": 1.5, "inference_timesteps": 8}}))
        params = Params.model_validate({
            "model": {"base": str(root / "base")},
            "register": {"model": str(root / "export"), "train": str(root / "train"), "eval": str(eval_path),
                         "mfu": str(write_mfu(root / "mfu", 0.01)), "ingest": str(root / "ingest"),
                         "out": str(root / "register"), "model_name": NAME},
            "tracking": {"work": str(root / "work")}})
        result = register(params)
        yield root, params, result.registered


def front_matter(text: str) -> dict:
    return yaml.safe_load(re.match(r"---\n(.*?)\n---\n", text, re.DOTALL).group(1))


def test_register_writes_both_cards_with_every_section(carded):
    root, _, reg = carded
    model = Path(reg["cards"]["model"]).read_text()
    data = Path(reg["cards"]["data"]).read_text()
    check_card(model, MODEL_SECTIONS, MODEL_KEYS, "model card")  # raises on a missing part
    check_card(data, DATA_SECTIONS, DATA_KEYS, "dataset card")
    meta = front_matter(model)
    assert meta["pipeline_tag"] == "text-to-speech" and meta["language"] == ["en"]
    assert meta["base_model"] == str(root / "base") and meta["license"] == "other"
    # the base's weights file digest, the full weights, the chosen step and why, the evaluated settings
    assert file_digest(root / "base" / "model.safetensors") in model
    assert "The full fine-tuned weights" in model
    assert "- step: 6; kind: full" in model and "- why: the lowest loss" in model
    assert "`cfg_value`: 1.5" in model and "`inference_timesteps`: 8" in model
    # the gate table, each criterion's interval where evaluate recorded one, and the paired gain's
    assert "| similarity[spk] | pass | [0.4459, 0.9541] | gain +0.100 [+0.100, +0.100]" in model
    assert "| loss | pass | ± 0.01 (seed spread) | 1.90000 vs baseline" in model
    assert "| similarity | 0.04 | [0.01, 0.07] |" in model
    # the watermark synthesize and serve mark with (synthesize.watermark); what the run did not record says so
    assert "- watermark: perth" in model and "- C2PA signer: not signed" in model
    # the sample's consent records (data/sample/voices.yaml), their scopes from ingest's report
    assert "| sample-spk_f | tts, voice_clone |" in model and "| sample-spk_m | tts, voice_clone |" in model
    report = json.loads((root / "ingest" / "report.json").read_text())
    assert f"- hours kept: {report['hours_kept']:.4g}" in data
    assert "| spk_f | 32 |" in data and "| spk_m | 32 |" in data and "| en-US | 64 |" in data
    assert "## Licences\n\nnone recorded: neither the ingest report nor the rows name one" in data


def test_the_version_carries_the_cards_and_the_summary(carded, tmp_path):
    _, _, reg = carded
    uri = reg["tracking_uri"]
    with session(uri):
        client = MlflowClient(uri)
        version = client.get_model_version(NAME, reg["version"])
        run_files = {f.path for f in client.list_artifacts(reg["run_id"], "cards")}
        model_uri = f"models:/{NAME}/{reg['version']}"
        files = Path(mlflow.artifacts.download_artifacts(model_uri, dst_path=tmp_path))
    model = Path(reg["cards"]["model"]).read_text()
    assert version.description and version.description in model  # the card's summary
    assert version.description.startswith(f"{NAME}: VoxCPM2 fine-tuned (full weights) on 0.0607 h of speech "
                                          "from 2 speaker(s); checkpoint step 6. Verdict: promoted over the "
                                          "baseline (the model card's Evaluation).")
    assert run_files == {"cards/README.md", "cards/DATASET_CARD.md"}
    assert (files / "README.md").read_text() == model and (files / "DATASET_CARD.md").is_file()
    assert (files / "MLmodel").is_file()  # the model card sits beside the model it describes


def test_consent_and_marks_from_the_version_tags(carded):
    _, params, _ = carded
    art = load_artifacts(params.register_)
    tags = {"voxpipe.consent_ids": "c-001:tts+voice_clone,c-002:tts", "voxpipe.watermark": "perth",
            "voxpipe.c2pa_signer": "CN=voxpipe test"}
    card = model_card(NAME, params, art, tags)
    assert "| c-001 | tts, voice_clone |" in card and "| c-002 | tts |" in card
    assert "- watermark: perth" in card and "- C2PA signer: CN=voxpipe test" in card


@pytest.mark.parametrize("break_it, says", [
    (lambda t: t.replace("## Limitations\n", ""), "no section 'Limitations'"),
    (lambda t: t.replace("pipeline_tag: text-to-speech\n", ""), "front matter lacks pipeline_tag"),
    (lambda t: t.split("---\n", 2)[2], "no YAML front matter"),
    (lambda t: t.replace("license: other", "license: [other", 1), "front matter is not valid YAML"),
])
def test_a_card_missing_a_required_part_fails_the_check(carded, break_it, says):
    _, _, reg = carded
    card = Path(reg["cards"]["model"]).read_text()
    with pytest.raises(StepError, match=re.escape(says)):
        check_card(break_it(card), MODEL_SECTIONS, MODEL_KEYS, "model card")


def test_a_lora_run_and_a_base_not_at_hand(carded, tmp_path):
    """The adapter and its rank from the train report; a base folder absent where register ran: its sha256
    is `none recorded` with the reason, and the card still passes the check."""
    _, params, _ = carded
    art = load_artifacts(params.register_)
    lora = replace(art, train_report={**art.train_report, "lora": True, "params": {"lora": {"r": 16}}})
    elsewhere = params.model_copy(update={"model": params.model.model_copy(update={"base": str(tmp_path)})})
    card = model_card(NAME, elsewhere, lora, {})
    check_card(card, MODEL_SECTIONS, MODEL_KEYS, "model card")
    assert "A LoRA adapter (`lora/`, rank 16)" in card and "- step: 6; kind: LoRA" in card
    assert f"sha256: `none recorded (no model.safetensors or pytorch_model.bin in {tmp_path} " in card
    assert "lora" in front_matter(card)["tags"]

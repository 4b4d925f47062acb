"""MLflow tracking, registry and compare against a real `mlflow server` process (sqlite backend, local
artifact root) and against the embedded sqlite default.

The data is the shipped sample through the real `ingest`; the exports are real tiny checkpoints from
`init-model`; the training report, metrics.jsonl, eval.json and mfu.json are written here in the
trainer's / evaluate's / mfu's formats (running those steps would cost minutes). The live-tracking
tests (`train.track`) train for real: the tiny model, a few steps, one process.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import soundfile as sf
from mlflow import MlflowClient
from test_ui import CHECK, needs_chromium, page_check, scrolled_text

from voxpipe.cli import main
from voxpipe.data.ingest_step import ingest
from voxpipe.errors import StepError
from voxpipe.evaluate.gains import flat_gains
from voxpipe.evaluate.promotion import Scores, decide, mean_ci
from voxpipe.lineage import dvc_md5
from voxpipe.model.io import from_pretrained
from voxpipe.params import Params
from voxpipe.steps.compare import CompareParams
from voxpipe.steps.ingest import IngestParams
from voxpipe.steps.model import ModelParams
from voxpipe.steps.train import TrainParams
from voxpipe.track.champion import champion_export
from voxpipe.track.compare import compare
from voxpipe.track.live import LiveRun
from voxpipe.track.register import RegisterResult, register
from voxpipe.track.reglock import LOCK_TAG, register_lock
from voxpipe.track.tracking import INTERNAL_EXPERIMENT, redact_uri, resolve_tracking_uri, scrub, session
from voxpipe.train.checkpoint import latest_checkpoint
from voxpipe.train.init_model import init_model
from voxpipe.train.loop import train

ROOT = Path(__file__).resolve().parents[1]
NAME = "voxpipe-test"
SECRETS = {
    "MLFLOW_TRACKING_USERNAME": "tester",
    "MLFLOW_TRACKING_PASSWORD": "pw-Hx81-never-logged",
    "MLFLOW_TRACKING_TOKEN": "tok-Qz27-never-logged",
}


@pytest.fixture(scope="module")
def secrets_in_env():
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.delenv("MLFLOW_RUN_ID", raising=False)
        for key, value in SECRETS.items():
            mp.setenv(key, value)
        yield


def write_training(folder: Path, lr: float, val_losses: list[float], steps: int = 6) -> Path:
    """report.json + metrics.jsonl as `voxpipe train` writes them (val every 3 steps, step 0 = base)."""
    folder.mkdir(parents=True)
    val_steps = [0, *range(3, steps + 1, 3)]
    curve = [{"step": s, "val/diff": v * 0.6, "val/stop": v * 0.4, "val/loss": v}
             for s, v in zip(val_steps, val_losses, strict=True)]
    rows = []
    for step in range(1, steps + 1):
        row = {"step": step, "loss": 2.0 - 0.01 * step, "loss/diff": 1.3, "loss/stop": 0.7, "lr": lr,
               "grad_norm": 1.5, "skipped": False, "step_time_s": 0.5, "data_wait_frac": 0.01, "tokens": 480,
               "real_tokens": 450, "samples": 9, "tokens_per_s": 900.0, "samples_per_s": 18.0,
               "padding_frac": 0.06, "shapes": [[9, 53]], "flops": 5.0e9, "tflops_per_device": 0.01,
               "mfu": None}
        row.update(next((c for c in curve if c["step"] == step), {}))
        rows.append(row)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    params = TrainParams(lr=lr, max_steps=steps, device="cpu", val_every=3).model_dump()
    report = {"steps": steps, "steps_run": steps, "max_steps": steps, "tokens": 450 * steps,
              "samples": 9 * steps, "train_seconds": 0.5 * steps, "wall_seconds": 4.0, "tokens_per_s": 900.0,
              "samples_per_s": 18.0,
              "val_curve": curve, "skipped_steps": 0, "world_size": 1, "device_type": "cpu",
              "device_name": "cpu", "dtype": "float32", "lora": False, "params": params}
    (folder / "report.json").write_text(json.dumps(report))
    return folder


VAL_ROW, VAL_TEXT = "9c3ae1728393ce65", "The painter mixed yellow and blue."  # the val text evaluate spoke


def write_eval(folder: Path, loss_model: float, loss_baseline: float, similarity: float = 0.7,
               val_digest: str = "val-v1") -> Path:
    """eval.json as `evaluate` writes it: flat figures, the candidate's and baseline's scores and the
    promotion rule's verdict against the baseline (one speaker "spk", baseline similarity 0.6, std 0.01);
    the chosen export is step 6's, so its clip is `step-6-...wav`, beside the baseline's."""
    samples = folder / "samples"
    samples.mkdir(parents=True)
    t = np.arange(24000) / 48000
    for tag, hz in (("step-6", 220), ("baseline", 330)):
        tone = (0.2 * np.sin(2 * np.pi * hz * t)).astype(np.float32)
        sf.write(samples / f"{tag}-000-spk-ref.wav", tone, 48000)
    def clips(similarities: list[float]) -> dict:
        return {f"00{i}-spk-{ref}": {"speaker": "spk", "with_reference": ref == "ref", "similarity": s,
                                     "stop_failures": 0.0, "quality": None, "wer": None, "cer": None}
                for i, (ref, s) in enumerate(zip(("ref", "noref"), similarities, strict=True))}

    model = Scores(loss_model, 0.01, {"spk": mean_ci([similarity - 0.02, similarity + 0.02])}, 0.0, [],
                   clips=clips([similarity - 0.02, similarity + 0.02]))
    base = Scores(loss_baseline, 0.01, {"spk": mean_ci([0.58, 0.62])}, 0.0, [], clips=clips([0.58, 0.62]))
    verdict = decide(model, base, None, tolerance=0.05)
    figures = {"loss_model": loss_model, "loss_baseline": loss_baseline,
               "loss_delta": loss_model - loss_baseline, "loss_seed_spread": 0.01,
               "improved": int(verdict.promoted),
               "similarity_to_speaker_mean": similarity, "similarity_to_speaker_baseline": 0.6,
               "stop_failure_rate": 0.0,
               "verdict": verdict.sentence(), "loss": {"summary": {"model": {"total": {"mean": loss_model}}}},
               "promotion": {**verdict.as_dict(), "tolerance": 0.05}, "gains": verdict.gains,
               **flat_gains(verdict.gains),
               "scores": {"model": model.as_dict(), "baseline": base.as_dict()}, "val_digest": val_digest,
               "utterances": {"model": [{"name": "000-spk-ref", "row_id": VAL_ROW, "with_reference": True,
                                         "text": VAL_TEXT}]},
               "chosen": {"path": str(folder.parent / "export"), "step": 6, "why": "the lowest loss"},
               "settings": {"generation_seed": 0}}
    (folder / "eval.json").write_text(json.dumps(figures))
    return folder / "eval.json"


def write_mfu(folder: Path, mfu: float) -> Path:
    folder.mkdir(parents=True)
    (folder / "mfu.json").write_text(json.dumps({"mfu": mfu, "tokens_per_s": 960.0, "peak_source": "test",
                                                 "device_name": "cpu", "world_size": 1}))
    (folder / "mfu.md").write_text("# MFU\n")
    return folder / "mfu.json"


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """Two pipeline runs' outputs: A (val and eval losses better than the base) and B (worse than A)."""
    root = tmp_path_factory.mktemp("pipeline")
    ingest(IngestParams(input=[str(ROOT / "data" / "sample")], out=str(root / "ingest"), workers=1,
                        score_quality=False))
    runs = {}
    for tag, seed, lr, val, loss in (("a", 0, 1e-4, [2.0, 1.9, 1.8], 1.90),
                                     ("b", 1, 3e-4, [2.0, 1.95, 1.93], 1.95)):
        init_model(ModelParams(preset="tiny", seed=seed, out=str(root / tag / "export")))
        write_training(root / tag / "train", lr, val)
        runs[tag] = {
            "model": str(root / tag / "export"), "train": str(root / tag / "train"),
            "eval": str(write_eval(root / tag / "eval", loss, 2.0)),
            "mfu": str(write_mfu(root / tag / "mfu", 0.01)),
            "ingest": str(root / "ingest"), "out": str(root / tag / "register"), "work": str(root / "work"),
        }
    return root, runs


TRACKING_KEYS = {"work": "work", "tracking_uri": "uri", "experiment": "experiment"}  # -> tracking.*


def run_register(files: dict, **settings) -> dict:
    register_keys = {**files, "model_name": NAME, **settings}
    tracking = {new: register_keys.pop(old) for old, new in TRACKING_KEYS.items() if old in register_keys}
    params = Params.model_validate({
        "register": register_keys,
        "tracking": tracking,
        "launch": {"env": {"MLFLOW_TRACKING_TOKEN": SECRETS["MLFLOW_TRACKING_TOKEN"]}},
    })
    register(params)
    return json.loads((Path(files["out"]) / "registered.json").read_text())


@pytest.fixture(scope="module")
def registered(server, pipeline, secrets_in_env):
    """A registered first (champion), then B (candidate only); the order is part of the contract."""
    _, runs = pipeline
    a = run_register(runs["a"], tracking_uri=server)
    b = run_register(runs["b"], tracking_uri=server)
    return a, b


def test_register_logs_the_run_and_promotes(registered, pipeline, server):
    a, _ = registered
    root, runs = pipeline
    client = MlflowClient(server)
    assert a["created"] and a["decision"]["promoted"]
    assert a["decision"]["compared_to"] == "baseline" and a["decision"]["compared_loss"] == 2.0
    version = client.get_model_version(NAME, a["version"])
    assert version.tags["voxpipe.decision"] == "promoted" and float(version.tags["voxpipe.eval_loss"]) == 1.90
    assert version.run_id == a["run_id"]
    assert a["locale"] == version.tags["voxpipe.locale"] == "en-US"  # the sample's rows were read in it

    run = client.get_run(a["run_id"])
    experiment = client.get_experiment(run.info.experiment_id)
    assert not client.search_runs([experiment.experiment_id], filter_string=f"tags.`{LOCK_TAG}` = '{NAME}'")
    locks = client.get_experiment_by_name(f"{experiment.name}-register-locks")  # the lock has its own
    assert client.search_runs([locks.experiment_id], filter_string=f"tags.`{LOCK_TAG}` = '{NAME}'")
    # ... which the experiments list the MLflow UI shows (its own filter, asked of the server) leaves out
    listed = client.search_experiments(filter_string=f"tags.`{next(iter(INTERNAL_EXPERIMENT))}` IS NULL")
    assert experiment.name in [e.name for e in listed] and locks.name not in [e.name for e in listed]
    assert run.info.run_name.startswith(f"{NAME} · ") and " steps · lr " in run.info.run_name  # says what
    params = run.data.params
    assert params["train.lr"] == "0.0001" and params["train.lora.r"] == "32"  # nested sections flattened
    assert params["model_config.patch_size"] and params["run.world_size"] == "1"
    data_version = dvc_md5(Path(runs["a"]["ingest"]))
    assert params["data.version"] == data_version and params["data.rows_kept"] == "64"
    (dataset_input,) = run.inputs.dataset_inputs
    assert dataset_input.dataset.digest == data_version
    assert json.loads(dataset_input.dataset.source)["uri"] == (root / "ingest").resolve().as_uri()
    assert json.loads(dataset_input.dataset.profile)["num_rows"] == 64
    assert run.data.tags["voxpipe.devices"] == "1 x cpu"

    curve = client.get_metric_history(a["run_id"], "val/loss")
    assert [(m.step, m.value) for m in sorted(curve, key=lambda m: m.step)] == [(0, 2.0), (3, 1.9), (6, 1.8)]
    assert len(client.get_metric_history(a["run_id"], "loss")) == 6
    assert run.data.metrics["eval/loss_model"] == 1.90 and run.data.metrics["mfu/mfu"] == 0.01
    folders = ("eval/samples", "plots", "train", "mfu", "data")
    artifacts = {f.path for folder in folders for f in client.list_artifacts(a["run_id"], folder)}
    expected = {"eval/samples/step-6-000-spk-ref.wav", "eval/samples/baseline-000-spk-ref.wav",
                "plots/loss_curve.png", "train/metrics.jsonl",
                "mfu/mfu.md", "data/data-report.html", "data/data-report.png"}  # the page ingest wrote
    assert expected <= artifacts
    # by the val text's id: the same name in every run (MLflow's compare view, compare.html); the chosen
    # export's clip, not the baseline's
    assert [f.path for f in client.list_artifacts(a["run_id"], "audio")] == [f"audio/{VAL_ROW}-ref.wav"]
    heard = Path(client.download_artifacts(a["run_id"], f"audio/{VAL_ROW}-ref.wav", str(root / "heard")))
    chosen = Path(runs["a"]["eval"]).parent / "samples" / "step-6-000-spk-ref.wav"
    assert heard.read_bytes() == chosen.read_bytes()


def test_register_logs_the_headline_under_short_names_and_the_verdict(registered, server):
    """The figures a person decides by, under the names the runs table and compare read; the verdict in
    the description's first line; the chosen settings (not the schema's defaults) as `set.*` tags."""
    a, b = registered
    client = MlflowClient(server)
    run = client.get_run(a["run_id"])
    assert {k: run.data.metrics[k] for k in ("val_loss", "loss_delta", "similarity", "stop_failure_rate",
                                               "mfu", "tokens_per_s")} == pytest.approx(
        {"val_loss": 1.90, "loss_delta": -0.10, "similarity": 0.7, "stop_failure_rate": 0.0, "mfu": 0.01,
         "tokens_per_s": 900.0})
    assert "wer" not in run.data.metrics  # eval.json has none: not applicable, not a made-up 0
    # the fine-tune's headline: its paired similarity gain over the base's clone, and the interval
    assert run.data.metrics["similarity_gain"] == pytest.approx(0.1)
    low, high = run.data.metrics["eval/similarity_gain_low"], run.data.metrics["eval/similarity_gain_high"]
    assert low == pytest.approx(0.1) and high == pytest.approx(0.1)
    assert run.data.tags["voxpipe.gain.similarity"] == "+0.1000 [+0.1000, +0.1000]"
    assert run.data.tags["voxpipe.gain.similarity.spk"] == "+0.1000 [+0.1000, +0.1000]"
    assert run.data.tags["voxpipe.gain.wer"].startswith("n/a (no clip has this figure")
    assert run.data.tags["voxpipe.verdict"] == "PROMOTE (against baseline)"
    assert run.data.tags["voxpipe.val_digest"] == "val-v1"
    first = run.data.tags["mlflow.note.content"].splitlines()[0]
    assert first.startswith("**Evaluation: PROMOTE (against baseline): all ") and "criteria pass" in first
    chosen = {k: v for k, v in client.get_run(b["run_id"]).data.tags.items() if k.startswith("set.")}
    assert chosen["set.train.lr"] == "0.0003" and "set.train.out" not in chosen  # a choice, not a path
    assert "set.train.seed" not in chosen and len(chosen) < 15  # the defaults are not tagged


def pipeline_runs(client: MlflowClient, experiment: str) -> list:
    """The experiment's runs but the register lock's (track/reglock.py)."""
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return [r for r in runs if LOCK_TAG not in r.data.tags]


def reference_clip(root: Path) -> Path:
    """A real recording of the sample (ingest output): the voice to clone."""
    return sorted((root / "ingest" / "audio").rglob("*.flac"))[0]


def test_champion_loads_and_synthesizes(registered, server, pipeline, monkeypatch):
    root, _ = pipeline
    with session(server):
        model = mlflow.pyfunc.load_model(f"models:/{NAME}@champion")
    assert {p.name for p in model.metadata.signature.params.params} == {
        "seed", "cfg_value", "inference_timesteps", "max_len", "normalize", "locale"}
    assert model.metadata.signature.inputs.input_names() == ["text", "reference_audio"]
    params = {"seed": 3, "max_len": 8, "inference_timesteps": 2}
    out = model.predict(pd.DataFrame({"text": ["hello there"]}), params=params)
    again = model.predict(pd.DataFrame({"text": ["hello there"]}), params=params)
    assert list(out["sample_rate"]) == [48000] and list(out["spoken_text"]) == ["hello there"]
    dollars = model.predict(pd.DataFrame({"text": ["$12.50"]}), params={**params, "max_len": 2})
    assert list(dollars["spoken_text"]) == ["twelve dollars and fifty cents"]  # as ingest reads it
    for audio, same in zip(out["audio"], again["audio"], strict=True):
        assert audio.dtype == np.float32 and audio.size > 0 and np.isfinite(audio).all()
        np.testing.assert_array_equal(audio, same)  # fixed seed: the same audio

    # voice cloning: a reference clip per row as base64 (what a remote client sends); a path only inside
    # the folder the deployment names
    clip = reference_clip(root)
    encoded = base64.b64encode(clip.read_bytes()).decode()
    for path in (str(clip), "/no/such/clip.wav"):  # the same answer whether the file exists or not
        with pytest.raises(Exception, match=r"not base64 audio; .*REFERENCE_DIR, and it names none\)$"):
            model.predict(pd.DataFrame({"text": ["hi"], "reference_audio": [path]}), params=params)
    monkeypatch.setenv("VOXPIPE_REFERENCE_DIR", str(clip.parent))
    with session(server):
        confined = mlflow.pyfunc.load_model(f"models:/{NAME}@champion")
    by_bytes = model.predict(pd.DataFrame({"text": ["hello there"], "reference_audio": [encoded]}),
                             params=params)["audio"][0]
    by_path = confined.predict(pd.DataFrame({"text": ["hello there"], "reference_audio": [clip.name]}),
                               params=params)["audio"][0]
    np.testing.assert_array_equal(by_path, by_bytes)  # the same clip, the same seed: the same audio
    own_voice = out["audio"][0]
    assert own_voice.size != by_path.size or not np.array_equal(own_voice, by_path)  # the reference counts
    with pytest.raises(Exception, match="this one is outside it"):
        confined.predict(pd.DataFrame({"text": ["hi"], "reference_audio": ["../../../etc/passwd"]}),
                         params=params)


def test_synthesize_with_a_reference_clip(registered, server, pipeline, tmp_path, capsys):
    """`voxpipe synthesize` from the registry writes playable audio; the same seed gives the same audio; the
    export folder itself says exactly what the registered champion says."""
    root, runs = pipeline
    clip = reference_clip(root)
    common = ["--text", "hello there", "--reference", str(clip), "--max-len", "8",
              "--inference-timesteps", "2", "--device", "cpu", "--tracking-uri", server]
    outs = [tmp_path / "a.wav", tmp_path / "b.wav", tmp_path / "folder.wav"]
    for out in outs[:2]:
        assert main(["synthesize", "--model", f"models:/{NAME}@champion", "--out", str(out), *common]) == 0
    assert main(["synthesize", "--model", runs["a"]["model"], "--out", str(outs[2]), *common]) == 0
    assert f"in the voice of {clip}" in capsys.readouterr().out
    info = sf.info(str(outs[0]))
    assert (info.samplerate, info.channels, info.subtype) == (48000, 1, "PCM_16") and info.frames > 0
    assert outs[0].read_bytes() == outs[1].read_bytes() == outs[2].read_bytes()
    assert main(["synthesize", "--model", runs["a"]["model"], "--out", str(tmp_path / "x.wav"),
                 *common[:2], "--reference", str(tmp_path / "missing.wav")]) == 1
    assert "synthesize.reference" in capsys.readouterr().err and not (tmp_path / "x.wav").exists()


def test_synthesize_takes_an_alias_or_a_version_and_without_a_champion_says_which_exist(
        registered, server, tmp_path, capsys):
    """`--model @candidate` and `--model N` name versions of register.model_name; with no @champion the
    error lists the versions and their aliases and the flags that choose one (not MLflow's bare message)."""
    a, b = registered
    common = ["--text", "hi", "--max-len", "4", "--inference-timesteps", "2", "--device", "cpu",
              "--tracking-uri", server, "--set", f"register.model_name={NAME}"]
    assert main(["synthesize", "--model", "@candidate", "--out", str(tmp_path / "c.wav"), *common]) == 0
    assert f"models:/{NAME}/{b['version']} (models:/{NAME}@candidate)" in capsys.readouterr().out  # pinned
    assert main(["synthesize", "--model", str(b["version"]), "--out", str(tmp_path / "v.wav"), *common]) == 0
    assert (tmp_path / "c.wav").read_bytes() == (tmp_path / "v.wav").read_bytes()  # @candidate is b
    client = MlflowClient(server)
    client.delete_registered_model_alias(NAME, "champion")
    try:
        assert main(["synthesize", "--model", f"models:/{NAME}@champion", "--out", str(tmp_path / "x.wav"),
                     *common]) == 1
        err = capsys.readouterr().err
        assert f"'{NAME}' has no @champion" in err and "promotion rule" in err
        assert f"{b['version']} (@candidate)" in err and "--model @candidate" in err and "--model N" in err
        assert "Traceback" not in err and not (tmp_path / "x.wav").exists()
        assert main(["synthesize", "--model", "99", "--out", str(tmp_path / "x.wav"), *common]) == 1
        assert f"'{NAME}' has no version 99" in capsys.readouterr().err
    finally:
        client.set_registered_model_alias(NAME, "champion", a["version"])


def test_promote_moves_champion_by_hand_and_records_who_when_why(registered, server, capsys):
    a, b = registered
    client = MlflowClient(server)
    common = ["--tracking-uri", server, "--set", f"register.model_name={NAME}"]
    try:
        assert main(["promote", "--version", str(b["version"]), "--reason", "sounds closer by ear",
                     *common]) == 0
        out = capsys.readouterr().out
        assert f"models:/{NAME}/{b['version']} is @champion (was v{a['version']})" in out
        assert client.get_model_version_by_alias(NAME, "champion").version == b["version"]
        tags = client.get_model_version(NAME, b["version"]).tags
        assert tags["voxpipe.promoted.reason"] == "sounds closer by ear"
        assert tags["voxpipe.promoted.from"] == a["version"] and tags["voxpipe.promoted.by"]
        assert tags["voxpipe.promoted.at"].endswith("Z")
        assert main(["promote", "--version", "99", "--reason", "x", *common]) == 1
        err = capsys.readouterr().err
        assert "promote.version 99" in err and "--version N" in err and "Traceback" not in err
        assert main(["promote", "--version", str(a["version"]), *common]) == 1
        assert "promote.reason is empty" in capsys.readouterr().err
    finally:
        client.set_registered_model_alias(NAME, "champion", a["version"])


def test_the_registered_model_is_named_after_the_voice():
    from voxpipe.params import voice_model_name

    assert Params().registered_model_name() == "voxpipe-sample"  # the demo's data/sample
    assert Params.model_validate({"ingest": {"input": ["data/my-voice/"]}}).registered_model_name() == \
        "voxpipe-my-voice"
    assert Params.model_validate({"register": {"model_name": "team-voice"}}).registered_model_name() == \
        "team-voice"
    assert voice_model_name(["s3://bucket/voices/anna.parquet"]) == "voxpipe-anna"
    assert voice_model_name(["data/anna/train-*.parquet", "data/bob 2"]) == "voxpipe-anna-bob-2"


def test_worse_run_is_candidate_not_champion(registered, server):
    a, b = registered
    client = MlflowClient(server)
    assert b["created"] and not b["decision"]["promoted"] and b["version"] != a["version"]
    assert b["decision"]["compared_to"] == f"champion v{a['version']}"
    assert b["decision"]["compared_loss"] == 1.90
    assert b["aliases"] == ["candidate"]
    assert client.get_model_version_by_alias(NAME, "champion").version == a["version"]
    assert client.get_model_version_by_alias(NAME, "candidate").version == b["version"]
    assert client.get_model_version(NAME, b["version"]).tags["voxpipe.decision"] == "not promoted"
    assert b["run_id"] != a["run_id"]


def test_reregister_is_idempotent(registered, pipeline, server):
    a, b = registered
    _, runs = pipeline
    client = MlflowClient(server)
    versions = len(client.search_model_versions(f"name = '{NAME}'"))
    history = len(client.get_metric_history(a["run_id"], "loss"))
    (Path(runs["a"]["work"]) / "mlflow_run.json").unlink()  # the run is found again by its pipeline key tag
    again = run_register(runs["a"], tracking_uri=server)
    assert not again["created"] and again["logged"] == []
    assert (again["run_id"], again["version"]) == (a["run_id"], a["version"])
    assert len(client.search_model_versions(f"name = '{NAME}'")) == versions
    assert len(client.get_metric_history(a["run_id"], "loss")) == history
    assert client.get_model_version_by_alias(NAME, "candidate").version == b["version"]  # aliases untouched


def rule_run(pipeline_root: Path, root: Path, tag: str, loss: float, **eval_changes) -> dict:
    """One more pipeline run's outputs (its own export and work folder) for the registry-rule tests."""
    folder = root / tag
    init_model(ModelParams(preset="tiny", seed=len(tag), out=str(folder / "export")))
    write_training(folder / "train", 1e-4, [2.0, 1.9, 1.8])
    return {"model": str(folder / "export"), "train": str(folder / "train"),
            "eval": str(write_eval(folder / "eval", loss, 2.0, **eval_changes)),
            "mfu": str(write_mfu(folder / "mfu", 0.01)), "ingest": str(pipeline_root / "ingest"),
            "out": str(folder / "register"), "work": str(folder / "work")}


def test_register_keeps_the_voice_and_compares_like_with_like(server, pipeline, secrets_in_env, tmp_path):
    """Against a champion: a better loss with a drifted voice is not promoted, nor a loss from another val
    set; every criterion is on the version's tags, in registered.json and in the summary line."""
    root, _ = pipeline
    name = "voxpipe-rule"
    settings = {"tracking_uri": server, "experiment": name, "model_name": name}
    first = run_register(rule_run(root, tmp_path, "first", 1.90), **settings)
    assert first["decision"]["promoted"] and first["aliases"] == ["candidate", "champion"]

    drifted = run_register(rule_run(root, tmp_path, "drifted", 1.50, similarity=0.45), **settings)
    verdicts = {c["name"]: c["passed"] for c in drifted["decision"]["criteria"]}
    assert verdicts == {"loss": True, "similarity[spk]": False, "stop_failures": True, "voice_split": True,
                        "quality": True, "did_not_forget": True}  # no evaluate.benchmark: not checked
    assert not drifted["decision"]["promoted"] and drifted["aliases"] == ["candidate"]
    assert drifted["decision"]["compared_to"] == f"champion v{first['version']}"
    tags = MlflowClient(server).get_model_version(name, drifted["version"]).tags
    assert tags["voxpipe.rule.loss"].startswith("ok: 1.50000 vs champion")
    assert tags["voxpipe.rule.similarity.spk"].startswith("FAIL: gain -0.150 [-0.150, -0.150]")
    assert "(0.450 vs baseline 0.600)" in tags["voxpipe.rule.similarity.spk"]
    assert tags["voxpipe.decision"] == "not promoted"
    assert "similarity[spk] FAIL" in tags["voxpipe.decision_reason"]
    line = RegisterResult(Path(tmp_path / "drifted" / "register"), drifted).summary()
    assert "not promoted over the champion" in line and "similarity[spk] FAIL (gain -0.150" in line

    elsewhere = run_register(rule_run(root, tmp_path, "elsewhere", 1.50, val_digest="val-v2"), **settings)
    assert not elsewhere["decision"]["promoted"]
    assert "scored on val set val-v1, this candidate on val-v2" in elsewhere["decision"]["reason"]
    better = run_register(rule_run(root, tmp_path, "better", 1.50), **settings)
    assert better["decision"]["promoted"] and better["aliases"] == ["candidate", "champion"]
    assert MlflowClient(server).get_model_version_by_alias(name, "champion").version == better["version"]

    # new data: evaluate re-scored the champion on the candidate's val set, and register decides there
    champion = champion_export(Params.model_validate({"register": {"model_name": name},
                                                      "tracking": {"uri": server}}), tmp_path / "fetched")
    assert (champion.version, champion.val_digest) == (better["version"], "val-v1")
    assert from_pretrained(champion.path) is not None  # the export itself, as register logged it
    same = tmp_path / "same-val"  # scored on evaluate's val set: nothing to re-score, nothing downloaded
    params = Params.model_validate({"register": {"model_name": name}, "tracking": {"uri": server}})
    assert champion_export(params, same, val_digest="val-v1") is None and not same.exists()
    rescored = {"rescored": True, "name": name, "version": better["version"], "scored_on": "val-v1",
                "val_digest": "val-v3", "loss": 1.70, "loss_std": 0.001}
    moved = rule_run(root, tmp_path, "new-data", 1.60, val_digest="val-v3")
    eval_path = Path(moved["eval"])
    eval_path.write_text(json.dumps({**json.loads(eval_path.read_text()), "champion": rescored}))
    again = run_register(moved, **settings)
    assert again["decision"]["promoted"], again["decision"]["reason"]
    assert again["decision"]["compared_to"] == f"champion v{better['version']} (re-scored on this val set)"
    assert again["decision"]["compared_loss"] == 1.70


def test_register_lock_serialises_and_breaks_a_dead_holders_lock(tmp_path, caplog):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("e")
    events = []

    def holder():
        with register_lock(client, uri, experiment, "m", timeout_s=60):
            events.append("first in")
            time.sleep(1.0)
            events.append("first out")

    thread = threading.Thread(target=holder)
    thread.start()
    while not events:
        time.sleep(0.05)
    with caplog.at_level("INFO", logger="voxpipe"), register_lock(client, uri, experiment, "m", timeout_s=60):
        events.append("second in")
    thread.join()
    assert events == ["first in", "first out", "second in"]
    assert "waiting for the register lock of 'm', held by" in caplog.text  # every wait is logged
    (run,) = client.search_runs([experiment], filter_string=f"tags.`{LOCK_TAG}` = 'm'")
    assert {k for k in run.data.params} == {"lock.0", "free.0", "lock.1", "free.1"}
    # a register killed inside the lock leaves lock.N without free.N: broken after the lease
    client.log_param(run.info.run_id, "lock.2", "a register that died")
    with register_lock(client, uri, experiment, "m", timeout_s=60, lease_s=0.5):
        pass
    assert client.get_run(run.info.run_id).data.params["free.2"].startswith("broken by ")
    # a live holder that outlasts the timeout: the wait is bounded, with the way out
    client.log_param(run.info.run_id, "lock.4", "a slow register")
    with pytest.raises(StepError, match=r"held by a slow register and did not come free in 1 s"):
        with register_lock(client, uri, experiment, "m", timeout_s=1.0, lease_s=60):
            pass


def test_a_second_lock_run_from_a_racing_first_register_still_excludes(tmp_path):
    """Two first registers at once can each create a lock run; the one that searched first holds the lock
    in its run alone. A later register sees both runs and takes both in order, so it waits for that one."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("e")
    events, entered = [], threading.Event()

    def first():
        with register_lock(client, uri, experiment, "m", timeout_s=60):
            entered.set()
            time.sleep(1.0)
            events.append("first out")

    thread = threading.Thread(target=first)
    thread.start()
    entered.wait(30)
    # the other first register's lock run, "older" than the first (the old rule took the oldest alone)
    racer = client.create_run(experiment, start_time=1, tags={LOCK_TAG: "m"})
    with register_lock(client, uri, experiment, "m", timeout_s=60):
        events.append("second in")
    thread.join()
    assert events == ["first out", "second in"]
    assert set(client.get_run(racer.info.run_id).data.params) == {"lock.0", "free.0"}


def test_concurrent_registers_give_champion_to_the_best(server, pipeline, secrets_in_env, tmp_path):
    """Three `voxpipe register` processes at once against one server, each better than the base and each
    better than the one before by more than the seed spread: whatever order they finish in, @champion ends
    on the best, and each registered.json says only what the registry held."""
    root, _ = pipeline
    name = "voxpipe-race"
    procs, files = [], []
    for i, loss in enumerate((1.80, 1.70, 1.60)):
        run = rule_run(root, tmp_path, f"race{i}", loss)
        params = tmp_path / f"race{i}.yaml"
        params.write_text(json.dumps({
            "register": {k: v for k, v in run.items() if k != "work"} | {"model_name": name},
            "tracking": {"uri": server, "experiment": name, "work": run["work"]},
        }))
        files.append(run)
        command = [str(Path(sys.executable).with_name("voxpipe")), "register", "--params", str(params)]
        procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for proc in procs:
        output = proc.communicate(timeout=600)[0]
        assert proc.returncode == 0, output
    results = [json.loads((Path(f["out"]) / "registered.json").read_text()) for f in files]
    client = MlflowClient(server)
    assert client.get_model_version_by_alias(name, "champion").version == results[2]["version"]
    for reg in results:
        tags = client.get_model_version(name, reg["version"]).tags
        assert tags["voxpipe.decision"] == ("promoted" if reg["decision"]["promoted"] else "not promoted")
        assert ("champion" in reg["aliases"]) <= reg["decision"]["promoted"]
    locks = client.search_runs([client.get_experiment_by_name(f"{name}-register-locks").experiment_id],
                               filter_string=f"tags.`{LOCK_TAG}` = '{name}'")  # two first registers: two
    taken = [{k for k in lock.data.params if k.startswith("lock.")} for lock in locks]
    assert max(len(t) for t in taken) == 3  # one lock run every register went through
    for lock, took in zip(locks, taken, strict=True):
        assert {k.replace("lock.", "free.") for k in took} <= set(lock.data.params)  # and all released


def test_compare_lists_both_runs(registered, pipeline, server):
    a, b = registered
    root, _ = pipeline
    out = root / "compare"
    result = compare(Params(tracking={"uri": server}, compare=CompareParams(format="json", out=str(out))))
    rows = json.loads((out / "compare.json").read_text())
    assert [r["id"] for r in rows] == [a["run_id"][:8], b["run_id"][:8]]  # by verdict, then by loss
    assert "train.lr" in rows[0] and "model.seed" not in rows[0]  # only the settings that differ
    assert [r["val_loss"] for r in rows] == [1.9, 1.95] and [r["similarity"] for r in rows] == [0.7, 0.7]
    assert rows[0]["loss_delta"] == pytest.approx(-0.1) and rows[0]["mfu"] == 0.01
    assert [r["verdict"] for r in rows] == ["PROMOTE (against baseline)"] * 2
    assert rows[0]["val_set"] == "val-v1"
    assert (out / "val_curves.png").stat().st_size > 1000
    markdown = CompareParams(format="markdown", out=str(out))
    table = compare(Params(tracking={"uri": server}, compare=markdown)).text
    assert table.count("\n") == 4 and "| run | id | train.lr |" in table
    assert len(result.rows) == 2


@needs_chromium
def test_compare_reads_as_a_table_and_plays_the_same_sentence_from_each_run(registered, pipeline, server):
    """The issue's check on real registered runs (two learning rates): a table of at most 20 columns with
    train.lr, no path- or id-like setting, the loss and similarity figures; compare.html with one player
    per run for the same sentence, each of which decodes in Chromium."""
    root, _ = pipeline
    out = root / "compare_table"
    result = compare(Params(tracking={"uri": server}, compare=CompareParams(out=str(out))))
    header = result.text.splitlines()[0].split()
    assert len(header) <= 20 and "train.lr" in header
    assert {"val_loss", "loss_delta", "similarity"} <= set(header)
    settings = [c for c in header if "." in c]
    assert settings == ["train.lr"], settings  # no output path, folder, run id or hash
    assert all(len(line) <= 150 for line in result.text.splitlines())
    page = (out / "compare.html").read_text()
    assert page.count("<audio") == 2 and VAL_TEXT in page and page.count(f"{VAL_ROW}-ref") == 1
    assert "src='audio/" not in page and page.count("<img") == 1  # embedded: a KFP/MLflow artifact
    checked = out / "checked.html"
    checked.write_text(page.replace("</body>", CHECK))
    found, _ = page_check(checked)
    assert [round(d, 2) for d in found["audio"]] == [0.5, 0.5] and all(w > 0 for w in found["imgs"])


def test_compare_sweep_takes_its_children_and_logs_the_page_to_the_parent(registered, pipeline, server):
    """`--sweep ID`: only the runs whose `mlflow.parentRunId` is ID (B alone here); the table and
    compare.html become artifacts of the parent. The parent lives in an experiment of its own, so the
    other tests' runs lists are as they were; the tag is taken off again."""
    _, b = registered
    root, _ = pipeline
    client = MlflowClient(server)
    parent = client.create_run(client.create_experiment("voxpipe-test-sweeps"), run_name="sweep").info.run_id
    client.set_tag(b["run_id"], "mlflow.parentRunId", parent)
    try:
        rows = compare(Params(tracking={"uri": server}, compare=CompareParams(
            sweep=parent, format="csv", out=str(root / "compare_sweep")))).rows
    finally:
        client.delete_tag(b["run_id"], "mlflow.parentRunId")
    assert [r["id"] for r in rows] == [b["run_id"][:8]]
    logged = {f.path for f in client.list_artifacts(parent, "compare")}
    assert logged == {"compare/compare.csv", "compare/compare.html", "compare/val_curves.png"}
    with pytest.raises(StepError, match="sweep 'nope' .* has no child runs"):
        compare(Params(tracking={"uri": server}, compare=CompareParams(sweep="nope", out=str(root / "c2"))))


@needs_chromium
def test_mlflow_compare_view_shows_the_headline_and_the_differing_setting(registered, server):
    """The MLflow UI's compare page for the two runs (what the runs list's **Compare** opens) in Chromium:
    the headline metrics under their short names, and the setting the runs differ in."""
    a, b = registered
    experiment = MlflowClient(server).get_run(a["run_id"]).info.experiment_id
    runs = json.dumps([a["run_id"], b["run_id"]]).replace(" ", "")
    url = f'{server}/#/compare-runs?runs={runs}&experiments=["{experiment}"]&workflowType=machine_learning'
    text = scrolled_text(url, "Run details")  # its tables show a few rows at a time: read while scrolled
    for metric in ("val_loss", "loss_delta", "similarity", "stop_failure_rate", "mfu", "tokens_per_s"):
        assert f"\n{metric}" in text, metric
    assert "\ntrain.lr" in text and "0.0001" in text and "0.0003" in text
    assert "set.train.lr" in text  # the chosen setting, among the few tags


def test_secrets_never_logged(registered, server, tmp_path):
    """Params, tags, dataset sources, version tags, run artifacts and the model's files (code included)."""
    texts = []
    with session(server) as client:
        for reg in registered:
            run = client.get_run(reg["run_id"])
            texts += [json.dumps(run.data.params), json.dumps(run.data.tags),
                      json.dumps([d.dataset.source for d in run.inputs.dataset_inputs])]
            texts.append(json.dumps(client.get_model_version(NAME, reg["version"]).tags))
            for source in ({"run_id": reg["run_id"]}, {"artifact_uri": f"models:/{NAME}/{reg['version']}"}):
                dst = str(tmp_path / str(len(texts)))
                local = Path(mlflow.artifacts.download_artifacts(**source, dst_path=dst))
                texts += [f.read_bytes().decode("utf-8", "replace") for f in local.rglob("*") if f.is_file()]
    assert len(texts) > 20
    client = MlflowClient(server)
    assert client.get_run(registered[0]["run_id"]).data.params["launch.env.MLFLOW_TRACKING_TOKEN"] == "***"
    for secret in (SECRETS["MLFLOW_TRACKING_PASSWORD"], SECRETS["MLFLOW_TRACKING_TOKEN"]):
        assert not any(secret in text for text in texts)


def test_redaction_and_credentials_only_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "hunter2-secret")
    assert redact_uri("https://bob:hunter2-secret@mlflow.example/x?token=abc&page=2") == (
        "https://bob:***@mlflow.example/x?token=***&page=2")
    assert redact_uri("sqlite:////abs/mlflow.db") == "sqlite:////abs/mlflow.db"
    text = "uri postgresql://u:pw@db/m, value hunter2-secret"
    assert scrub(text) == "uri postgresql://u:***@db/m, value ***"
    with pytest.raises(StepError, match="MLFLOW_TRACKING_PASSWORD"):
        resolve_tracking_uri("https://bob:pw@mlflow.example", tmp_path)


def test_default_sqlite_store_without_server(pipeline, monkeypatch):
    root, runs = pipeline
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    work = root / "local_work"
    files = {**runs["a"], "work": str(work), "out": str(root / "local_register")}
    reg = run_register(files)
    assert "MLFLOW_TRACKING_URI" not in os.environ  # MLflow's process default was put back
    db = work / "mlflow.db"
    assert reg["tracking_uri"] == f"sqlite:///{db.resolve()}" and db.is_file()
    assert reg["aliases"] == ["candidate", "champion"]
    client = MlflowClient(reg["tracking_uri"])
    assert client.get_model_version_by_alias(NAME, "champion").version == reg["version"]
    assert (work / "mlruns").is_dir()
    assert json.loads((work / "mlflow_run.json").read_text())["run_id"] == reg["run_id"]
    rows = compare(Params(tracking={"work": str(work)},
                          compare=CompareParams(format="csv", out=str(root / "local_compare")))).rows
    assert len(rows) == 1


def test_a_model_whose_data_recorded_no_locale_says_it_reads_en_us(
        pipeline, monkeypatch, tmp_path, capsys, caplog):
    """Data ingested before rows recorded their locale: register records none and its summary says en-US is
    assumed; the loaded pyfunc says so in its log, and synthesize in its summary; --locale still applies."""
    root, runs = pipeline
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    old = tmp_path / "ingest"
    shutil.copytree(runs["a"]["ingest"], old)
    rows = [json.loads(line) for line in (old / "raw.jsonl").read_text().splitlines()]
    assert {r.pop("locale") for r in rows} == {"en-US"}  # what ingest records now
    (old / "raw.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    files = {**runs["a"], "ingest": str(old), "out": str(tmp_path / "register")}
    files.pop("work")
    params = Params.model_validate({"register": {**files, "model_name": NAME},
                                    "tracking": {"work": str(tmp_path / "work")}})
    result = register(params)
    assert result.registered["locale"] is None
    assert "no locale recorded in the training data (ingested before ingest recorded it): en-US assumed" \
        in result.summary()
    uri = result.registered["tracking_uri"]
    with session(uri):
        version = MlflowClient(uri).get_model_version(NAME, result.registered["version"])
    assert "voxpipe.locale" not in version.tags
    common = ["synthesize", "--model", result.registered["model_uri"], "--text", "Due 12/05/2026.",
              "--max-len", "2", "--inference-timesteps", "1", "--device", "cpu", "--tracking-uri", uri,
              "--out", str(tmp_path / "x.wav")]
    assert main(common) == 0
    out = capsys.readouterr().out
    assert "said (normalized in en-US: none recorded with the model: en-US assumed): 'Due December" in out
    assert "locale en-US (none recorded with the model: en-US assumed)" in caplog.text
    assert main([*common, "--locale", "en-GB"]) == 0
    assert "said (normalized in en-GB: --locale): 'Due the twelfth of May" in capsys.readouterr().out
    assert main([*common, "--locale", "fr-FR"]) == 1  # refused before the model loads, in one paragraph
    assert "synthesize: params.locale='fr-FR': unknown; one of en-US, en-GB, zh-CN" in capsys.readouterr().err


# -- train.track: the trainer logs live into the run `register` completes -------------------------------
LIVE = "voxpipe-live"  # experiment and model name of the live runs, apart from A's and B's
LIVE_STEPS = 4
LIVE_SETTINGS = {"device": "cpu", "max_steps": LIVE_STEPS, "val_every": 2, "val_batches": 2,
                 "max_tokens": 512, "lr": 2e-3, "warmup_steps": 1, "export_dtype": "float32"}


def train_live(sample, out: Path, server: str, experiment: str = LIVE, **changes) -> dict:
    """A real training with train.track on; its report.json. `work` (unused with a tracking URI) holds the
    value of a secret env var, as any param might: it must not reach MLflow."""
    tracking = {"uri": server, "experiment": experiment,
                "work": str(out.parent / SECRETS["MLFLOW_TRACKING_TOKEN"])}
    train(Params(model={"base": str(sample.base_model)}, tracking=tracking, train=TrainParams(
        data=str(sample.encoded), out=str(out), track=True, **{**LIVE_SETTINGS, **changes},
    )), live=LiveRun)
    return json.loads((out / "report.json").read_text())


def histories(client: MlflowClient, run_id: str) -> dict[str, list[int]]:
    """Every metric of the run → the steps of its points, sorted (a step twice = a duplicated point)."""
    keys = client.get_run(run_id).data.metrics
    return {k: sorted(m.step for m in client.get_metric_history(run_id, k)) for k in keys}


def assert_no_secrets(params: dict[str, str]) -> None:
    text = json.dumps(params)
    assert not any(SECRETS[k] in text for k in ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"))


@pytest.fixture(scope="module")
def live(server, encoded_sample, secrets_in_env, tmp_path_factory):
    """Training logs live into the server; the run as training left it; then `register` on the outputs."""
    root = tmp_path_factory.mktemp("live")
    report = train_live(encoded_sample, root / "train", server)
    client = MlflowClient(server)
    trained = client.get_run(report["mlflow_run_id"])
    during = histories(client, trained.info.run_id)
    files = {"model": str(root / "train" / "export"), "train": str(root / "train"),
             "eval": str(write_eval(root / "eval", 1.9, 2.0)), "mfu": str(write_mfu(root / "mfu", 0.01)),
             "ingest": str(encoded_sample.ingest), "out": str(root / "register"), "work": str(root / "work")}
    reg = run_register(files, tracking_uri=server, experiment=LIVE, model_name=LIVE)
    return report, trained, during, reg, files


def test_live_training_run_is_the_registered_run(live, server):
    report, trained, during, reg, _ = live
    client = MlflowClient(server)
    steps = list(range(1, LIVE_STEPS + 1))
    # while training: the scrubbed train params and every step's metrics
    assert trained.data.params["train.lr"] == "0.002" and trained.data.params["train.track"] == "true"
    assert not any(k.startswith("tracking.") for k in trained.data.params)  # where it logs, not what ran
    assert_no_secrets(trained.data.params)
    assert during["loss"] == steps and during["skipped"] == steps and during["val/loss"] == [2, 4]
    # register completed that run: one run, each metric once per step, the base model's val point added
    assert reg["run_id"] == report["mlflow_run_id"] and "train" in reg["logged"]
    (run,) = pipeline_runs(client, LIVE)
    assert run.info.run_id == reg["run_id"] and run.info.status == "FINISHED"
    after = histories(client, reg["run_id"])
    assert all(len(points) == len(set(points)) for points in after.values()), after
    assert after["loss"] == steps and after["val/loss"] == [0, 2, 4] and after["train/steps"] == [LIVE_STEPS]
    assert after["eval/loss_model"] == [0] and after["mfu/mfu"] == [0]
    assert_no_secrets(run.data.params)
    assert run.data.params["train.lr"] == "0.002" and run.data.params["data.rows_kept"]


def test_reregister_live_run_is_idempotent(live, server):
    _, _, _, reg, files = live
    client = MlflowClient(server)
    before = histories(client, reg["run_id"])
    (Path(files["work"]) / "mlflow_run.json").unlink()  # found again through the train report
    again = run_register(files, tracking_uri=server, experiment=LIVE, model_name=LIVE)
    assert (again["run_id"], again["version"], again["logged"]) == (reg["run_id"], reg["version"], [])
    assert len(pipeline_runs(client, LIVE)) == 1
    assert histories(client, reg["run_id"]) == before


def test_live_run_of_another_store_falls_back(live, tmp_path, monkeypatch):
    """The train report names a run on the server; register into the embedded sqlite store makes its own."""
    report, _, _, _, files = live
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    work = tmp_path / "work"
    reg = run_register({**files, "work": str(work), "out": str(tmp_path / "register")}, experiment=LIVE)
    assert reg["created"] and reg["run_id"] != report["mlflow_run_id"]
    steps = histories(MlflowClient(reg["tracking_uri"]), reg["run_id"])
    assert steps["loss"] == list(range(1, LIVE_STEPS + 1)) and steps["val/loss"] == [0, 2, 4]


def test_resumed_training_rejoins_its_run_once_per_step(server, encoded_sample, secrets_in_env, tmp_path):
    """A crash after step 2's checkpoint: the rerun redoes steps 3-4 into the same run, which keeps one point
    per step."""
    experiment = f"{LIVE}-resume"
    out = tmp_path / "train"
    first = train_live(encoded_sample, out, server, experiment, checkpoint_every=2)
    shutil.rmtree(latest_checkpoint(out / "checkpoints"))  # step-4: as if killed before it was saved
    again = train_live(encoded_sample, out, server, experiment, checkpoint_every=2)
    assert again["resumed_from"].endswith("step-2") and again["steps_run"] == 2
    assert again["mlflow_run_id"] == first["mlflow_run_id"]
    client = MlflowClient(server)
    assert len(pipeline_runs(client, experiment)) == 1
    steps = histories(client, first["mlflow_run_id"])
    assert steps["loss"] == list(range(1, LIVE_STEPS + 1)) and steps["val/loss"] == [2, 4]


def test_without_a_registry_there_is_no_champion_and_none_is_created(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params = Params.model_validate({"tracking": {"work": str(tmp_path / "work")}})
    assert champion_export(params, tmp_path / "fetched") is None
    assert not (tmp_path / "work" / "mlflow.db").exists()  # a store is not created by asking it

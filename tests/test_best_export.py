"""The best checkpoint, not the last: the trainer exports every `train.export_every` steps (keeping the last
k), `evaluate` scores every export and the promotion rule picks one, and `register` registers that one. Real
training (tiny model, one process), the real evaluate (few, short generations) and the embedded MLflow store.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from voxpipe.errors import StepError
from voxpipe.evaluate.step import EvaluateResult, evaluate
from voxpipe.files import step_folders
from voxpipe.integrity import signing_key
from voxpipe.lineage import dvc_md5
from voxpipe.params import Params
from voxpipe.steps.evaluate import EvaluateParams
from voxpipe.steps.train import TrainParams
from voxpipe.track.register import register
from voxpipe.train.identity import IDENTITY_FILE, write_identity
from voxpipe.train.loop import train

# trains with periodic exports, then evaluates and registers them
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def trained(encoded_sample, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("best") / "train"
    train(Params(model={"base": str(encoded_sample.base_model)}, train=TrainParams(
        data=str(encoded_sample.encoded), out=str(out), device="cpu", max_steps=5, export_every=2,
        keep_exports=2, val_every=0, val_batches=2, max_tokens=512, lr=2e-3, warmup_steps=1,
        export_dtype="float32",
    )))
    return out


def test_exports_every_n_steps_and_the_last_keeping_k(trained):
    exports = step_folders(trained / "exports")
    assert [step for step, _ in exports] == [4, 5]  # steps 2, 4 and the last (5); the oldest pruned
    assert sorted(p.name for p in (trained / "exports").iterdir()) == ["step-4", "step-5"]  # no temp folders
    weights = [folder / "model.safetensors" for folder in (exports[-1][1], trained / "export")]
    assert weights[0].read_bytes() == weights[1].read_bytes()  # the last export is the final one


@pytest.fixture(scope="module")
def evaluated(trained, encoded_sample, tmp_path_factory) -> tuple[Path, EvaluateResult]:
    """evaluate on the run's exports (an export another run left in the folder among them): its folder."""
    out = tmp_path_factory.mktemp("best_eval") / "eval"
    params = Params(model={"base": str(encoded_sample.base_model)}, train={"max_tokens": 512},
                    evaluate=EvaluateParams(
                        model=str(trained / "exports"), data=str(encoded_sample.encoded), out=str(out),
                        device="cpu", seeds=[0, 1], texts_per_speaker=1, max_len=4, inference_timesteps=2,
                        asr=False))
    # an export an earlier run left behind (another lr): never scored as this run's
    stale = trained / "exports" / "step-40"
    shutil.copytree(trained / "exports" / "step-4", stale)
    identity = json.loads((stale / IDENTITY_FILE).read_text())
    identity["params"]["train.lr"] = 1e-5
    (stale / IDENTITY_FILE).unlink()  # another run's genuine export: signed with the same key
    identity = {k: v for k, v in identity.items() if k not in ("files", "hmac", "step")}
    write_identity(stale, {**identity, "run": "0123456789abcdef"}, 40, signing_key(trained / "checkpoints"))
    try:
        return out, evaluate(params)
    finally:
        shutil.rmtree(stale)


def test_evaluate_scores_each_export_picks_one_and_register_takes_it(evaluated, trained, encoded_sample,
                                                                    tmp_path, monkeypatch):
    out, result = evaluated
    report = json.loads((out / "eval.json").read_text())
    table = report["exports"]
    assert [row["step"] for row in table] == [4, 5]
    (skipped,) = report["exports_of_run"]["skipped"]
    assert skipped["step"] == 40 and "another run" in skipped["why"]
    assert "train.lr 1e-05 vs 0.002" in skipped["why"]
    assert report["exports_of_run"]["identity_from"].endswith("trainer.json")
    assert json.loads((out / "report.json").read_text())["exports_skipped"] == 1
    columns = {"loss", "loss_std", "similarity_to_speaker", "stop_failure_rate", "promoted", "failed"}
    assert all(columns <= set(row) for row in table)
    chosen = report["chosen"]
    assert chosen["step"] in (4, 5) and report["chosen_step"] == chosen["step"]
    assert chosen["md5"] == dvc_md5(Path(chosen["path"]))
    row = next(r for r in table if r["step"] == chosen["step"])
    assert report["loss_model"] == pytest.approx(row["loss"])  # the flat figures are the chosen export's
    # each export's paired similarity gain over the base, the chosen one's the headline
    assert all(r["similarity_gain_low"] <= r["similarity_gain"] <= r["similarity_gain_high"] for r in table)
    assert report["similarity_gain"] == pytest.approx(row["similarity_gain"])
    assert [c["name"] for c in report["promotion"]["criteria"]] == [
        "loss", "similarity[spk_f]", "similarity[spk_m]", "stop_failures", "voice_split", "quality",
        "did_not_forget"]
    assert report["improved"] == int(report["promotion"]["promoted"]) == int(row["promoted"])
    sims = report["scores"]["model"]["similarity"]
    assert sorted(sims) == ["spk_f", "spk_m"]
    assert all(s["n"] == 2 for s in sims.values())  # 1 text, with and without the reference
    assert len(report["val_digest"]) == 16
    assert (out / "exports.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = result.summary().splitlines()[2:]  # the summary evaluate printed: a row per criterion
    assert [row.split()[0] for row in printed[:len(report["promotion"]["criteria"])]] == [
        c["name"] for c in report["promotion"]["criteria"]]

    # register.model empty: the export evaluate chose is registered; another one is refused
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    mfu = tmp_path / "mfu" / "mfu.json"
    mfu.parent.mkdir()
    mfu.write_text(json.dumps({"mfu": 0.01}))
    files = {"eval": str(out / "eval.json"), "mfu": str(mfu), "train": str(trained),
             "ingest": str(encoded_sample.ingest), "out": str(tmp_path / "register")}
    tracking = {"work": str(tmp_path / "work")}
    registered = register(Params(register=files, tracking=tracking)).registered
    assert registered["created"]
    from mlflow import MlflowClient

    client = MlflowClient(registered["tracking_uri"])
    version = client.get_model_version(registered["name"], registered["version"])
    assert version.tags["voxpipe.export_md5"] == chosen["md5"]
    assert version.tags["voxpipe.val_digest"] == report["val_digest"]
    history = client.get_metric_history(registered["run_id"], "eval/export/loss")
    assert sorted((m.step, m.value) for m in history) == [(r["step"], r["loss"]) for r in table]
    other = next(r["path"] for r in table if r["step"] != chosen["step"])
    with pytest.raises(StepError, match="register the one evaluate chose"):
        register(Params(register={**files, "model": other}, tracking=tracking))


def test_compare_page_plays_the_chosen_exports_clips_of_every_run_register_logged(
        evaluated, trained, encoded_sample, tmp_path, monkeypatch):
    """Runs made by the real register from the real evaluate's output (clips named `step-N-...`): a plain
    run and a sweep's child. register logs the chosen export's clips as `audio/<val row id>-<ref|noref>.wav`
    in both; compare.html has a player per run for every sentence. `max_runs` counts the runs with
    figures: the sweep's parent, started between the two, is none of them."""
    import base64
    import io

    import soundfile as sf
    from mlflow import MlflowClient

    from voxpipe.steps.compare import CompareParams
    from voxpipe.track.compare import compare
    from voxpipe.track.sweep import sweep_open

    out, _ = evaluated
    report = json.loads((out / "eval.json").read_text())
    step = report["chosen"]["step"]
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    tracking = {"work": str(tmp_path / "work")}
    files = {"eval": str(out / "eval.json"), "train": str(trained), "ingest": str(encoded_sample.ingest)}
    runs = []
    for number, parent in enumerate((None, "sweep")):
        mfu = tmp_path / f"mfu{number}" / "mfu.json"  # another mfu.json: another pipeline run
        mfu.parent.mkdir()
        mfu.write_text(json.dumps({"mfu": 0.01 * (number + 1)}))
        if parent:
            opened = sweep_open(Params(tracking=tracking, sweep={"grid": ["train.lr=2e-3"],
                                                                "out": str(tmp_path / "sweep")}))
            parent = opened.record["parent_run"]
        done = register(Params(register={**files, "mfu": str(mfu), "out": str(tmp_path / f"reg{number}")},
                               tracking={**tracking, "parent_run": parent}))
        runs.append(done.registered["run_id"])
    client = MlflowClient(done.registered["tracking_uri"])
    names = sorted(f"{r['row_id']}-{'ref' if r['with_reference'] else 'noref'}"
                   for r in report["utterances"]["model"])
    assert len(names) == 4  # a text per speaker, with and without the reference
    for run_id in runs:
        logged = [f.path for f in client.list_artifacts(run_id, "audio")]
        assert logged == [f"audio/{name}.wav" for name in names]
        record = report["utterances"]["model"][0]  # its chosen export's clip, not the baseline's
        name = f"{record['row_id']}-{'ref' if record['with_reference'] else 'noref'}"
        heard = Path(client.download_artifacts(run_id, f"audio/{name}.wav", str(tmp_path / run_id)))
        assert heard.read_bytes() == (out / "samples" / f"step-{step}-{record['name']}.wav").read_bytes()

    for sweep, shown in ((None, runs), (parent, runs[1:])):
        result = compare(Params(tracking=tracking, compare=CompareParams(
            out=str(tmp_path / f"compare-{sweep}"), max_runs=2, sweep=sweep)))
        assert sorted(r["id"] for r in result.rows) == sorted(r[:8] for r in shown) and not result.skipped
        page = (result.out / "compare.html").read_text()
        assert "No samples" not in page and "no sample" not in page
        clips = re.findall(r"src='data:audio/wav;base64,([^']+)'", page)
        assert len(clips) == len(names) * len(shown)  # a player per run for every sentence
        assert all(sf.info(io.BytesIO(base64.b64decode(c))).frames > 0 for c in clips)

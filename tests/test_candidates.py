"""EMA and averaged candidates judged by the same rule (issue 43, part 4): `evaluate` scores the exports as
saved, their EMA siblings and the average of the best k, `chosen` may be any of them, and `register` records
which kind won. The exports are built so the average wins: two live exports are the base model plus and
minus the same large noise (each far worse than the base), so their average is the base itself (the
baseline's loss and voice), and the EMA siblings carry half the noise. Real evaluate (tiny model, few short
generations), real register into the embedded MLflow store.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from voxpipe.evaluate.step import evaluate
from voxpipe.integrity import signing_key
from voxpipe.lineage import dvc_md5
from voxpipe.params import Params
from voxpipe.steps.evaluate import EvaluateParams
from voxpipe.steps.train import TrainParams
from voxpipe.track.register import register
from voxpipe.train.identity import IDENTITY_FILE, verified_identity, write_identity
from voxpipe.train.loop import train

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
NOISE = 2.0  # times each tensor's spread: the model it gives is far from any good one


def _export(base: Path, folder: Path, weights: dict[str, torch.Tensor], run: dict, step: int, key: bytes,
            kind: dict | None = None) -> None:
    shutil.copytree(base, folder)
    (folder / IDENTITY_FILE).unlink(missing_ok=True)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    write_identity(folder, run, step, key, kind)


@pytest.fixture(scope="module")
def run_folder(encoded_sample, tmp_path_factory) -> Path:
    """A real run (2 steps, EMA on) whose exports are then replaced by the built ones, signed as its own."""
    out = tmp_path_factory.mktemp("candidates") / "train"
    train(Params(model={"base": str(encoded_sample.base_model)}, train=TrainParams(
        data=str(encoded_sample.encoded), out=str(out), device="cpu", max_steps=2, export_every=2,
        val_every=0, val_batches=2, max_tokens=512, lr=2e-3, warmup_steps=1, export_dtype="float32",
        ema_decay=0.5)))
    exports = out / "exports"
    assert sorted(p.name for p in exports.iterdir()) == ["step-2", "step-2-ema"]
    key = signing_key(out / "checkpoints")
    run = {k: v for k, v in verified_identity(exports / "step-2", key).items() if k not in ("files", "step")}
    shutil.rmtree(exports)
    exports.mkdir()
    base = load_file(str(encoded_sample.base_model / "model.safetensors"))
    generator = torch.Generator().manual_seed(0)
    noise = {k: NOISE * v.float().std().nan_to_num(1.0) * torch.randn(v.shape, generator=generator)
             for k, v in base.items()}
    for step, sign in ((2, 1.0), (4, -1.0)):
        live = {k: (v.double() + sign * noise[k].double()).to(v.dtype) for k, v in base.items()}
        ema = {k: (v.double() + 0.5 * sign * noise[k].double()).to(v.dtype) for k, v in base.items()}
        _export(encoded_sample.base_model, exports / f"step-{step}", live, run, step, key)
        _export(encoded_sample.base_model, exports / f"step-{step}-ema", ema, run, step, key,
                {"kind": "ema", "ema_decay": 0.5})
    return out


def test_evaluate_scores_every_kind_chooses_the_average_and_register_records_it(
        run_folder, encoded_sample, tmp_path, monkeypatch):
    out = tmp_path / "eval"
    params = Params(model={"base": str(encoded_sample.base_model)}, train={"max_tokens": 512},
                    evaluate=EvaluateParams(
                        model=str(run_folder / "exports"), data=str(encoded_sample.encoded), out=str(out),
                        device="cpu", seeds=[0, 1], texts_per_speaker=1, max_len=4, inference_timesteps=2,
                        asr=False, average_top_k=2))
    evaluate(params)
    report = json.loads((out / "eval.json").read_text())
    table = report["exports"]
    assert [(r["step"], r["kind"]) for r in table] == [(2, "live"), (2, "ema"), (4, "live"), (4, "ema"),
                                                        (4, "average")]
    average = report["average"]
    assert [a["step"] for a in average["averaged"]] in ([2, 4], [4, 2]) and average["k"] == 2
    folder = Path(average["path"])
    assert folder == out / "average" and (folder / "config.json").is_file()
    identity = verified_identity(folder, signing_key(folder))
    assert identity["kind"] == "average"
    assert sorted(identity["averaged"]) == ["step-2", "step-4"]
    # by construction the average is the base model: its loss is the baseline's, every other is far worse
    losses = {(r["step"], r["kind"]): r["loss"] for r in table}
    assert losses[(4, "average")] == pytest.approx(report["loss_baseline"], rel=1e-4)
    assert min(losses, key=losses.get) == (4, "average")
    assert losses[(2, "ema")] < losses[(2, "live")] and losses[(4, "ema")] < losses[(4, "live")]
    chosen = report["chosen"]
    assert report["candidate_kind"] == chosen["kind"] == "average", report["chosen"]["why"]
    assert chosen["path"] == str(folder) and chosen["tag"] == "average"
    assert chosen["md5"] == dvc_md5(folder)
    assert sorted(p.name for p in (out / "samples").iterdir() if p.name.startswith("average-"))

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    mfu = tmp_path / "mfu" / "mfu.json"
    mfu.parent.mkdir()
    mfu.write_text(json.dumps({"mfu": 0.01}))
    files = {"eval": str(out / "eval.json"), "mfu": str(mfu), "train": str(run_folder),
             "ingest": str(encoded_sample.ingest), "out": str(tmp_path / "register")}
    registered = register(Params(register=files, tracking={"work": str(tmp_path / "work")})).registered
    from mlflow import MlflowClient

    client = MlflowClient(registered["tracking_uri"])
    version = client.get_model_version(registered["name"], registered["version"])
    assert version.tags["voxpipe.candidate_kind"] == "average"
    assert version.tags["voxpipe.export_md5"] == chosen["md5"]
    assert client.get_run(registered["run_id"]).data.tags["voxpipe.candidate_kind"] == "average"
    ema_losses = client.get_metric_history(registered["run_id"], "eval/export_ema/loss")
    assert sorted((m.step, m.value) for m in ema_losses) == [(2, losses[(2, "ema")]), (4, losses[(4, "ema")])]


def test_fewer_than_two_exports_give_no_average_and_say_why(tmp_path):
    from voxpipe.evaluate.average import average_candidate
    from voxpipe.evaluate.exports import Candidate

    losses = {Candidate(tmp_path / "step-2", 2): 1.0, Candidate(tmp_path / "step-4", 4): float("nan"),
              Candidate(tmp_path / "step-2-ema", 2, "ema"): 0.5}
    candidate, record = average_candidate(losses, 3, tmp_path / "eval", b"key")
    assert candidate is None and record["path"] is None
    assert "1 export(s) of the run with a finite loss" in record["null_reason"]
    assert not (tmp_path / "eval").exists()


def test_exports_with_other_tensors_are_not_averaged(tmp_path):
    from voxpipe.errors import StepError
    from voxpipe.evaluate.average import average_exports
    from voxpipe.evaluate.exports import Candidate

    sources = []
    for step, names in ((2, ("a", "b")), (4, ("a", "c"))):
        folder = tmp_path / "exports" / f"step-{step}"
        folder.mkdir(parents=True)
        save_file({n: torch.ones(2) for n in names}, str(folder / "model.safetensors"))
        sources.append(Candidate(folder, step))
    why = r"step-4/model.safetensors: its tensors differ .* evaluate.average_top_k=0"
    with pytest.raises(StepError, match=why):
        average_exports(sources, tmp_path / "eval" / "average", b"key")
    eval_out = tmp_path / "eval"
    assert not eval_out.exists() or not any(eval_out.iterdir())  # nothing half-written is left

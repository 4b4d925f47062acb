"""Your run's exports only: every export records the identity of the run that wrote it, a fresh start moves
the old exports aside with the checkpoints, and `evaluate` never scores another run's export. Real training
(the tiny model, one process); the selection is the function `evaluate` calls.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from voxpipe.errors import StepError
from voxpipe.evaluate.exports import own_exports
from voxpipe.lineage import dvc_md5
from voxpipe.params import Params
from voxpipe.steps.train import TrainParams
from voxpipe.train.identity import IDENTITY_FILE, read_identity
from voxpipe.train.loop import train

pytestmark = pytest.mark.usefixtures("one_thread")


def run(encoded_sample, out: Path, **changes) -> None:
    settings = dict(data=str(encoded_sample.encoded), out=str(out), device="cpu", max_steps=2, export_every=2,
                    val_every=0, val_batches=1, max_tokens=512, warmup_steps=1, lr=1e-3)
    model = {"base": str(encoded_sample.base_model)}
    train(Params(model=model, train=TrainParams(**{**settings, **changes})))


def test_a_fresh_start_moves_the_exports_aside_and_a_stale_export_is_never_scored(encoded_sample, tmp_path):
    out = tmp_path / "train"
    run(encoded_sample, out)
    first = read_identity(out / "exports" / "step-2")
    assert first["params"]["train.lr"] == 1e-3 and first["data_version"] == dvc_md5(encoded_sample.encoded)
    assert read_identity(out / "export")["run"] == first["run"]
    assert json.loads((out / "report.json").read_text())["identity"]["run"] == first["run"]

    run(encoded_sample, out, lr=2e-3, fresh_on_change=True)  # another lr: a new run in the same folder
    second = read_identity(out / "exports" / "step-2")
    assert second["run"] != first["run"]
    aside = [p for p in out.iterdir() if p.name.startswith("exports.replaced-")]
    assert len(aside) == 1 and read_identity(aside[0] / "step-2")["run"] == first["run"]

    # an export the earlier run left in exports/ (as voxpipe did before it moved them aside)
    shutil.copytree(aside[0] / "step-2", out / "exports" / "step-40")
    legacy = out / "exports" / "step-30"
    shutil.copytree(aside[0] / "step-2", legacy)
    (legacy / IDENTITY_FILE).unlink()
    chosen = own_exports(out / "exports")
    assert [c.step for c in chosen.candidates] == [2] and chosen.run == second["run"]
    why = {s["step"]: s["why"] for s in chosen.skipped}
    assert sorted(why) == [30, 40]
    assert "another run" in why[40] and "train.lr 0.001 vs 0.002" in why[40]
    assert "records no run identity" in why[30]

    # without a checkpoint of it, the run is report.json's; one checkpoint folder is scored as named
    shutil.rmtree(out / "checkpoints")
    assert own_exports(out / "exports").source.endswith("report.json")
    assert own_exports(out / "exports" / "step-40").candidates[0].step is None

    # only stale exports left: a clear error, nothing scored
    shutil.rmtree(out / "exports" / "step-2")
    with pytest.raises(StepError, match="none of its 2 exports was written by the run"):
        own_exports(out / "exports")


def test_a_new_run_without_checkpoints_sets_foreign_exports_aside(encoded_sample, tmp_path):
    """Checkpoints deleted but exports kept: the next run does not mix its exports with the old ones."""
    out = tmp_path / "train"
    run(encoded_sample, out)
    shutil.rmtree(out / "checkpoints")
    run(encoded_sample, out, lr=2e-3)
    assert [p.name for p in (out / "exports").iterdir()] == ["step-2"]
    assert read_identity(out / "exports" / "step-2")["params"]["train.lr"] == 2e-3
    assert any(p.name.startswith("exports.replaced-") for p in out.iterdir())

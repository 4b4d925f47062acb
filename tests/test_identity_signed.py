"""Issue 34: an export's run identity cannot be forged. voxpipe-run.json is signed with the checkpoint key
together with every file of the export (voxpipe/train/identity.py), and `evaluate`'s choice of exports
(`own_exports`) takes only those that verify: one copied from another run's export, edited by hand or
unsigned is never scored as this run's. No training: the exports are small stand-in folders.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from voxpipe.errors import StepError
from voxpipe.evaluate.exports import own_exports
from voxpipe.integrity import KEY_ENV, signing_key
from voxpipe.train.identity import (
    IDENTITY_FILE,
    folder_run,
    foreign_exports,
    sign_report_identity,
    verified_identity,
    write_identity,
)


@pytest.fixture(autouse=True)
def own_key(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def identity(run: str, lr: float) -> dict:
    return {"run": run, "params": {"train.lr": lr}, "data_version": "d1", "base_version": "b1"}


def export(folder: Path, weights: bytes, who: dict | None, step: int) -> Path:
    (folder / "lora").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "lora" / "lora_config.json").write_text("{}")
    if who is not None:
        write_identity(folder, who, step, signing_key(folder))
    return folder


@pytest.fixture
def run_folder(tmp_path) -> Path:
    """train/exports/step-2 (this run, "mine") and step-4 (another run's weights, "theirs"); report.json
    names "mine", signed."""
    out = tmp_path / "train"
    mine = identity("a" * 16, 1e-3)
    export(out / "exports" / "step-2", b"my weights", mine, 2)
    export(out / "exports" / "step-4", b"their weights", identity("b" * 16, 2e-3), 4)
    (out / "report.json").write_text(json.dumps(
        {"identity": mine, "identity_hmac": sign_report_identity(mine, signing_key(out))}))
    return out


def test_a_signed_identity_verifies_and_names_its_run(run_folder):
    key = signing_key(run_folder)
    found = verified_identity(run_folder / "exports" / "step-2", key)
    assert found["run"] == "a" * 16 and found["step"] == 2 and "lora/lora_config.json" in found["files"]
    assert folder_run(run_folder, key)[0]["run"] == "a" * 16
    chosen = own_exports(run_folder / "exports")
    assert [c.step for c in chosen.candidates] == [2] and chosen.source.endswith("report.json")
    assert "another run (bbbbbbbbbbbbbbbb" in chosen.skipped[0]["why"]


def test_an_identity_copied_into_another_runs_export_is_not_scored(run_folder):
    """The attack of the issue: this run's voxpipe-run.json copied next to another run's weights."""
    ours, theirs = run_folder / "exports" / "step-2", run_folder / "exports" / "step-4"
    shutil.copyfile(ours / IDENTITY_FILE, theirs / IDENTITY_FILE)
    chosen = own_exports(run_folder / "exports")
    assert [c.step for c in chosen.candidates] == [2]
    (skipped,) = chosen.skipped
    assert skipped["step"] == 4 and "signed for other files than those beside it" in skipped["why"]
    assert "copied from another export" in skipped["why"]
    assert foreign_exports(run_folder / "exports", identity("a" * 16, 1e-3), signing_key(run_folder))

    # the same, named alone: refused in one paragraph, with the way out
    with pytest.raises(StepError) as err:
        own_exports(theirs)
    message = str(err.value)
    assert "\n" not in message
    assert f"{theirs}: not scored, since its {IDENTITY_FILE} does not verify" in message
    assert "model.safetensors" in message and f"delete its {IDENTITY_FILE}" in message


@pytest.mark.parametrize(("damage", "why"), [
    (lambda d: d.update(run="a" * 16), "signature does not match"),  # edited to claim this run
    (lambda d: d.pop("hmac"), "unsigned"),  # as voxpipe wrote it before it signed identities
])
def test_an_edited_or_unsigned_identity_is_not_scored(run_folder, damage, why):
    theirs = run_folder / "exports" / "step-4"
    found = json.loads((theirs / IDENTITY_FILE).read_text())
    damage(found)
    (theirs / IDENTITY_FILE).write_text(json.dumps(found))
    chosen = own_exports(run_folder / "exports")
    assert [c.step for c in chosen.candidates] == [2] and why in chosen.skipped[0]["why"]


def test_weights_changed_after_the_export_are_not_scored(run_folder):
    (run_folder / "exports" / "step-2" / "model.safetensors").write_bytes(b"my weightz")
    with pytest.raises(StepError, match="none of its 2 exports was written by the run"):
        own_exports(run_folder / "exports")


def test_another_key_does_not_verify(run_folder, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "another-key-0123456789")
    with pytest.raises(StepError, match=f"no export's {IDENTITY_FILE} verifies.*signature does not match.*"
                                        f"with the key that signed them \\({KEY_ENV}"):
        own_exports(run_folder / "exports")


def test_an_unsigned_report_does_not_name_the_run(run_folder):
    """report.json edited to name the other run: its signature fails, so the newest export that verifies
    (step-4, the other run's) names it, and step-2 is the one set aside."""
    report = json.loads((run_folder / "report.json").read_text())
    report["identity"] = identity("b" * 16, 2e-3)
    (run_folder / "report.json").write_text(json.dumps(report))
    assert folder_run(run_folder, signing_key(run_folder)) == (None, "")
    chosen = own_exports(run_folder / "exports")
    assert [c.step for c in chosen.candidates] == [4] and chosen.source.startswith("the newest export that")


def test_no_export_verifies_and_nothing_names_the_run(run_folder):
    (run_folder / "report.json").unlink()
    for step in (2, 4):
        folder = run_folder / "exports" / f"step-{step}"
        found = json.loads((folder / IDENTITY_FILE).read_text())
        found["run"] = "c" * 16
        (folder / IDENTITY_FILE).write_text(json.dumps(found))
    with pytest.raises(StepError) as err:
        own_exports(run_folder / "exports")
    message = str(err.value)
    assert "\n" not in message and "no export's voxpipe-run.json verifies" in message


def test_exports_that_record_no_identity_are_all_scored_as_before(tmp_path):
    export(tmp_path / "exports" / "step-1", b"w1", None, 1)
    export(tmp_path / "exports" / "step-3", b"w3", None, 3)
    chosen = own_exports(tmp_path / "exports")
    assert [c.step for c in chosen.candidates] == [1, 3] and chosen.run is None

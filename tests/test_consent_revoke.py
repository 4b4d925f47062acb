"""`voxpipe consent-revoke` against a real `mlflow server`: register tags each version with the consent ids of
its voices; revoking one tags every version trained on it, moves @champion to the newest version that is not
revoked (or removes it), writes the revocation into voices.yaml (so the next ingest quarantines the voice),
and serve and synthesize refuse a revoked version in one paragraph."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from small_sample import SAMPLE, write_small_sample
from test_track import run_register, secrets_in_env, write_eval, write_mfu, write_training  # noqa: F401

from voxpipe.cli import main
from voxpipe.data.ingest_step import ingest
from voxpipe.steps.ingest import IngestParams
from voxpipe.steps.model import ModelParams
from voxpipe.train.init_model import init_model

NAME = "voxpipe-test"  # test_track.run_register's


def ingested(root: Path, revoked: tuple[str, ...] = ()) -> Path:
    data = write_small_sample(root / "data", per_speaker=2)
    records = yaml.safe_load((SAMPLE / "voices.yaml").read_text())
    for r in records["voices"]:
        r["revoked"] = r["speaker"] in revoked
    (data / "voices.yaml").write_text(yaml.safe_dump(records))
    ingest(IngestParams(input=[str(data)], out=str(root / "ingest"), workers=1, score_quality=False,
                        max_bad_fraction=1.0))
    return data


def pipeline_run(root: Path, ingest_folder: Path, seed: int, loss: float) -> dict:
    init_model(ModelParams(preset="tiny", seed=seed, out=str(root / "export")))
    write_training(root / "train", 1e-4, [2.0, 1.9, 1.8])
    return {"model": str(root / "export"), "train": str(root / "train"),
            "eval": str(write_eval(root / "eval", loss, 2.0)), "mfu": str(write_mfu(root / "mfu", 0.01)),
            "ingest": str(ingest_folder), "out": str(root / "register"), "work": str(root.parent / "work")}


@pytest.fixture(scope="module")
def versions(server, secrets_in_env, tmp_path_factory):  # noqa: F811
    """v(a): both voices, @champion; v(b): both voices, worse; v(c): spk_f only (spk_m's record revoked)."""
    root = tmp_path_factory.mktemp("revoke")
    both = ingested(root / "both")
    only_f = ingested(root / "only_f", revoked=("spk_m",))
    a = run_register(pipeline_run(root / "a", root / "both" / "ingest", 0, 1.90), tracking_uri=server)
    b = run_register(pipeline_run(root / "b", root / "both" / "ingest", 1, 1.95), tracking_uri=server)
    c = run_register(pipeline_run(root / "c", root / "only_f" / "ingest", 2, 1.97), tracking_uri=server)
    return both, only_f, a, b, c


def test_register_records_the_consent_ids_of_the_voices_trained_on(versions, server):
    _, _, a, _, c = versions
    client = MlflowClient(server)
    assert client.get_model_version(NAME, a["version"]).tags["voxpipe.consent_ids"] == \
        "sample-spk_f,sample-spk_m"
    assert client.get_model_version(NAME, c["version"]).tags["voxpipe.consent_ids"] == "sample-spk_f"


def test_revoke_tags_the_versions_moves_champion_and_serve_refuses(versions, server, tmp_path, capsys):
    both, _, a, b, c = versions
    client = MlflowClient(server)
    client.set_registered_model_alias(NAME, "champion", a["version"])
    common = ["--tracking-uri", server, "--set", f"register.model_name={NAME}"]
    assert main(["consent-revoke", "--id", "sample-spk_m", "--reason", "asked to withdraw",
                 "--set", f"ingest.input=[{both}]", *common]) == 0
    out = capsys.readouterr().out
    assert f"@champion moved from v{a['version']} to v{c['version']}" in out
    for v in (a, b):
        tags = client.get_model_version(NAME, v["version"]).tags
        assert tags["voxpipe.consent_revoked"] == "sample-spk_m: asked to withdraw"
    assert "voxpipe.consent_revoked" not in client.get_model_version(NAME, c["version"]).tags
    assert client.get_model_version_by_alias(NAME, "champion").version == c["version"]

    # the record says so: the next ingest of this data quarantines the voice's rows
    record = yaml.safe_load((both / "voices.yaml").read_text())["voices"]
    assert [(r["speaker"], r["revoked"], r["revoked_reason"]) for r in record] == [
        ("spk_m", True, "asked to withdraw"), ("spk_f", False, "")]
    ingest(IngestParams(input=[str(both)], out=str(tmp_path / "again"), workers=1, score_quality=False,
                        max_bad_fraction=1.0))
    report = yaml.safe_load((tmp_path / "again" / "report.json").read_text())
    assert report["reasons"]["no_consent"] == 2 and set(report["speakers"]) == {"spk_f"}

    # serve and synthesize refuse a revoked version before loading anything
    assert main(["serve", "--model", str(a["version"]), "--port", "1", *common]) == 1
    err = capsys.readouterr().err
    assert f"version {a['version']} of '{NAME}' was trained on a voice whose consent was revoked" in err
    assert "sample-spk_m: asked to withdraw" in err and "Traceback" not in err and err.count("\n") <= 2
    assert main(["synthesize", "--model", str(b["version"]), "--text", "hi", "--out", str(tmp_path / "x.wav"),
                 "--device", "cpu", *common]) == 1
    assert "consent was revoked" in capsys.readouterr().err and not (tmp_path / "x.wav").exists()

    # the last voice: no version is left that is not revoked, so @champion goes
    assert main(["consent-revoke", "--id", "sample-spk_f", "--reason", "also withdrawn",
                 "--set", f"ingest.input=[{both}]", *common]) == 0
    assert f"@champion removed from v{c['version']}" in capsys.readouterr().out
    assert "champion" not in client.get_registered_model(NAME).aliases


def test_revoke_without_a_known_id_or_reason_is_one_paragraph(versions, server, capsys):
    both = versions[0]
    common = ["--tracking-uri", server, "--set", f"register.model_name={NAME}", "--set",
              f"ingest.input=[{both}]"]
    assert main(["consent-revoke", "--id", "nobody", "--reason", "x", *common]) == 1
    err = capsys.readouterr().err
    assert "no record has this id" in err and "--id" in err and "Traceback" not in err
    assert main(["consent-revoke", "--id", "sample-spk_f", *common]) == 1
    assert "needs --id" in capsys.readouterr().err


def test_revoke_with_no_registry_yet_marks_the_record(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(SAMPLE / "voices.yaml", data)
    assert main(["consent-revoke", "--id", "sample-spk_f", "--reason", "withdrawn", "--set",
                 f"ingest.input=[{data}]", "--tracking-work", str(tmp_path / "work")]) == 0
    assert "none registered" in capsys.readouterr().out
    assert yaml.safe_load((data / "voices.yaml").read_text())["voices"][1]["revoked"] is True
    assert not list((tmp_path / "work").glob("*"))  # no registry store was created

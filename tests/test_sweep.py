"""Sweeps: the grid's checks, and one MLflow parent per sweep against a real `mlflow server`.

The grid errors are one paragraph naming the key and the way out. The MLflow test opens a sweep
(`voxpipe sweep-open`), registers two points as its children (register with `tracking.parent_run`:
the run logged, no model version), then closes it (`voxpipe sweep-close`): the winner by the promotion
rule and the loss is tagged on the parent, and only it is registered, becoming @champion as register
would make it. The points' files are test_track's (real tiny exports, eval.json in evaluate's format).
The DVC sweep (tools/sweep.py) runs in test_dvc.py's scratch repo, the KFP sweep in test_kfp.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient
from test_track import NAME, ROOT, write_eval, write_mfu, write_training

from voxpipe.cli import main
from voxpipe.data.ingest_step import ingest
from voxpipe.errors import StepError
from voxpipe.params import Params
from voxpipe.steps.ingest import IngestParams
from voxpipe.steps.model import ModelParams
from voxpipe.track.register import register
from voxpipe.track.sweep import BEST_TAG, GRID_TAG, PARENT_TAG, SWEEP_FILE, grid_points, parse_grid
from voxpipe.track.tracking import session
from voxpipe.train.init_model import init_model


# -- the grid ------------------------------------------------------------------------------------
def test_grid_values_are_typed_by_the_schema_and_every_combination_is_a_point():
    grid = parse_grid(["train.lr=5e-5,1e-4", "train.lora.r=16,32"])
    assert grid == {"train.lr": [5e-5, 1e-4], "train.lora.r": [16, 32]}
    assert len(grid_points(grid)) == 4
    assert grid_points(grid)[1] == {"train.lr": 5e-5, "train.lora.r": 32}


@pytest.mark.parametrize(("entry", "says"), [
    ("train.learning_rate=1e-4", ["'train.learning_rate' is no params key", "--grid train.lr="]),
    ("lr=1e-4", ["'lr' is no params key", "did you mean", "train.lr"]),
    ("train.lr=", ["no values for train.lr", "--grid train.lr=A,B"]),
    ("train.lr", ["no values for train.lr"]),
    ("train.max_steps=4,many", ["train.max_steps=many is refused", "train.max_steps", "--help"]),
])
def test_a_bad_grid_is_one_paragraph_naming_the_key_and_the_way_out(entry, says):
    with pytest.raises(StepError) as e:
        parse_grid([entry])
    message = str(e.value)
    assert "\n" not in message
    for part in says:
        assert part in message, message


def test_an_empty_or_repeated_grid_is_refused():
    with pytest.raises(StepError, match="the grid is empty"):
        parse_grid([])
    with pytest.raises(StepError, match="train.lr is given twice"):
        parse_grid(["train.lr=1e-4", "train.lr=3e-4"])


def test_the_cli_says_a_bad_grid_in_one_line(capsys, tmp_path):
    code = main(["sweep-open", "--grid", "train.lr=fast", "--out", str(tmp_path / "sweep"),
                 "--tracking-work", str(tmp_path / "work")])
    err = capsys.readouterr().err
    assert code == 1
    assert "voxpipe sweep-open: error: sweep grid 'train.lr=fast'" in err
    assert len(err.strip().splitlines()) == 1


# -- tools/sweep.py and make sweep: safe to start -------------------------------------------------------
SWEEP = [sys.executable, str(ROOT / "tools" / "sweep.py")]


@pytest.mark.parametrize("hostile", [
    "train.lr=$$(touch {m})", "train.lr=$(touch {m})", "train.lr=`touch {m}`", "train.lr=1;touch {m}",
    "train.lr=1|touch {m}", "train.lr=1\ntouch {m}", "train.lr=1 && touch {m}", "$(shell touch {m})",
    "train.lr='1' ; touch {m} '", "train.lr=1 > {m}",
])
def test_make_sweep_hands_grid_over_as_data_never_as_a_shell_line(hostile, tmp_path):
    """A GRID from a CI variable: shell metacharacters, newlines and make functions reach tools/sweep.py
    as text (the grid's check refuses them in one line); nothing of them runs (issue 41)."""
    marker = tmp_path / "pwned"
    # -o: the venv stamp counts as built, whatever pyproject.toml's age
    grid = f"GRID={hostile.format(m=marker)}"
    proc = subprocess.run(["make", "-s", "-o", ".venv/.installed", "sweep", grid], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and not marker.exists(), proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("make")]
    assert "Traceback" not in proc.stderr and len(lines) == 1 and lines[0].startswith("sweep: error:"), lines


def test_a_grid_past_the_bound_asks_for_yes_before_anything_starts(tmp_path):
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    proc = subprocess.run([*SWEEP, "--grid", "train.lr=1e-4,2e-4,3e-4", "--grid", "train.seed=1,2,3,4,5,6"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "the grid has 18 points, more than --max-points 16" in proc.stderr and "--yes" in proc.stderr
    assert not (tmp_path / "work" / "sweep").exists()
    proc = subprocess.run([*SWEEP, "--grid", "train.lr=1e-4,2e-4", "--max-points", "1"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert "the grid has 2 points, more than --max-points 1" in proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_before_the_sweep_opened_is_one_line(sig, tmp_path):
    """A signal while the driver loads or checks (here no DVC repo: it ends in that error if the signal
    comes later): one line, never a traceback, whatever the moment."""
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    for delay in (0.3, 0.8, 1.5):
        proc = subprocess.Popen([*SWEEP, "--grid", "train.lr=1e-4"], cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        if proc.poll() is None:
            os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=120)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, (delay, err)
        assert err.startswith(("sweep: stopped by", "sweep: error: DVC cannot read the pipeline")), err
        assert not (tmp_path / "work" / "sweep").exists()


# -- MLflow: parent, children, only the best registered ---------------------------------------------
@pytest.fixture(scope="module")
def points(tmp_path_factory):
    """Two points' outputs, lr 1e-4 (eval loss 1.90) and 3e-4 (1.95): both beat the base (2.0)."""
    root = tmp_path_factory.mktemp("sweep")
    ingest(IngestParams(input=[str(ROOT / "data" / "sample")], out=str(root / "ingest"), workers=1,
                        score_quality=False))
    runs = {}
    for tag, seed, lr, loss in (("a", 0, 1e-4, 1.90), ("b", 1, 3e-4, 1.95)):
        init_model(ModelParams(preset="tiny", seed=seed, out=str(root / tag / "export")))
        write_training(root / tag / "train", lr, [2.0, 1.9, 1.8])
        runs[tag] = {"model": str(root / tag / "export"), "train": str(root / tag / "train"),
                     "eval": str(write_eval(root / tag / "eval", loss, 2.0)),
                     "mfu": str(write_mfu(root / tag / "mfu", 0.01)), "ingest": str(root / "ingest"),
                     "out": str(root / tag / "register"), "work": str(root / tag / "work")}
    return root, runs


def register_point(files: dict, server: str, parent: str) -> dict:
    """`voxpipe register` of one point, as each point's pipeline runs it in a sweep."""
    register_keys = {k: v for k, v in files.items() if k != "work"}
    params = Params.model_validate({"register": {**register_keys, "model_name": NAME},
                                    "tracking": {"uri": server, "work": files["work"], "parent_run": parent}})
    return register(params).registered


@pytest.mark.slow
def test_a_sweep_is_one_parent_its_points_children_and_only_the_best_is_registered(server, points, capsys):
    root, runs = points
    where = ["--tracking-uri", server, "--register-model-name", NAME, "--out", str(root / "sweep")]
    assert main(["sweep-open", "--grid", "train.lr=1e-4,3e-4", *where]) == 0
    parent = json.loads((root / "sweep" / SWEEP_FILE).read_text())["parent_run"]
    client = MlflowClient(server)
    assert json.loads(client.get_run(parent).data.tags[GRID_TAG]) == {"train.lr": [1e-4, 3e-4]}

    children = {tag: register_point(files, server, parent) for tag, files in runs.items()}
    assert client.search_model_versions(f"name='{NAME}'") == []  # the points register no version
    for tag, lr in (("a", "0.0001"), ("b", "0.0003")):
        run = client.get_run(children[tag]["run_id"])
        assert run.data.tags[PARENT_TAG] == parent
        assert run.data.tags["sweep.train.lr"] == run.data.params["train.lr"] == lr
        assert "version" not in children[tag]
    capsys.readouterr()

    assert main(["sweep-close", "--tracking-uri", server, "--register-model-name", NAME,
                 "--out", str(root / "sweep")]) == 0  # the parent from sweep.json
    assert "best of 2 runs is " + children["a"]["run_id"] in capsys.readouterr().out
    assert client.get_run(parent).data.tags[BEST_TAG] == children["a"]["run_id"]
    versions = client.search_model_versions(f"name='{NAME}'")
    assert [v.run_id for v in versions] == [children["a"]["run_id"]]
    champion = client.get_model_version_by_alias(NAME, "champion")  # no champion before: the rule's verdict
    assert champion.version == versions[0].version
    assert champion.tags["voxpipe.locale"] == "en-US"  # the best point's data's, as register tags a version
    # the best point's cards (its register wrote them into its run) in the version's files and description
    card = (Path(runs["a"]["out"]) / "cards" / "README.md").read_text()
    assert champion.description and champion.description in card
    with session(server):
        model_files = Path(mlflow.artifacts.download_artifacts(f"models:/{NAME}/{champion.version}",
                                                               dst_path=str(root / "dl")))
    assert (model_files / "README.md").read_text() == card
    record = json.loads((Path(root) / "sweep" / SWEEP_FILE).read_text())
    assert record["registered"]["promoted"] and record["ranking"][0] == children["a"]["run_id"]

    # a sweep whose best is the champion's own export (the same settings again): no twin version
    again = where[:-1] + [str(root / "sweep2")]
    assert main(["sweep-open", "--grid", "train.lr=1e-4", *again]) == 0
    parent2 = json.loads((root / "sweep2" / SWEEP_FILE).read_text())["parent_run"]
    register_point(runs["a"], server, parent2)
    capsys.readouterr()
    assert main(["sweep-close", "--tracking-uri", server, "--register-model-name", NAME,
                 "--out", str(root / "sweep2")]) == 0
    said = capsys.readouterr().out
    assert f"the same model as {NAME} v{champion.version} (@champion" in said and "no new version" in said
    assert len(client.search_model_versions(f"name='{NAME}'")) == 1
    assert json.loads((root / "sweep2" / SWEEP_FILE).read_text())["registered"]["version"] is None
    assert client.get_run(parent2).info.status == "FINISHED"


@pytest.mark.slow
def test_a_stopped_sweep_closes_its_parent_and_a_rerun_reopens_it(server):
    """end_sweep: the parent ends KILLED, tagged why; a RUNNING child (its point's register did not
    finish) ends KILLED and leaves the sweep, so compare --sweep and sweep-close skip it; a FINISHED one
    stays. reopen_sweep: RUNNING and open again, the reason gone."""
    from voxpipe.track.sweep import ENDED_TAG, LEFT_TAG, SWEEP_TAG, end_sweep, reopen_sweep

    client = MlflowClient(server)
    experiment = client.create_experiment("sweep-stop")
    parent = client.create_run(experiment, tags={SWEEP_TAG: "open"}).info.run_id
    child = client.create_run(experiment, tags={PARENT_TAG: parent}).info.run_id
    done = client.create_run(experiment, tags={PARENT_TAG: parent}).info.run_id
    client.set_terminated(done, "FINISHED")
    end_sweep(server, parent, "KILLED", "stopped by SIGINT")
    run = client.get_run(parent)
    assert run.info.status == "KILLED" and run.data.tags[SWEEP_TAG] == "killed"
    assert run.data.tags[ENDED_TAG] == "stopped by SIGINT"
    left = client.get_run(child)
    assert left.info.status == "KILLED" and left.data.tags[LEFT_TAG] == parent
    assert PARENT_TAG not in left.data.tags
    assert client.get_run(done).data.tags[PARENT_TAG] == parent
    reopen_sweep(server, parent)
    run = client.get_run(parent)
    assert run.info.status == "RUNNING" and run.data.tags[SWEEP_TAG] == "open"
    assert ENDED_TAG not in run.data.tags


def test_a_cluster_point_sets_its_values_in_train_and_evaluate_and_the_parent_in_tracking():
    """The KFP sweep's `sweep_point` (its function, called directly): nested keys land in their section."""
    from components import steps

    item = {"point": {"train.lr": 3e-4, "train.lora.r": 32, "evaluate.seeds": [1]}, "part": "p1",
            "parent_run": "abc"}
    point = steps.sweep_point.python_func(item=item, train={"lr": 1e-4, "lora": {"enabled": True}},
                                          evaluate={}, tracking={"experiment": "x"})
    assert point.train == {"lr": 3e-4, "lora": {"enabled": True, "r": 32}}
    assert point.evaluate == {"seeds": [1]}
    assert point.tracking == {"experiment": "x", "parent_run": "abc"} and point.part == "p1"


def test_the_figures_dvc_exp_show_keeps_are_the_ones_the_demo_writes():
    """`make demo` and `make sweep` end with `dvc exp show --keep` on figure names: a renamed figure
    would silently drop its column (speaker_similarity_mean did). Every name is in the committed demo's
    eval.json or mfu.json."""
    import re

    from tools.sweep import HEADLINE

    written = {**json.loads((ROOT / "work/eval/eval.json").read_text()),
               **json.loads((ROOT / "work/mfu/mfu.json").read_text())}
    makefile = re.search(r"^HEADLINE := '(.*)'$", (ROOT / "Makefile").read_text(), re.M).group(1)
    figures = [t.strip("^").replace("$$", "") for t in makefile.split("|")
               if t != "Experiment" and not t.startswith(("train.", "^train."))]
    assert figures and set(HEADLINE) <= set(written), sorted(set(HEADLINE) - set(written))
    assert set(figures) <= set(written), sorted(set(figures) - set(written))

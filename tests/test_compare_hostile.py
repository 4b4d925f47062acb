"""`voxpipe compare` when one run is hostile or broken: two runs made by the real `register` (embedded
sqlite store), one of which each test renames or whose logged artifacts it spoils the way another MLflow
client could, then puts back. No traceback in any case: names are text, csv cells are no formulas, and a
run with a malformed artifact is left out with its id and the reason while the other is compared."""

from __future__ import annotations

import csv
import json
import shutil
import unicodedata
from pathlib import Path
from urllib.parse import urlparse

import pytest
from mlflow import MlflowClient
from test_track import VAL_ROW, run_register, write_eval, write_mfu, write_training

from voxpipe.errors import StepError
from voxpipe.params import Params
from voxpipe.steps.compare import CompareParams
from voxpipe.steps.model import ModelParams
from voxpipe.track.compare import compare
from voxpipe.track.compare_page import MAX_CLIP_BYTES, MAX_EVAL_BYTES
from voxpipe.track.untrusted import printable
from voxpipe.train.init_model import init_model

pytestmark = pytest.mark.slow  # real register runs


registered: dict[str, dict] = {}  # each run's register files, by tag


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """(work folder, client, [good run id, victim run id]): two pipeline runs registered for real."""
    root = tmp_path_factory.mktemp("hostile")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.delenv("MLFLOW_RUN_ID", raising=False)
        ids = []
        for tag, seed, lr, loss in (("good", 0, 1e-4, 1.9), ("victim", 1, 3e-4, 1.95)):
            init_model(ModelParams(preset="tiny", seed=seed, out=str(root / tag / "export")))
            train = write_training(root / tag / "train", lr, [2.0, 1.9, 1.85])
            files = {"model": str(root / tag / "export"), "train": str(train),
                     "eval": str(write_eval(root / tag / "eval", loss, 2.0)),
                     "mfu": str(write_mfu(root / tag / "mfu", 0.01)), "ingest": None,
                     "out": str(root / tag / "register"), "work": str(root / "work")}
            ids.append(run_register(files)["run_id"])
            registered[tag] = files
        yield root, ids


@pytest.fixture
def store(two_runs, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    root, ids = two_runs
    work = root / "work"
    return work, MlflowClient(f"sqlite:///{(work / 'mlflow.db').resolve()}"), ids


def run_compare(work: Path, out: Path, fmt: str = "table", **changes):
    return compare(Params(tracking={"work": str(work)},
                          compare=CompareParams(format=fmt, out=str(out), **changes)))


INVISIBLE = {"Cc", "Cf", "Zl", "Zp"}


def shown(text: str) -> list[str]:
    """The control, format and separator characters in `text` but its newlines."""
    return [c for c in text if c != "\n" and unicodedata.category(c) in INVISIBLE]


HOSTILE_NAMES = [
    "$\\frac{1}{0}$ lr $x^2$",  # mathtext
    "cost $\\nope$",  # mathtext matplotlib cannot parse
    "lr $1e-4 {$", "run $^$ 1", "$$", "$x_$",
    "_hidden from legends",
    "\x1b[2J\x1b[31mred\x1b[0m",  # clear screen, colours
    "\x1b]0;owned title\x07tab",  # OSC window title
    "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\",  # OSC 8 hyperlink
    "\x9b2Jeight-bit CSI",
    "bell\x07 back\x08space \rover\nline\ttab\x00nul",
    "bidi \u202eevil\u202c \u2066iso\u2069 sep\u2028\u2029 zw\u200b",
    "\x1bc reset \x1b(B charset",
]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_run_name_is_text_on_the_terminal_the_table_the_curves_and_the_page(store, tmp_path, name):
    work, client, (good, victim) = store
    before = client.get_run(victim).info.run_name
    client.set_tag(victim, "mlflow.runName", name)
    try:
        results = {fmt: run_compare(work, tmp_path / fmt, fmt) for fmt in ("table", "markdown", "csv",
                                                                            "json")}
    finally:
        client.set_tag(victim, "mlflow.runName", before)
    for fmt, result in results.items():
        assert len(result.rows) == 2 and not result.skipped
        assert shown(result.summary()) == [], fmt  # what a terminal gets
        assert (result.out / "val_curves.png").stat().st_size > 1000
    for fmt in ("table", "markdown"):
        assert shown(results[fmt].text) == [], fmt  # compare.txt / compare.md, read with cat
    assert {r["run"] for r in json.loads((tmp_path / "json" / "compare.json").read_text())} >= {name}
    page = (tmp_path / "table" / "compare.html").read_text()
    assert "\x1b" not in page and page.count("<audio") == 2


FORMULAS = ['=HYPERLINK("https://evil.example","click")', "+cmd|' /C calc'!A0", "-2+3+cmd|' /C calc'!A0",
            "@SUM(1+1)*cmd|' /C calc'!A0", "\t=1+1", "\r=1+1", "\n=1+1", " =1+1", "＝1+1", "=1"]


@pytest.mark.parametrize("value", FORMULAS)
def test_a_csv_cell_that_a_spreadsheet_would_run_is_text(store, tmp_path, value):
    """In the run's name, its verdict and a setting that differs: each such cell gets a leading `'`;
    numbers (the loss delta, a negative setting) stay numbers."""
    work, client, (good, victim) = store
    run = client.get_run(victim)
    before = run.info.run_name, run.data.tags["voxpipe.verdict"]
    client.set_tag(victim, "mlflow.runName", value)
    client.set_tag(victim, "voxpipe.verdict", value)
    try:
        result = run_compare(work, tmp_path, "csv")
    finally:
        client.set_tag(victim, "mlflow.runName", before[0])
        client.set_tag(victim, "voxpipe.verdict", before[1])
    with (tmp_path / "compare.csv").open(newline="") as f:  # as csv reads a file: CR and LF kept in cells
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    mine = next(r for r in rows if r["id"] == victim[:8])
    assert mine["run"] == mine["verdict"] == f"'{printable(value)}"  # a tab a space, CR and LF gone
    assert shown((tmp_path / "compare.csv").read_text()) == []
    assert all(r["loss_delta"].startswith("-") for r in rows)  # -0.1, -0.05: numbers, as they were
    assert shown(result.summary()) == []


def test_only_numbers_and_plain_text_stay_as_they_are():
    from voxpipe.track.untrusted import spreadsheet_cell

    for kept in ("-1", "-0.05", "+3", "1e-4", "-.5", "lr 3e-4", "a=b", 1.5, -2, None):
        assert spreadsheet_cell(kept) == kept
    assert spreadsheet_cell("-1-1") == "'-1-1"
    for hidden in ("\x1b[0m=1+1", "\u200b@SUM(1)", "\x00 -1+1"):  # whatever a spreadsheet drops first
        assert spreadsheet_cell(hidden) == f"'{hidden}"


def artifact_folder(client: MlflowClient, run_id: str) -> Path:
    return Path(urlparse(client.get_run(run_id).info.artifact_uri).path)


def deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


BAD_EVAL = {
    "a JSON list": (b"[1, 2]", "eval/eval.json is a list, not an object"),
    "a JSON string": (b'"figures"', "eval/eval.json is a string, not an object"),
    "null": (b"null", "eval/eval.json is null, not an object"),
    "NaN": (b"NaN", "eval/eval.json is a number, not an object"),
    "not JSON": (b"{'loss': 1,", "eval/eval.json is not JSON (JSONDecodeError"),
    "empty": (b"", "eval/eval.json is not JSON (JSONDecodeError"),
    "not UTF-8": (b'{"text": "\xff\xfe"}', "eval/eval.json is not JSON (UnicodeDecodeError"),
    "nested past the limit": (deep(200_000), "eval/eval.json is not JSON (RecursionError"),
    "a 5000-digit number": (b'{"seed": ' + b"9" * 5000 + b"}", "eval/eval.json is not JSON (ValueError"),
    "utterances a list": (b'{"utterances": []}', "utterances is a list, not an object"),
    "utterances.model an object": (b'{"utterances": {"model": {}}}',
                                   "utterances.model is an object, not a list"),
    "a record a string": (b'{"utterances": {"model": ["x"]}}',
                          "utterances.model[0] is a string, not an object"),
    "row_id a number": (b'{"utterances": {"model": [{"row_id": 5}]}}',
                        "utterances.model[0].row_id is a number, not a string"),
    "text a list": (b'{"utterances": {"model": [{"row_id": "r", "text": ["a"]}]}}',
                    "utterances.model[0].text is a list, not a string"),
    "settings a string": (b'{"settings": "x"}', "settings is a string, not an object"),
    "seed an object": (b'{"settings": {"generation_seed": {}}}', "settings.generation_seed is an object"),
}


@pytest.mark.parametrize("case", sorted(BAD_EVAL))
def test_a_malformed_eval_json_leaves_that_run_out_with_its_id_and_why(store, tmp_path, case):
    body, why = BAD_EVAL[case]
    work, client, (good, victim) = store
    eval_json = artifact_folder(client, victim) / "eval" / "eval.json"
    kept = eval_json.read_bytes()
    eval_json.write_bytes(body)
    try:
        result = run_compare(work, tmp_path)
    finally:
        eval_json.write_bytes(kept)
    assert [r["id"] for r in result.rows] == [good[:8]]
    (skipped,) = result.skipped
    assert skipped.startswith(victim) and why in skipped, skipped
    assert len(skipped) < 300  # the reason, not the file
    assert f"left out run {victim}" in result.summary() and victim in (tmp_path / "compare.html").read_text()


def test_a_huge_eval_json_is_not_read(store, tmp_path):
    work, client, (good, victim) = store
    eval_json = artifact_folder(client, victim) / "eval" / "eval.json"
    kept = eval_json.read_bytes()
    eval_json.write_bytes(b'{"pad": "' + b"x" * MAX_EVAL_BYTES + b'"}')
    try:
        result = run_compare(work, tmp_path)
    finally:
        eval_json.write_bytes(kept)
    (skipped,) = result.skipped
    assert skipped.startswith(victim) and "eval/eval.json is larger than 32 MiB" in skipped


@pytest.mark.parametrize("case", ["missing keys", "an empty object", "no eval.json"])
def test_an_eval_json_that_lacks_keys_is_no_fault(store, tmp_path, case):
    """The texts and the seed are extras: without them the run's players are still there."""
    work, client, (good, victim) = store
    eval_json = artifact_folder(client, victim) / "eval" / "eval.json"
    kept = eval_json.read_bytes()
    if case == "no eval.json":
        eval_json.unlink()
    else:
        eval_json.write_bytes(b'{"utterances": {"model": [{"name": "x"}, {}]}}' if case == "missing keys"
                              else b"{}")
    try:
        result = run_compare(work, tmp_path)
    finally:
        eval_json.write_bytes(kept)
    assert len(result.rows) == 2 and not result.skipped
    assert (tmp_path / "compare.html").read_text().count("<audio") == 2


def test_a_malformed_clip_leaves_that_run_out(store, tmp_path):
    """A clip that is no WAV, one too large to embed, and a folder where a clip should be."""
    work, client, (good, victim) = store
    audio = artifact_folder(client, victim) / "audio"
    cases = {"zz-noref.wav": (b"ID3\x03 not a wav at all", "audio/zz-noref.wav is not a WAV file"),
             "zz-big.wav": (b"RIFF\0\0\0\0WAVE" + bytes(MAX_CLIP_BYTES),
                            "audio/zz-big.wav is larger than 32 MiB"),
             "zz-folder.wav": (None, "audio/zz-folder.wav is a folder, not a file")}
    for name, (body, why) in cases.items():
        if body is None:
            (audio / name).mkdir()
            (audio / name / "x.wav").write_bytes(b"RIFF")
        else:
            (audio / name).write_bytes(body)
        try:
            result = run_compare(work, tmp_path / name)
        finally:
            shutil.rmtree(audio / name) if body is None else (audio / name).unlink()
        (skipped,) = result.skipped
        assert skipped.startswith(victim) and why in skipped, skipped
        assert [r["id"] for r in result.rows] == [good[:8]]


def test_every_run_malformed_is_one_paragraph_naming_each(store, tmp_path):
    work, client, ids = store
    folders = [artifact_folder(client, run_id) / "eval" / "eval.json" for run_id in ids]
    kept = [f.read_bytes() for f in folders]
    for f in folders:
        f.write_bytes(b"[]")
    try:
        with pytest.raises(StepError, match="every run has a malformed artifact") as caught:
            run_compare(work, tmp_path)
    finally:
        for f, body in zip(folders, kept, strict=True):
            f.write_bytes(body)
    assert all(run_id in str(caught.value) for run_id in ids)


def test_max_runs_counts_runs_with_figures(store, tmp_path):
    """Newer than both registered runs: a sweep's parent and a run the trainer is still logging into (no
    figures yet). `--max-runs 2` shows the two registered ones."""
    work, client, ids = store
    experiment = client.get_run(ids[0]).info.experiment_id
    parent = client.create_run(experiment, run_name="sweep", tags={"voxpipe.sweep": "open"}).info.run_id
    live = client.create_run(experiment, run_name="training").info.run_id
    client.log_metric(live, "val/loss", 2.0, step=0)
    try:
        result = run_compare(work, tmp_path, max_runs=2)
        one = run_compare(work, tmp_path / "one", max_runs=1)
    finally:
        client.delete_run(parent)
        client.delete_run(live)
    assert sorted(r["id"] for r in result.rows) == sorted(i[:8] for i in ids)
    assert [r["id"] for r in one.rows] == [ids[1][:8]]  # the newest with figures


@pytest.mark.parametrize("sweep", ["x' OR '1'='1", "", "a" * 65, "run id", "ünïcode"])
def test_a_sweep_that_is_no_run_id_is_refused_before_any_search(store, tmp_path, sweep):
    work, _, _ = store
    with pytest.raises(StepError, match="is no MLflow run id"):
        run_compare(work, tmp_path, sweep=sweep)


def test_rerunning_register_adds_the_clips_to_a_run_logged_without_them(store):
    """A run logged before register found the chosen export's clips (no `audio/`, no `logged.audio` tag):
    register again logs them, and only them."""
    work, client, (good, victim) = store
    shutil.rmtree(artifact_folder(client, victim) / "audio")
    client.delete_tag(victim, "voxpipe.logged.audio")
    again = run_register(registered["victim"])
    assert again["run_id"] == victim and again["logged"] == ["audio"]
    assert [f.path for f in client.list_artifacts(victim, "audio")] == [f"audio/{VAL_ROW}-ref.wav"]

"""The blind listening test: listen.html is blind (a hold-out reads its DOM in headless Chromium for any
label near a player), a listener answers it through its own controls in Chromium and saves the answers
(a real Blob download), `voxpipe listen-record` records them into a real `mlflow server`, and with
`evaluate.listening: required` @champion waits for that test. Every wrong file listen-record can be given
is fed to it and refused in one paragraph."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from mlflow import MlflowClient
from test_ui import CHECK, CHROMIUM, chromium, needs_chromium, page_check, stop_chromium

from voxpipe.cli import main
from voxpipe.evaluate.listen_answers import MIN_NONZERO, summarize
from voxpipe.evaluate.listen_page import KEY, PAGE, Pair, write_listening_test
from voxpipe.lineage import dvc_md5
from voxpipe.track.listening_gate import AWAITS_TAG, MODE_TAG, VERDICT_TAG, missing_listening

TRIALS = 8
CHECKPOINT = "step-6"


def tone(path: Path, hz: float, seconds: float = 0.4, rate: int = 48000) -> Path:
    t = np.arange(int(rate * seconds)) / rate
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, (0.2 * np.sin(2 * np.pi * hz * t)).astype(np.float32), rate, subtype="PCM_16")
    return path


def sentences(folder: Path, trials: int = TRIALS) -> list[Pair]:
    """evaluate's clips of `trials` sentences (the base's and step 6's, with reference) and their real
    recordings (FLAC, as ingest may keep them)."""
    pairs = []
    for i in range(trials):
        name = f"{i:03d}-spk_f-ref"
        pairs.append(Pair(name, f"Sentence number {i} is read aloud.",
                          tone(folder / "real" / f"row{i}.flac", 200 + i),
                          tone(folder / "samples" / f"baseline-{name}.wav", 300 + i),
                          tone(folder / "samples" / f"{CHECKPOINT}-{name}.wav", 400 + i)))
    return pairs


@pytest.fixture
def page(tmp_path) -> Path:
    folder = tmp_path / "eval"
    write_listening_test(folder, "advisory", sentences(folder), "0:val-v1", "md5-of-the-export", CHECKPOINT)
    return folder


def test_the_page_is_seeded_balanced_and_its_key_holds_which_side_is_which(page, tmp_path):
    key = json.loads((page / KEY).read_text())
    assert len(key["trials"]) == TRIALS and key["checkpoint"] == CHECKPOINT
    sides = [t["fine_tune"] for t in key["trials"].values()]
    assert sides.count("A") == sides.count("B") == TRIALS // 2
    order = [t["utterance"] for _, t in sorted(key["trials"].items())]
    assert order != sorted(order)  # shuffled
    again = tmp_path / "again"
    write_listening_test(again, "advisory", sentences(again), "0:val-v1", "md5-of-the-export", CHECKPOINT)
    assert (again / PAGE).read_bytes() == (page / PAGE).read_bytes()  # the same seed, the same page
    write_listening_test(page, "off", sentences(page), "0:val-v1", "md5-of-the-export", CHECKPOINT)
    assert not (page / PAGE).exists() and not (page / KEY).exists()


FORBIDDEN = ("step-", "step", "base", "fine", "tune", "checkpoint", "model", "export", "samples", ".wav",
             ".flac", "spk_f", "-ref", "md5", "val-v1", "run")


@needs_chromium
def test_the_page_holds_no_label_near_a_player_only_a_and_b_and_a_trial_id(page, tmp_path):
    """The hold-out: the DOM Chromium builds from listen.html, its embedded audio cut out, names no
    checkpoint, run, path or model, and each trial is the anchor, A and B; the page fetches nothing."""
    dom = chromium("--dump-dom", (page / PAGE).as_uri())
    assert dom.count("data:audio/wav;base64,") == 3 * TRIALS
    text = re.sub(r"data:audio/wav;base64,[A-Za-z0-9+/=]+", "", dom)
    lowered = text.lower()
    for word in (*FORBIDDEN, str(tmp_path).lower()):
        assert word not in lowered, word
    assert not re.search(r"(src|href)=['\"](?!data:)", dom) and "fetch(" not in text and "<link" not in text
    trials = re.findall(r"<section class=\"trial\" data-trial=\"(t\d\d)\">(.*?)</section>", text, re.S)
    assert [t for t, _ in trials] == [f"t{i:02d}" for i in range(1, TRIALS + 1)]
    for _, body in trials:
        assert re.findall(r"<figcaption>(.*?)</figcaption>", body) == ["real recording (anchor)", "A", "B"]
    # every player decodes its embedded clip (the anchor from FLAC too): 0.4 s each
    checked = tmp_path / "checked.html"
    checked.write_text((page / PAGE).read_text().replace("</body>", CHECK))
    found, _ = page_check(checked)
    assert len(found["audio"]) == 3 * TRIALS and all(abs(d - 0.4) < 0.01 for d in found["audio"])


def answer_in_chromium(page: Path, downloads: Path, listener: str, choose: dict[str, int]) -> Path:
    """A listener answers every trial through the page's radio buttons and listener box, then clicks
    'Save answers': Chromium driven over its DevTools protocol, the download let into `downloads`."""
    import websocket

    with tempfile.TemporaryDirectory() as profile:
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"]
        proc = subprocess.Popen([CHROMIUM, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 90
            while not port_file.is_file() or not port_file.read_text().strip():
                assert time.monotonic() < deadline, "Chromium did not open its DevTools port"
                time.sleep(0.2)
            port = port_file.read_text().split()[0]
            version = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/version").read())
            targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json").read())
            tab = next(t for t in targets if t["type"] == "page")
            browser = websocket.create_connection(version["webSocketDebuggerUrl"], timeout=60,
                                                  suppress_origin=True)
            ws = websocket.create_connection(tab["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
            calls = iter(range(1, 10_000))

            def call(sock, method: str, **params) -> dict:
                number = next(calls)
                sock.send(json.dumps({"id": number, "method": method, "params": params}))
                while True:
                    reply = json.loads(sock.recv())
                    if reply.get("id") == number:
                        assert "error" not in reply, reply
                        return reply.get("result", {})

            def run(expression: str) -> str:
                found = call(ws, "Runtime.evaluate", expression=expression, returnByValue=True)
                return str(found.get("result", {}).get("value", ""))

            call(browser, "Browser.setDownloadBehavior", behavior="allow", downloadPath=str(downloads))
            call(ws, "Page.navigate", url=page.as_uri())
            loaded = "document.readyState === 'complete' && document.getElementById('save') ? 'y' : ''"
            while run(loaded) != "y":
                assert time.monotonic() < deadline, "the page did not load"
                time.sleep(0.2)
            for trial, value in choose.items():
                for question in ("speaker", "natural"):
                    button = f"'input[name=\"{trial}-{question}\"][value=\"{value}\"]'"
                    click = (f"(() => {{ const b = document.querySelector({button}); "
                             "if (!b) return 'missing'; b.click(); return String(b.checked); })()")
                    assert run(click) == "true"
            run(f"(() => {{ const box = document.getElementById('listener'); box.focus(); "
                f"box.value = {json.dumps(listener)}; box.dispatchEvent(new Event('input')); }})()")
            run("document.getElementById('save').click()")
            while not list(downloads.glob("*.json")):
                assert time.monotonic() < deadline, f"no download: {run('document.body.innerText')[-300:]}"
                time.sleep(0.2)
            status = run("document.getElementById('status').textContent")
            assert status.startswith(f"Saved {len(choose)} trials"), status
            browser.close()
            ws.close()
        finally:
            stop_chromium(proc)
    return next(downloads.glob("*.json"))


def preferring_fine_tune(key: dict, strength: int = 2) -> dict[str, int]:
    """The answers of a listener who prefers the fine-tune: toward its side on the -3 (A) .. +3 (B) scale."""
    return {t: strength if meta["fine_tune"] == "B" else -strength for t, meta in key["trials"].items()}


def register_required(server: str, root: Path, tag: str, seed: int, loss: float) -> tuple[dict, Path]:
    """A tiny export (init-model `seed`) registered with evaluate.listening required after an evaluation of
    fixed-seed `loss`, its eval folder holding listen.html: registered.json and the eval folder."""
    from test_track import run_register, write_eval, write_mfu, write_training

    from voxpipe.steps.model import ModelParams
    from voxpipe.train.init_model import init_model

    init_model(ModelParams(preset="tiny", seed=seed, out=str(root / tag / "export")))
    eval_path = write_eval(root / tag / "eval", loss, 2.0)
    evaluation = json.loads(eval_path.read_text())
    evaluation["settings"]["listening"] = "required"
    eval_path.write_text(json.dumps(evaluation))
    folder = eval_path.parent
    write_listening_test(folder, "required", sentences(folder), "0:val-v1", dvc_md5(root / tag / "export"),
                         CHECKPOINT)
    files = {"model": str(root / tag / "export"), "eval": str(eval_path),
             "train": str(write_training(root / tag / "train", 1e-4, [2.0, 1.9, 1.8])),
             "mfu": str(write_mfu(root / tag / "mfu", 0.01)), "ingest": str(root / "ingest"),
             "out": str(root / tag / "register"), "work": str(root / "work")}
    return run_register(files, tracking_uri=server), folder


@pytest.fixture
def registered_required(server, tmp_path, monkeypatch):
    """The sample's voice with a first version registered under evaluate.listening required."""
    from test_track import NAME

    from voxpipe.data.ingest_step import ingest
    from voxpipe.steps.ingest import IngestParams

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = Path(__file__).resolve().parents[1]
    ingest(IngestParams(input=[str(root / "data" / "sample")], out=str(tmp_path / "ingest"), workers=1))
    record, folder = register_required(server, tmp_path, "a", 0, 1.90)
    return NAME, record, folder, tmp_path


def record(answers: Path, folder: Path, root: Path, server: str, registered: Path | None = None) -> int:
    """`voxpipe listen-record` of `answers` with the key in `folder` (an eval folder), against the
    registered.json beside it unless another is named."""
    return main(["listen-record", "--answers", str(answers), "--key", str(folder / KEY),
                 "--registered", str(registered or folder.parent / "register" / "registered.json"),
                 "--tracking-uri", server, "--tracking-work", str(root / "work")])


@needs_chromium
@pytest.mark.slow
def test_answers_saved_through_the_page_reach_mlflow_and_a_passing_test_moves_champion(
        registered_required, server, capsys):
    name, registered, folder, root = registered_required
    client = MlflowClient(server, registry_uri=server)
    version = client.get_model_version(name, registered["version"])
    # required: the rule passed, but @champion waits for the listening test, and `promote` says so
    assert registered["decision"]["promoted"] is False and "waits for a listening test" in registered[
        "decision"]["reason"]
    assert version.tags[MODE_TAG] == "required" and version.tags[AWAITS_TAG] == "none"
    assert "champion" not in version.aliases
    capsys.readouterr()
    rc = main(["promote", "--version", registered["version"], "--reason", "sounds good", "--tracking-uri",
               server, "--tracking-work", str(root / "work"), "--model", name])
    assert rc == 1 and "no listening test recorded" in capsys.readouterr().err
    # register logged the eval folder, but not the key: listeners may read the run
    logged = [f.path for f in client.list_artifacts(registered["run_id"], "eval")]
    assert "eval/eval.json" in logged and f"eval/{KEY}" not in logged

    key = json.loads((folder / KEY).read_text())
    answers = answer_in_chromium(folder / PAGE, root / "downloads", "ann", preferring_fine_tune(key))
    saved = json.loads(answers.read_text())
    assert saved["listener"] == "ann" and answers.name == "listen-answers-ann.json"
    assert {t["id"] for t in saved["trials"]} == set(key["trials"])
    assert record(answers, folder, root, server) == 0
    out = capsys.readouterr().out
    assert "listening test passed (1 listener: ann)" in out
    assert "@champion moved to v1 (was no champion)" in out

    run = client.get_run(registered["run_id"])
    metrics = run.data.metrics
    assert metrics["listening/speaker_preference"] == metrics["listening/natural_preference"] == 1.0
    assert 0.6 < metrics["listening/speaker_preference_low"] < 1.0
    assert metrics["listening/speaker_preference_high"] == 1.0
    assert metrics["listening/speaker_cmos_mean"] == 2.0 and metrics["listening/speaker_preference_p"] < 0.01
    assert 0 < metrics["listening/speaker_wilcoxon_p"] < 0.05 and metrics["listening/listeners"] == 1
    assert run.data.tags[VERDICT_TAG].startswith("listening test passed")
    per_trial = json.loads(Path(client.download_artifacts(run.info.run_id, "listening/answers/ann.json",
                                                          str(root / "dl"))).read_text())
    assert len(per_trial) == TRIALS and all(j["speaker"] == 2 for j in per_trial)
    version = client.get_model_version(name, registered["version"])
    assert "champion" in version.aliases and AWAITS_TAG not in version.tags
    assert version.tags[VERDICT_TAG].startswith("listening test passed")
    assert version.tags["voxpipe.decision"] == "promoted"

    # a second listener hears no difference anywhere: pooled, the test still passes (no worse), with two
    bob = root / "bob.json"
    bob.write_text(json.dumps({**saved, "listener": "bob", "trials": [
        {"id": t["id"], "speaker": 0, "natural": 0} for t in saved["trials"]]}))
    assert record(bob, folder, root, server) == 0
    assert "v1 is @champion" in capsys.readouterr().out
    summary = json.loads(Path(client.download_artifacts(run.info.run_id, "listening/summary.json",
                                                        str(root / "dl2"))).read_text())
    assert summary["listeners"] == ["ann", "bob"] and summary["judgements"] == 2 * TRIALS
    assert summary["questions"]["speaker"]["equal"] == TRIALS and summary["passed"]
    assert client.get_run(run.info.run_id).data.metrics["listening/listeners"] == 2

    # answers to a page of another evaluation than the registered one: refused before anything is logged
    other = root / "other-eval"
    write_listening_test(other, "required", sentences(other), "0:val-v1", "another-export", CHECKPOINT)
    foreign = root / "foreign.json"
    foreign.write_text(json.dumps({**saved, "page": json.loads((other / KEY).read_text())["page"]}))
    capsys.readouterr()
    assert record(foreign, other, root, server, folder.parent / "register" / "registered.json") == 1
    err = capsys.readouterr().err
    assert "another evaluation than the one registered" in err and "Traceback" not in err
    # a registered.json of a version this registry does not have
    elsewhere = root / "elsewhere.json"
    elsewhere.write_text(json.dumps({**registered, "version": "99"}))
    assert record(answers, folder, root, server, elsewhere) == 1
    assert "models:/voxpipe-test/99 is not in the registry" in capsys.readouterr().err

    # a better second version, held back too; its listener prefers the base: @champion stays v1, and
    # `promote` says the recorded test failed
    second, folder2 = register_required(server, root, "b", 1, 1.85)
    assert second["version"] == "2" and "waits for a listening test" in second["decision"]["reason"]
    key2 = json.loads((folder2 / KEY).read_text())
    against = root / "cy.json"
    against.write_text(json.dumps({**saved, "page": key2["page"], "listener": "cy", "trials": [
        {"id": t, "speaker": -v, "natural": -v} for t, v in preferring_fine_tune(key2).items()]}))
    capsys.readouterr()
    assert record(against, folder2, root, server) == 0
    out = capsys.readouterr().out
    assert "listening test failed (1 listener: cy)" in out and "@champion left alone" in out
    assert client.get_model_version_by_alias(name, "champion").version == "1"
    rc = main(["promote", "--version", "2", "--reason", "sounds good", "--tracking-uri", server,
               "--tracking-work", str(root / "work"), "--model", name])
    err = capsys.readouterr().err
    assert rc == 1 and "its recorded listening test failed" in err


def test_a_version_held_for_listening_says_what_it_lacks():
    assert missing_listening("3", {}) is None  # advisory (no mode tag): nothing
    assert "no listening test recorded" in missing_listening("3", {MODE_TAG: "required"})
    failed = missing_listening("3", {MODE_TAG: "required", VERDICT_TAG: "listening test failed (1 listener: "
                                     "ann): speaker: CMOS -2.00"})
    assert "failed" in failed and "listen-record" in failed
    assert missing_listening("3", {MODE_TAG: "required", VERDICT_TAG: "listening test passed (...)"}) is None


def judged(scores: list[int], listener: str = "ann") -> list[dict]:
    return [{"listener": listener, "speaker": s, "natural": s} for s in scores]


def test_the_figures_the_verdict_and_each_null_with_its_reason():
    worse = summarize(judged([-2, -1, -3, -2, -1, -2, -2, 1, -1, -2, -1, -2]))
    assert not worse["passed"] and "base's zero-shot clone is preferred" in worse["verdict"]
    speaker = worse["questions"]["speaker"]
    assert speaker["preference"] == 1 / 12 and speaker["preference_high"] < 0.5
    assert speaker["wilcoxon_p"] < 0.05
    equal = summarize(judged([0] * 8))["questions"]["speaker"]
    assert equal["preference"] is None and "every answer was 'equal'" in equal["preference_null_reason"]
    assert equal["wilcoxon_p"] is None and f"fewer than {MIN_NONZERO}" in equal["wilcoxon_null_reason"]
    assert summarize(judged([0] * 8))["passed"]  # no worse
    few = summarize(judged([1, 2, 0, 0, 1]))
    assert few["questions"]["natural"]["wilcoxon_p"] is None and few["passed"]
    assert "prefers the fine-tune" in few["verdict"]


@pytest.fixture
def answered(page, tmp_path) -> tuple[Path, dict]:
    key = json.loads((page / KEY).read_text())
    answers = {"format": "voxpipe-listening-answers/1", "page": key["page"], "listener": "ann",
               "trials": [{"id": t, "speaker": 1, "natural": 0} for t in key["trials"]]}
    return tmp_path / "answers.json", answers


def refused(page: Path, path: Path, answers: dict | str | None, registered: Path | None = None,
            capsys=None) -> str:
    if answers is not None:
        path.write_text(answers if isinstance(answers, str) else json.dumps(answers))
    rc = main(["listen-record", "--answers", str(path), "--key", str(page / KEY), "--registered",
               str(registered or page / "registered.json"), "--tracking-uri", "http://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_wrong_answers_are_refused_in_one_paragraph_before_mlflow_is_asked(page, answered, capsys):
    path, good = answered
    trials = good["trials"]
    cases = {
        "another listening page": {**good, "page": "0123456789abcdef"},
        "trials unanswered (t": {**good, "trials": trials[:-2]},
        "both questions each": {**good, "trials": [{**trials[0], "natural": None}, *trials[1:]]},
        "no listener id": {**good, "listener": "  "},
        "not on the scale": {**good, "trials": [{**trials[0], "speaker": 7}, *trials[1:]]},
        "are not on the page": {**good, "trials": [*trials, {"id": "t99", "speaker": 1, "natural": 1}]},
        "not a listening test's answers": {"page": good["page"]},
        "cannot read listening-test answers": "{ half",
    }
    for expected, answers in cases.items():
        assert expected in refused(page, path, answers, capsys=capsys), expected
    assert "--answers FILE" in refused(page, page / "none.json", None, capsys=capsys)  # no such file
    capsys.readouterr()
    assert main(["listen-record", "--key", str(page / KEY)]) == 1
    assert "listen.answers is not set" in capsys.readouterr().err
    # a sweep's child run: no model version to tag
    sweep = page / "sweep-registered.json"
    sweep.write_text(json.dumps({"name": "voxpipe-x", "run_id": "abc", "sweep": {}}))
    assert "sweep's child run" in refused(page, path, good, sweep, capsys=capsys)
    # the page changed since the key was sealed: which side is which is unknown
    (page / PAGE).write_text((page / PAGE).read_text().replace("Trial 1 of", "Trial one of"))
    assert "is not the page" in refused(page, path, good, capsys=capsys)
    (page / KEY).write_text(json.dumps({"trials": []}))
    assert "not a listening-test key" in refused(page, path, good, capsys=capsys)

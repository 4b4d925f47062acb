"""What the UIs show, checked in headless Chromium (Debian package `chromium`): the evaluation page the KFP
UI shows (plots and playable samples embedded), and the MLflow UI's model-training view of the experiment
with the run's description."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from mlflow import MlflowClient

from voxpipe.evaluate.pages import eval_page, headline_rows, summary_markdown
from voxpipe.track.artifacts import PipelineArtifacts
from voxpipe.track.note import NOTE_TAG, run_note
from voxpipe.track.tracking import EXPERIMENT_KIND, experiment_id

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed (Debian: apt-get install chromium; .ci/run"
    " does it)"
)
CHECK = """<script>
window.addEventListener('load', async () => {
  const imgs = [...document.images].map(i => i.naturalWidth);
  const audio = await Promise.all([...document.querySelectorAll('audio')].map(a => new Promise(done => {
    a.preload = 'auto'; a.onloadedmetadata = () => done(a.duration); a.onerror = () => done(-1); a.load();
  })));
  document.body.setAttribute('data-check', JSON.stringify({imgs, audio}));
});
</script></body>"""


def eval_json() -> dict:
    criteria = [{"name": "loss", "candidate": 1.9, "reference": 2.0, "limit": 1.99, "passed": True,
                 "detail": "1.9 < 2.0 - spread"},
                {"name": "similarity[spk]", "candidate": 0.7, "reference": 0.6, "limit": 0.55, "passed": True,
                 "detail": "0.70 >= 0.55"}]
    return {"loss_model": 1.9, "loss_baseline": 2.0, "similarity_to_speaker_mean": 0.7,
            "similarity_to_speaker_baseline": 0.6, "stop_failure_rate": 0.0, "wer": 0.4, "improved": 1,
            "verdict": "fine-tuned fixed-seed loss beats the baseline's", "promotion": {
                "promoted": True, "against": "baseline", "criteria": criteria},
            "utterances": {"model": [{"name": "000-spk-ref", "text": "hello there"}]}}


@pytest.fixture
def eval_folder(tmp_path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = tmp_path / "eval"
    (folder / "samples").mkdir(parents=True)
    (folder / "eval.json").write_text(json.dumps(eval_json()))
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1, 2], [2.0, 1.95, 1.9])
    fig.savefig(folder / "eval.png")
    plt.close(fig)
    t = np.arange(48000) / 48000
    for name, seconds in (("model-000-spk-ref", 1.0), ("baseline-000-spk-ref", 0.5)):
        tone = 0.2 * np.sin(2 * np.pi * 220 * t[: int(48000 * seconds)])
        sf.write(folder / "samples" / f"{name}.wav", tone.astype(np.float32), 48000, subtype="PCM_16")
    return folder


def chromium(*args: str, timeout: float = 120) -> str:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--window-size=1400,1000", "--virtual-time-budget=20000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True).stdout


def page_check(page: Path, tries: int = 3) -> tuple[dict, str]:
    """What CHECK found on the page, and the DOM it found it in. Virtual time does not wait for the media
    pipeline, so on a loaded machine Chromium can dump the DOM before the audio has reported (CI saw it
    once): the dump is taken again, and a page whose check never ends fails with the end of the DOM."""
    for _ in range(tries):
        dom = chromium("--dump-dom", page.as_uri())
        found = re.search(r"data-check=\"([^\"]*)\"", dom)
        if found:
            return json.loads(html.unescape(found[1])), dom
    pytest.fail(f"the page's check did not finish in {tries} Chromium runs; the last DOM ends: {dom[-500:]}")


def test_summary_markdown_is_the_verdict_and_a_table():
    text = summary_markdown(eval_json())
    assert text.startswith("# Evaluation: PROMOTE (against baseline)")
    assert "| fixed-seed val loss | 1.90000 | 2.00000 |" in text
    assert "| similarity to speaker | 0.700 | 0.600 |" in text
    assert "| similarity[spk] | pass | 0.70 >= 0.55 |" in text
    only_loss = summary_markdown({"loss_model": 1.0})  # only what eval.json has
    assert "| fixed-seed val loss | 1.00000 | n/a |" in only_loss and "similarity" not in only_loss


def test_the_summary_and_the_page_show_each_paired_gain_as_gain_low_high_and_the_tolerances_source(tmp_path):
    from voxpipe.evaluate.gains import Gain

    gains = {"similarity": Gain(0.012, -0.004, 0.03, 16, ["speaker", "reference"]).as_dict(),
             "wer": Gain(None, None, None, 0, [], "no clip has this figure from both checkpoints").as_dict()}
    figures = {**eval_json(), "gains": gains, "tolerance_source": "the noise floor of work/eval/noise.json"}
    text = summary_markdown(figures)
    assert "| similarity | +0.0120 [-0.0040, +0.0300] |" in text
    assert "| wer | n/a (no clip has this figure from both checkpoints) |" in text
    assert "Tolerances: the noise floor of work/eval/noise.json" in text
    (tmp_path / "eval.json").write_text(json.dumps(figures))
    assert "+0.0120 [-0.0040, +0.0300]" in html.unescape(eval_page(tmp_path))
    assert "Paired gains" not in summary_markdown(eval_json())  # an older eval.json: nothing invented


def test_a_real_eval_json_reads_as_a_report_with_every_baseline_and_each_n_a_with_its_reason():
    """On what evaluate writes (the demo's committed eval.json), not a hand-made dict: the summary is a
    criterion table with one similarity figure, its definition and ceiling; the run description's figures
    all have their baselines."""
    from voxpipe.evaluate.step import EvaluateResult

    figures = json.loads((Path(__file__).resolve().parents[1] / "work/eval/eval.json").read_text())
    figures["intelligibility"] = {"model": {"en": {"metric": "wer", "reason": None}}}  # English only
    text = EvaluateResult(Path("work/eval"), figures, figures["verdict"]).summary()
    lines = text.splitlines()
    assert lines[0].startswith("evaluate: PROMOTE (against baseline) -> work/eval/eval.json")
    assert lines[1].split() == ["criterion", "candidate", "reference", "gain", "[95%", "interval]", "limit",
                                "pass"]
    assert any(line.split()[:2] == ["loss", f"{figures['loss_model']:.5f}"] for line in lines)
    assert "the real clips themselves score" in text and "cer (pocketsphinx): n/a: no Chinese row" in text
    assert len(text.splitlines()) < 20 and max(map(len, lines)) < 240
    rows = dict((label, (model, base)) for label, model, base in headline_rows(figures))
    assert rows["similarity to speaker"] == (f"{figures['similarity_to_speaker_mean']:.3f}",
                                             f"{figures['similarity_to_speaker_baseline']:.3f}")
    # a figure without a baseline is an error rate with no value at all, and it says why
    assert all(base != "n/a" or model.startswith("n/a (") for model, base in rows.values())
    assert all(base != "n/a" for label, (_, base) in rows.items()
               if label.startswith(("fixed-seed", "similarity to speaker")))
    assert rows["CER (pocketsphinx)"][0].startswith("n/a (no Chinese row")


@needs_chromium
@pytest.mark.slow
def test_eval_page_plays_its_samples_and_shows_its_plots_in_chromium(eval_folder, tmp_path):
    page = eval_page(eval_folder)
    assert page.count("<audio") == 2 and page.count("<img") == 1 and "hello there" in page
    assert "src='samples/" not in page  # embedded: the KFP UI's sandboxed frame fetches nothing
    checked = tmp_path / "checked.html"
    checked.write_text(page.replace("</body>", CHECK))
    result, _ = page_check(checked)
    assert all(width > 0 for width in result["imgs"]) and len(result["imgs"]) == 1
    assert sorted(round(d, 2) for d in result["audio"]) == [0.5, 1.0]  # both decode: they play
    shot = tmp_path / "eval.png"
    chromium(f"--screenshot={shot}", checked.as_uri())
    assert shot.stat().st_size > 10_000  # a rendered page, not a blank one


@needs_chromium
def test_mlflow_opens_the_experiment_as_model_training_with_the_run_description(server):
    client = MlflowClient(server)
    experiment = experiment_id(client, "voxpipe-ui", None)
    assert client.get_experiment(experiment).tags.items() >= EXPERIMENT_KIND.items()
    run = client.create_run(experiment, run_name="ui-run").info.run_id
    art = PipelineArtifacts(
        export=Path("export"), export_md5="x", model_config={}, train_dir=Path("train"),
        train_report={"steps": 40, "world_size": 2, "device_name": "cpu", "dtype": "float32", "lora": False,
                      "final": {"loss": 1.5}, "tokens_per_s": 900.0},
        metrics=[], eval_path=Path("eval.json"), eval=eval_json(), samples=[], mfu_path=Path("mfu.json"),
        mfu={"mfu": 0.0123, "peak_source": "test"}, data=None)
    note = run_note(art)
    assert note.startswith("**Evaluation: PROMOTE (against baseline): all 2 criteria pass.**\n")  # one line
    assert "40 steps, full fine-tune, 2 x cpu" in note
    client.set_tag(run, NOTE_TAG, note)
    # MLflow 3.17's UI picks its view from a global switch (?workflowType=, else GenAI); voxpipe's links
    # carry it, and the experimentKind tag is there for the versions that read it
    runs = chromium("--dump-dom", f"{server}/#/experiments/{experiment}?workflowType=machine_learning")
    assert "ui-run" in runs and ">Runs<" in runs
    page = chromium("--dump-dom", f"{server}/#/experiments/{experiment}/runs/{run}"
                                  "?workflowType=machine_learning")
    assert "Description" in page and "40 steps, full fine-tune, 2 x cpu" in page


SCROLL_ALL_GRIDS = """(async () => {
  const seen = [document.body.innerText];
  for (const grid of document.querySelectorAll('.ReactVirtualized__Grid')) {
    for (let y = 0; y <= grid.scrollHeight; y += grid.clientHeight / 2 || 100) {
      grid.scrollTop = y;
      grid.dispatchEvent(new Event('scroll'));
      await new Promise(done => setTimeout(done, 30));
      seen.push(grid.innerText);
    }
  }
  return seen.join('\\n');
})()"""


def stop_chromium(proc: subprocess.Popen) -> None:
    """End Chromium (started with start_new_session=True) and every process it started, and wait for them
    before its profile folder is removed: a helper process (the network service, the crash handler) that
    outlives the browser still writes into the profile, and removing it failed once with `OSError: [Errno
    39] Directory not empty: 'Default'`."""
    def signal_all(sig: int) -> bool:
        try:
            os.killpg(proc.pid, sig)
            return True
        except ProcessLookupError:
            return False

    signal_all(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        signal_all(signal.SIGKILL)
        proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while signal_all(0) and time.monotonic() < deadline:  # (a zombie left unreaped writes nothing)
        if time.monotonic() > deadline - 5:
            signal_all(signal.SIGKILL)
        time.sleep(0.1)


def scrolled_text(url: str, ready: str, timeout: float = 90) -> str:
    """The text of a page that shows long tables in virtual grids (the MLflow UI: only the rows in view are
    in the DOM), read while every grid is scrolled through: Chromium driven over its DevTools protocol
    (websocket-client, which the kubernetes client brings). `ready`: a text the page shows once loaded."""
    import tempfile
    import urllib.request

    import websocket

    with tempfile.TemporaryDirectory() as profile:
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--remote-debugging-port=0", f"--user-data-dir={profile}",
                "about:blank"]
        proc = subprocess.Popen([CHROMIUM, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + timeout
            while not port_file.is_file() or not port_file.read_text().strip():
                assert time.monotonic() < deadline, "Chromium did not open its DevTools port"
                time.sleep(0.2)
            port = port_file.read_text().split()[0]
            targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json").read())
            page = next(t for t in targets if t["type"] == "page")
            ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=timeout,
                                             suppress_origin=True)  # Chromium 156 refuses an unlisted Origin
            calls = iter(range(1, 10_000))

            def call(method: str, **params) -> dict:
                number = next(calls)
                ws.send(json.dumps({"id": number, "method": method, "params": params}))
                while True:
                    reply = json.loads(ws.recv())
                    if reply.get("id") == number:
                        return reply.get("result", {})

            def evaluate(expression: str) -> str:
                found = call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
                return str(found.get("result", {}).get("value", ""))

            call("Page.navigate", url=url)
            while ready not in evaluate("document.body ? document.body.innerText : ''"):
                assert time.monotonic() < deadline, f"{url} never showed {ready!r}"
                time.sleep(0.5)
            time.sleep(1)  # the last fetches settle
            text = evaluate(SCROLL_ALL_GRIDS)
            ws.close()
            return text
        finally:
            stop_chromium(proc)

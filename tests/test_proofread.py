"""Proofreading that DVC keeps: the page ingest writes (proofread.html) answered through its own controls in
headless Chromium, the corrections file it saves, and ingest applying that file on its next run (a fix
normalized as typed text, a drop quarantined, a line whose row or text no longer matches reported, not
applied), sharded or not; a malformed file is one paragraph before anything is ingested."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from devtools import chromium_devtools
from small_sample import write_small_sample
from test_ui import needs_chromium

from voxpipe.data.corrections import REASON, text_sha256
from voxpipe.data.data_report import PAGE as REPORT
from voxpipe.data.ingest_step import ingest
from voxpipe.data.proofread_page import PAGE
from voxpipe.errors import StepError
from voxpipe.steps.ingest import IngestParams

BIN = Path(sys.executable).parent
MISSING_ID = "0123456789abcdef"


def params(src: Path, out: Path, corrections: Path, **extra) -> IngestParams:
    return IngestParams(input=[str(src)], out=str(out), workers=1, score_quality=False,
                        corrections=str(corrections), **extra)


def rows_of(out: Path, name: str = "raw.jsonl") -> list[dict]:
    return [json.loads(line) for line in (out / name).read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def ingested(tmp_path_factory) -> tuple[Path, Path]:
    """(the input folder, its ingest with nothing proofread: no corrections file)."""
    root = tmp_path_factory.mktemp("proofread")
    src = write_small_sample(root / "in", per_speaker=3)
    ingest(params(src, root / "out", root / "none.jsonl"))
    return src, root / "out"


def write_lines(path: Path, lines: list[dict | str]) -> Path:
    text = "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
    path.write_text(text, encoding="utf-8")
    return path


def decision(row: dict, action: str, text: str | None = None, sha256: str | None = None) -> dict:
    return {"id": row["id"], "sha256": sha256 or text_sha256(row["text_raw"]), "action": action,
            **({"text": text} if text is not None else {})}


def test_ingest_applies_fix_drop_and_keep_and_reports_the_lines_that_no_longer_match(ingested, tmp_path):
    src, first = ingested
    rows = rows_of(first)
    fixed, dropped, kept, stale = rows[:4]
    corrections = write_lines(tmp_path / "corrections.jsonl", [
        decision(fixed, "fix", "  She paid $5 on   the 3rd.  "),
        decision(dropped, "drop"),
        decision(kept, "keep"),
        decision(stale, "fix", "not this", sha256=text_sha256("the text someone proofread before")),
        {"id": MISSING_ID, "sha256": text_sha256("gone"), "action": "drop"},
    ])
    out = tmp_path / "out"
    result = ingest(params(src, out, corrections))
    after = {r["id"]: r for r in rows_of(out)}
    assert after[fixed["id"]]["text_raw"] == "  She paid $5 on   the 3rd.  "
    assert after[fixed["id"]]["text"] == "She paid five dollars on the third."  # the typed text's normalizer
    assert after[fixed["id"]]["review"] == {"action": "fix", "line": 1, "text_before": fixed["text_raw"]}
    assert dropped["id"] not in after
    quarantined = rows_of(out, "quarantine.jsonl")
    assert [(q["id"], q["reason"]) for q in quarantined] == [(dropped["id"], REASON)]
    assert after[kept["id"]]["text"] == kept["text"] and after[kept["id"]]["review"]["action"] == "keep"
    assert after[stale["id"]]["text"] == stale["text"] and "review" not in after[stale["id"]]
    report = json.loads((out / "report.json").read_text())
    review = report["corrections"]
    assert review["applied"] == {"keep": 1, "fix": 1, "drop": 1} and review["lines"] == 5
    assert [(c["line"], c["id"]) for c in review["not_applied"]] == [(4, stale["id"]), (5, MISSING_ID)]
    assert "sha256 differs" in review["not_applied"][0]["why"] and "no row" in review["not_applied"][1]["why"]
    assert report["reasons"][REASON] == 1 and report["rows_kept"] == len(rows) - 1
    assert "corrections: keep 1, fix 1, drop 1, 2 not applied (report.json)" in result.summary()
    page = (out / REPORT).read_text(encoding="utf-8")
    assert "5 corrections in" in page and "applied keep 1, fix 1, drop 1; 2 not applied." in page
    assert f"<td>{MISSING_ID}</td>" in page and f"<td>{stale['id']}</td>" in page
    assert f"<td>{REASON}</td><td>1</td>" in page
    # the next page starts from what was applied (the fix under the hash of the text as ingested)
    proofread = (out / PAGE).read_text(encoding="utf-8")
    embedded = json.loads(proofread.split("id='decisions'>")[1].split("</script>")[0])
    assert [d["id"] for d in embedded] == [fixed["id"], dropped["id"], kept["id"]]
    assert f"data-sha256='{text_sha256(fixed['text_raw'])}'" in proofread

    # again: the same source text, the same corrections, the same rows (applied from the source each run)
    ingest(params(src, out, corrections))
    assert {r["id"]: r for r in rows_of(out)} == after


def test_a_sharded_ingest_applies_the_same_corrections(ingested, tmp_path):
    src, first = ingested
    rows = rows_of(first)
    corrections = write_lines(tmp_path / "corrections.jsonl", [decision(rows[0], "fix", "Two words."),
                                                               decision(rows[-1], "drop")])
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    ingest(params(src, single, corrections))
    ingest(params(src, sharded, corrections, shards=2))
    assert (sharded / "raw.jsonl").read_bytes() == (single / "raw.jsonl").read_bytes()
    assert json.loads((sharded / "report.json").read_text())["corrections"]["applied"]["drop"] == 1


@pytest.mark.parametrize(("line", "says"), [
    ("{not json", "line 2: not JSON"),
    ('["a list"]', "line 2: a JSON list, not an object"),
    ('{"id": "a", "sha256": "b", "action": "rename"}', "line 2: action 'rename' is none of keep, fix, drop"),
    ('{"id": "a", "sha256": "b", "action": "fix"}', "line 2: a fix without a new 'text'"),
    ('{"id": "a", "action": "drop"}', "line 2: no 'sha256' string"),
    ('{"id": "x", "sha256": "b", "action": "drop"}', "line 2: row 'x' is decided again (first on line 1)"),
])
def test_a_malformed_corrections_file_is_one_paragraph_before_anything_is_ingested(tmp_path, line, says):
    corrections = write_lines(tmp_path / "c.jsonl", ['{"id": "x", "sha256": "b", "action": "keep"}', line])
    out = tmp_path / "out"
    with pytest.raises(StepError) as e:
        ingest(params(tmp_path / "never-read", out, corrections))
    assert str(e.value).startswith(f"the corrections file {corrections}, {says}")
    assert "Save it again from the page" in str(e.value) and "nothing was ingested yet" in str(e.value)
    assert not (out / "raw.jsonl").exists()


def test_a_folder_or_a_file_that_is_not_text_is_refused_too(tmp_path):
    (tmp_path / "folder").mkdir()
    binary = tmp_path / "c.jsonl"
    binary.write_bytes(b'{"id": "a", "sha256": "b", "action": "keep"}\n\xff\xfe\n')
    for path, says in ((tmp_path / "folder", "cannot be read (Is a directory)"),
                       (binary, "line 2: not UTF-8")):
        with pytest.raises(StepError) as e:
            ingest(params(tmp_path / "never-read", tmp_path / "out", path))
        assert str(e.value).startswith(f"the corrections file {path}") and says in str(e.value)


def test_the_cli_says_it_in_one_paragraph(ingested, tmp_path):
    src, _ = ingested
    corrections = write_lines(tmp_path / "c.jsonl", ["", "{oops"])
    proc = subprocess.run([str(BIN / "voxpipe"), "ingest", "--input", str(src), "--out", str(tmp_path / "o"),
                           "--corrections", str(corrections)], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert f"the corrections file {corrections}, line 2: not JSON" in proc.stderr


# -- the page, through its own controls in headless Chromium -------------------------------------------
@contextlib.contextmanager
def devtools(downloads: Path) -> Iterator:
    """A headless Chromium tab (tests/devtools.py), downloads let into `downloads`; yields its
    `call(method, **params)`."""
    with chromium_devtools() as tab:
        tab.call("Browser.setDownloadBehavior", browser=True, behavior="allow", downloadPath=str(downloads))
        yield tab.call


def run(call, expression: str) -> str:
    found = call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
    return str(found.get("result", {}).get("value", ""))


def open_page(call, page: Path, deadline: float) -> None:
    call("Page.navigate", url=page.as_uri())
    loaded = "document.readyState === 'complete' && document.getElementById('save') ? 'y' : ''"
    while run(call, loaded) != "y":
        assert time.monotonic() < deadline, "the page did not load"
        time.sleep(0.2)


def press(call, row_id: str, button: str) -> str:
    """Click the row's button; the decision the row then shows."""
    return run(call, f"(() => {{ const s = document.querySelector('section[data-id=\"{row_id}\"]'); "
                     f"s.querySelector('button.{button}').click(); return s.dataset.decision; }})()")


def type_into(call, row_id: str, text: str) -> None:
    run(call, f"(() => {{ const box = document.querySelector('section[data-id=\"{row_id}\"] textarea'); "
              f"box.focus(); box.value = {json.dumps(text)}; box.dispatchEvent(new Event('input')); }})()")


def save(call, downloads: Path, deadline: float) -> list[dict]:
    run(call, "document.getElementById('save').click()")
    saved = downloads / "corrections.jsonl"
    while not saved.is_file():
        assert time.monotonic() < deadline, f"no download: {run(call, 'document.body.innerText')[-300:]}"
        time.sleep(0.2)
    time.sleep(0.3)  # the download's rename is its last step
    lines = [json.loads(line) for line in saved.read_text(encoding="utf-8").splitlines()]
    saved.rename(downloads / f"saved-{time.monotonic_ns()}.jsonl")
    return lines


@needs_chromium
def test_corrections_saved_through_the_page_change_the_text_on_the_next_ingest(ingested, tmp_path):
    """Flag one row (needs_review, as the recogniser does), open the page: it comes first with its reason;
    edit one row's text and press fix, drop another, keep the flagged one, save; the file holds exactly
    those three lines, and the next ingest applies them. Then a second session: the page of that ingest
    starts from the applied decisions, loads a file saved meanwhile, and saves all of them."""
    src, first = ingested
    rows = rows_of(first)
    fixed, dropped, flagged = rows[0], rows[1], rows[4]
    flagged_line = json.dumps({**flagged, "needs_review": True, "review_reason": "confidence -1.9 < -1.0",
                               "asr": "pocketsphinx", "asr_confidence": -1.9})
    (first / "raw.jsonl").write_text("".join(
        (flagged_line if r["id"] == flagged["id"] else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    from voxpipe.data.data_report import write_data_report

    write_data_report(first)
    page = first / PAGE
    html = page.read_text(encoding="utf-8")
    assert html.index(f"data-id='{flagged['id']}'") < html.index(f"data-id='{fixed['id']}'")  # flagged first
    assert "needs review: confidence -1.9 &lt; -1.0" in html and "asr_confidence: -1.9" in html
    assert f"src='{flagged['audio']}'" in html and (first / flagged["audio"]).is_file()  # beside the page
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    with devtools(downloads) as call:
        deadline = time.monotonic() + 90
        open_page(call, page, deadline)
        totals = run(call, "document.getElementById('totals').textContent")
        assert totals == f"{len(rows)} rows, 1 need review (first)."
        played = run(call, f"new Promise(done => {{ const a = document.querySelector("
                           f"'section[data-id=\"{flagged['id']}\"] audio'); a.preload = 'auto'; "
                           "a.onloadedmetadata = () => done(String(a.duration)); "
                           "a.onerror = () => done('error'); a.load(); })")
        assert abs(float(played) - flagged["duration"]) < 0.05, played  # the clip, linked beside the page
        run(call, "document.getElementById('only-review').click()")
        assert run(call, "String(document.querySelectorAll('section.row:not([hidden])').length)") == "1"
        run(call, "document.getElementById('only-review').click()")
        type_into(call, fixed["id"], "It costs $12 today.")
        assert [press(call, fixed["id"], "fix"), press(call, dropped["id"], "drop"),
                press(call, flagged["id"], "keep")] == ["fix", "drop", "keep"]
        lines = save(call, downloads, deadline)
        assert run(call, "document.getElementById('status').textContent").startswith(
            "Saved 3 decisions (fix 1, drop 1, keep 1) as corrections.jsonl")
    assert lines == [decision(fixed, "fix", "It costs $12 today."), decision(dropped, "drop"),
                     decision(flagged, "keep")]

    corrections = write_lines(tmp_path / "corrections.jsonl", lines)
    out = tmp_path / "out"
    ingest(params(src, out, corrections))
    after = {r["id"]: r for r in rows_of(out)}
    assert after[fixed["id"]]["text"] == "It costs twelve dollars today."
    assert dropped["id"] not in after and after[flagged["id"]]["review"]["action"] == "keep"

    # the second session: starts from the three applied, loads a file with one more, saves all four
    more = write_lines(tmp_path / "more.jsonl", [decision(rows[2], "drop")])
    with devtools(downloads) as call:
        deadline = time.monotonic() + 90
        open_page(call, out / PAGE, deadline)
        document = call("DOM.getDocument")
        node = call("DOM.querySelector", nodeId=document["root"]["nodeId"], selector="#load")
        call("DOM.setFileInputFiles", files=[str(more)], nodeId=node["nodeId"])
        while not run(call, "document.getElementById('status').textContent").startswith("Loaded 1 decisions"):
            assert time.monotonic() < deadline, run(call, "document.getElementById('status').textContent")
            time.sleep(0.2)
        shown = f"document.querySelector('section[data-id=\"{rows[2]['id']}\"]').dataset.decision"
        assert run(call, shown) == "drop"
        assert press(call, fixed["id"], "keep") == "fix"  # keep on a row fixed before keeps its fix
        again = save(call, downloads, deadline)
    assert again == [*lines, decision(rows[2], "drop")]


# -- DVC keeps it: the corrections file is a dep of the ingest stage ---------------------------------------
@pytest.mark.slow
def test_a_changed_corrections_file_reruns_ingest_under_dvc_and_only_then_changes_the_text(tmp_path):
    """`dvc repro ingest` in a scratch git repo (test_dvc's helpers): with the empty corrections file
    nothing reruns; a saved correction changes nothing until the next `dvc repro`, which reruns ingest and
    applies it, and dvc.lock records the file's hash."""

    import yaml
    from test_dvc import commit, dvc, git_and_dvc_init, ran, scratch_repo, write_params

    repo = scratch_repo(tmp_path / "repo")
    write_small_sample(repo / "data" / "sample", per_speaker=2)
    write_params(repo, ingest={"workers": 1, "score_quality": False})
    git_and_dvc_init(repo)
    assert ran(dvc(repo, "repro", "ingest")) == ["ingest"]
    commit(repo, "ingested, nothing proofread")
    assert ran(dvc(repo, "repro", "ingest")) == []

    raw = repo / "work" / "ingest" / "raw.jsonl"
    before = raw.read_bytes()
    rows = [json.loads(line) for line in before.decode().splitlines()]
    write_lines(repo / "data" / "corrections.jsonl", [decision(rows[0], "fix", "Corrected for $3.")])
    assert raw.read_bytes() == before  # saved, not yet applied
    assert ran(dvc(repo, "repro", "ingest")) == ["ingest"]
    after = [json.loads(line) for line in raw.read_text().splitlines()]
    assert after[0]["text"] == "Corrected for three dollars." and after[1:] == rows[1:]
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["ingest"]
    assert any(d["path"] == "data/corrections.jsonl" and d["md5"] for d in lock["deps"])
    assert ran(dvc(repo, "repro", "ingest")) == []

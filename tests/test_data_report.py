"""The ingest's data report (data-report.html + .png): what it shows, rendered in headless Chromium."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from small_sample import write_small_sample
from test_ui import CHECK, chromium, needs_chromium, page_check

from voxpipe.data.data_report import EXAMPLES, FIGURE, PAGE
from voxpipe.data.ingest_step import ingest
from voxpipe.steps.ingest import IngestParams


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    folder = write_small_sample(tmp_path_factory.mktemp("report") / "in", per_speaker=6)
    table = pq.read_table(folder / "train.parquet")
    broken = pa.Table.from_pylist([{"audio": {"bytes": None, "path": None}, "text": "no audio here",
                                    "speaker": "spk_m"}], schema=table.schema)
    pq.write_table(pa.concat_tables([table, broken]), folder / "train.parquet")
    out = folder.parent / "out"
    ingest(IngestParams(input=[str(folder)], out=str(out), workers=1))
    return out


def test_the_report_lies_beside_report_json_and_says_what_was_ingested(ingested):
    page = (ingested / PAGE).read_text(encoding="utf-8")
    assert (ingested / FIGURE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "13 rows in, 12 kept" in page and "1 quarantined" in page
    assert "<td>spk_f</td><td>6</td>" in page and "<td>spk_m</td><td>6</td>" in page
    assert "<td>no_audio</td><td>1</td>" in page
    assert page.count("data:image/png;base64,") == 1  # embedded: KFP's sandboxed frame fetches nothing
    assert "The 10 lowest by DNSMOS overall" in page


@pytest.mark.slow
def test_rerun_gives_the_same_report(ingested, tmp_path):
    src = ingested.parent / "in"
    ingest(IngestParams(input=[str(src)], out=str(tmp_path / "again"), workers=1))
    for name in (PAGE, FIGURE):
        assert (tmp_path / "again" / name).read_bytes() == (ingested / name).read_bytes(), name


@needs_chromium
def test_the_report_renders_in_chromium(ingested, tmp_path):
    checked = tmp_path / "checked.html"
    checked.write_text((ingested / PAGE).read_text(encoding="utf-8").replace("</body>", CHECK))
    result, dom = page_check(checked)
    assert result["imgs"] and all(width > 600 for width in result["imgs"])  # the figure decoded
    worst = dom.split('id="worst"')[1].split('id="best"')[0]
    assert worst.count("<tr>") == EXAMPLES + 1  # header + ten rows
    rows = [json.loads(line) for line in (ingested / "raw.jsonl").read_text().splitlines()]
    lowest = min(rows, key=lambda r: r["dnsmos"]["ovrl"])
    assert lowest["id"] in worst.split("</tr>")[1]  # the lowest first
    shot = tmp_path / "report.png"
    chromium(f"--screenshot={shot}", checked.as_uri())
    assert shot.stat().st_size > 10_000


def test_an_empty_chart_is_a_sentence(tmp_path):
    """Nothing quarantined, quality not scored: those panels (and the reasons table) say so in words
    instead of drawing empty axes; the panels with data keep their bars."""
    from voxpipe.data.data_report import _draw, _Figures

    figures = _Figures()
    figures.add(0, {"id": "a", "speaker": "spk", "duration": 2.0, "lufs_raw": -20.0, "text": "hi",
                    "text_raw": "hi"})
    fig = _draw(figures, {"no_audio": 0})
    said = {ax.get_title(): [t.get_text() for t in ax.texts] for ax in fig.axes}
    assert said["quarantined rows by reason"] == ["nothing was quarantined"]
    assert said["DNSMOS P.835"] == ["quality was not scored (ingest.score_quality)"]
    assert said["clip duration (after trimming)"] == [] and said["loudness as recorded (BS.1770)"] == []
    bars = _draw(figures, {"no_audio": 2}).axes[3]
    assert not bars.texts and [p.get_width() for p in bars.patches] == [2]

    folder = write_small_sample(tmp_path / "in", per_speaker=2)
    ingest(IngestParams(input=[str(folder)], out=str(tmp_path / "out"), workers=1, score_quality=False))
    page = (tmp_path / "out" / PAGE).read_text(encoding="utf-8")
    assert "0 quarantined" in page and "<p>nothing was quarantined</p>" in page
    assert "<td>none</td>" not in page

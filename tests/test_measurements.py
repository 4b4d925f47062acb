"""docs/measurements.md is generated from the benchmarks' recorded runs (benchmarks/results/*.json) by
tools/measurements.py, so a figure lives once, dated, with its machine; `make generate-check` fails when
the page and the files disagree."""

import json
import subprocess
import sys
from pathlib import Path

from tools.measurements import RESULTS, markdown, record

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "measurements.md"


def test_the_page_is_current():
    assert DOC.read_text(encoding="utf-8") == markdown(), "docs/measurements.md is stale: run `make generate`"


def test_every_recorded_run_has_its_section_with_machine_and_date():
    page = DOC.read_text(encoding="utf-8")
    for path in RESULTS.glob("*.json"):
        data = json.loads(path.read_text(encoding="utf-8"))
        assert f"\n## {path.stem}\n" in page and data["date"] in page and data["machine"] in page


def test_a_recorded_run_renders_its_figures_and_null_reasons(tmp_path):
    figures = {"ratio_ours_over_upstream": 0.4937, "runs": [{"mfu": None, "mfu_null_reason": "no GPU here"}]}
    record("toy", figures, "benchmarks/toy.py --smoke", "a test machine", "Written by the test.", tmp_path)
    page = markdown(tmp_path)
    assert "## toy" in page and "`benchmarks/toy.py --smoke` on a test machine" in page
    assert "0.4937" in page and "null: no GPU here" in page and "mfu_null_reason" not in page
    assert "[toy](#toy)" in page and "`ratio_ours_over_upstream` 0.4937" in page  # the index line


def test_record_reads_the_benchmarks_stdout(tmp_path):
    """`python benchmarks/x.py | tools/measurements.py record x`: stdin's one JSON object, or one line."""
    script = str(ROOT / "tools" / "measurements.py")
    bad = subprocess.run([sys.executable, script, "record", "x", "--command", "c"], input="not json",
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "not the benchmark's one JSON object" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_generate_check_flags_a_stale_page(tmp_path, monkeypatch, capsys):
    """`make generate-check` on a copy of the repo whose results file changed after the page was made:
    it fails naming docs/measurements.md; `make generate` rewrites the page, and the check passes."""
    import shutil

    import tools.generate as generate

    (tmp_path / "tools").mkdir()
    shutil.copy(ROOT / "tools" / "measurements.py", tmp_path / "tools")
    shutil.copytree(RESULTS, tmp_path / "benchmarks" / "results")
    shutil.copytree(ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("params.md"))
    serve = tmp_path / "benchmarks" / "results" / "serve.json"
    data = json.loads(serve.read_text(encoding="utf-8"))
    data["figures"]["real_time_factor"] = 0.25
    serve.write_text(json.dumps(data), encoding="utf-8")
    monkeypatch.setattr(generate, "ROOT", tmp_path)
    monkeypatch.setattr(generate, "GENERATED", {"docs/measurements.md": generate.measurements_md})
    assert generate.main(["--check"]) == 1
    assert "stale generated files: docs/measurements.md" in capsys.readouterr().err
    assert generate.main([]) == 0 and generate.main(["--check"]) == 0
    assert "`real_time_factor` 0.25" in (tmp_path / "docs" / "measurements.md").read_text(encoding="utf-8")

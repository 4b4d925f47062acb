"""evaluate's progress off a terminal (a pod, CI, a pipe): log lines, never a bar redrawn with `\\r`."""

from __future__ import annotations

import logging

from voxpipe.progress import Progress


def test_off_a_terminal_a_stage_logs_lines_at_most_every_n_seconds_and_when_it_ends(caplog, capsys):
    log = logging.getLogger("voxpipe.test.progress")
    with caplog.at_level(logging.INFO, logger=log.name):
        with Progress(3, "model generate", log, unit="utt", every_s=0.0) as bar:
            for _ in range(3):
                bar.update()
        with Progress(100, "model score", log, unit="utt", every_s=3600.0) as bar:
            bar.update(100)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[:2] == [line for line in lines[:2] if line.startswith("model generate: ")]
    assert lines[2].startswith("model generate: 3/3 utt") and "eta 0 s" in lines[2]
    assert [line for line in lines if line.startswith("model score")] == [lines[-1]]  # only the end
    assert lines[-1].startswith("model score: 100/100 utt")
    assert "\r" not in capsys.readouterr().err

"""Step reports shared by every step.

A step's folder holds two records. `report.json` says what the step produced (counts, hashes,
settings, library versions): it is byte-identical for the same inputs, params and code, so DVC can
hash it and a rerun that changed nothing stops the pipeline there. `run.json` says how this run
went (timings, host, resume, reuse counts); it differs on every run, so `.dvcignore` hides it from DVC.
"""

from __future__ import annotations

import json
import os
import platform
import socket
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from voxpipe import __version__, files
from voxpipe.secrets import scrub


def write_json(path: Path, data: Any) -> None:
    """Reports and records: secret values (voxpipe/secrets.py) never reach the file."""
    files.atomic_write_text(path, scrub(json.dumps(data, indent=2, sort_keys=True)) + "\n")


def versions() -> dict[str, str]:
    """The installed versions of the libraries the results depend on: always the same list, whatever the
    process happened to import (a step run inside a KFP task and one run from a test must agree)."""
    out = {"voxpipe": __version__, "python": platform.python_version()}
    for name in ("torch", "numpy", "pyarrow", "soundfile", "soxr"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


RUN_FACTS = "run.json"  # named in .dvcignore


def write_report(out_dir: Path, report: dict[str, Any], run: dict[str, Any] | None = None) -> Path:
    """`out_dir/report.json`: the step's result plus the versions that produced it; `out_dir/run.json`:
    `run` (timings, reuse counts: whatever differs between two runs on the same inputs) plus the host."""
    path = Path(out_dir) / "report.json"
    write_json(path, {**report, "versions": versions()})
    host = {"host": socket.gethostname(), "pid": os.getpid(), "finished": datetime.now(UTC).isoformat()}
    write_json(Path(out_dir) / RUN_FACTS, {**(run or {}), **host})
    return path


def read_run(folder: Path) -> dict[str, Any]:
    """A step folder's run.json ({} where there is none, e.g. a folder checked out by `dvc pull`)."""
    path = Path(folder) / RUN_FACTS
    return files.read_json_object(path, "the run facts") if path.is_file() else {}

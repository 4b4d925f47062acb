"""Step reports and small atomic file writes shared by every step."""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

from voxpipe import __version__
from voxpipe.errors import StepError


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temp file + rename so readers never see a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from `path`; a StepError naming the file and `what` it should have been otherwise."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise StepError(f"{path}: cannot read {what}: {e}") from e
    if not isinstance(data, dict):
        raise StepError(f"{path}: {what} must be a JSON object")
    return data


def write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def versions() -> dict[str, str]:
    out = {"voxpipe": __version__, "python": platform.python_version()}
    for name in ("torch", "numpy", "pyarrow", "soundfile", "soxr"):
        mod = sys.modules.get(name)
        if mod is not None:
            out[name] = getattr(mod, "__version__", "?")
    return out


def write_report(out_dir: Path, report: dict[str, Any]) -> Path:
    """`out_dir/report.json` with the step's figures plus the versions that produced them."""
    path = Path(out_dir) / "report.json"
    write_json(path, {**report, "versions": versions()})
    return path

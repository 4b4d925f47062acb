"""Whose weights these are: a run's identity, recorded beside every export it writes.

A fresh `train` (`train.fresh_on_change`, `--no-resume`) used to leave `exports/step-40` of an earlier
run in place, and `evaluate` scored it as the user's own: had it won, `register` would have published
another run's weights as the user's voice. A run's identity is what its weights depend on, the
result-changing params (voxpipe/train/resume.py `result_params`) and the data version (DVC's md5 of
`train.data`, voxpipe/lineage.py). The trainer writes it into every export (`voxpipe-run.json`), into
each checkpoint's trainer.json and into report.json; `evaluate` scores only the exports whose identity
is that of the run in its `--model` folder, and lists the others with the reason.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from voxpipe.files import atomic_write_text
from voxpipe.lineage import dvc_md5

IDENTITY_FILE = "voxpipe-run.json"


# where the data and the base model lie says nothing about the weights (a fresh clone of the repo
# that `dvc pull`s them trains the same run): the identity names their content instead
LOCATIONS = ("train.data", "model.base")


def run_identity(result: dict[str, Any], data: Path) -> dict[str, Any]:
    """{"run": short hash, "params": result params (locations left out), "data_version": md5 of the
    training data, "base_version": md5 of the base checkpoint}."""
    params = {k: v for k, v in result.items() if k not in LOCATIONS}
    base = Path(result["model.base"])
    versions = {"data_version": dvc_md5(data) if data.exists() else None,
                "base_version": dvc_md5(base) if base.exists() else None}
    canonical = json.dumps({"params": params, **versions}, sort_keys=True, default=str)
    return {"run": hashlib.sha256(canonical.encode()).hexdigest()[:16], "params": params, **versions}


def write_identity(folder: Path, identity: dict[str, Any], step: int) -> None:
    text = json.dumps({**identity, "step": step}, indent=2, sort_keys=True)
    atomic_write_text(folder / IDENTITY_FILE, text)


def read_identity(folder: Path) -> dict[str, Any] | None:
    """The identity an export records (None: it records none, or not readably)."""
    try:
        found = json.loads((folder / IDENTITY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and "run" in found else None


def foreign_exports(root: Path, identity: dict[str, Any]) -> bool:
    """Does `root` (a run's exports/) hold a step export that is not this run's?"""
    if not root.is_dir():
        return False
    exports = [d for d in root.iterdir() if d.is_dir() and d.name.startswith("step-")]
    return any((read_identity(d) or {}).get("run") != identity["run"] for d in exports)


def _identity_in(path: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(path.read_text()).get("identity")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, dict) and "run" in found else None


def folder_run(run_dir: Path) -> tuple[dict[str, Any] | None, str]:
    """The identity of the run a train output folder holds, and where it was read.

    The newest checkpoint first (a fresh start moves older ones aside, so it is the current run even
    while that run is still going), then report.json (written when a run ends)."""
    checkpoints = run_dir / "checkpoints"
    if checkpoints.is_dir():
        steps = sorted(
            (int(d.name.removeprefix("step-")), d) for d in checkpoints.iterdir()
            if d.name.startswith("step-") and d.name.removeprefix("step-").isdigit()
        )
        for _, folder in reversed(steps):
            if (found := _identity_in(folder / "trainer.json")) is not None:
                return found, str(folder / "trainer.json")
    if (found := _identity_in(run_dir / "report.json")) is not None:
        return found, str(run_dir / "report.json")
    return None, ""

"""Whose weights these are: a run's identity, recorded beside every export it writes.

A fresh `train` (`train.fresh_on_change`, `--no-resume`) used to leave `exports/step-40` of an earlier
run in place, and `evaluate` scored it as the user's own: had it won, `register` would have published
another run's weights as the user's voice. A run's identity is what its weights depend on, the
result-changing params (voxpipe/train/resume.py `result_params`) and the data version (DVC's md5 of
`train.data`, voxpipe/lineage.py). The trainer writes it into every export (`voxpipe-run.json`), into
each checkpoint's trainer.json and into report.json; `evaluate` scores only the exports whose identity
is that of the run in its `--model` folder, and lists the others with the reason.

The identity is signed with the checkpoint key (voxpipe/integrity.py, as checkpoint manifests are) together
with the size and sha256 of every file of the export: a `voxpipe-run.json` copied into another run's
export, or one edited by hand, does not verify, and that export is not scored. The run folder's identity
is read from a checkpoint's trainer.json only once that file matches its signed manifest, and from
report.json only with its signature (`identity_hmac`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from voxpipe.files import atomic_write_text
from voxpipe.integrity import (
    KEY_ENV,
    IntegrityError,
    check_file,
    check_files,
    hash_files,
    listed_files,
    read_manifest,
    signature,
    signature_matches,
    user_key_path,
)
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


def write_identity(folder: Path, identity: dict[str, Any], step: int, key: bytes,
                   kind: dict[str, Any] | None = None) -> None:
    """voxpipe-run.json: the identity, the step and every file of the export, signed with `key`. Call it
    last, once the export's files are closed. `kind`: what weights these are when not the live ones
    (`{"kind": "ema", "ema_decay": 0.999}`, `{"kind": "average", "averaged": [...]}`), signed with the
    rest."""
    files = hash_files(folder, [n for n in listed_files(folder) if n != IDENTITY_FILE])
    payload = {**identity, **(kind or {}), "step": step, "files": files}
    text = json.dumps({**payload, "hmac": signature(key, payload)}, indent=2, sort_keys=True)
    atomic_write_text(folder / IDENTITY_FILE, text)


def read_identity(folder: Path) -> dict[str, Any] | None:
    """The identity an export claims, unverified (None: it records none, or not readably). To decide
    whose export it is, use `verified_identity`."""
    try:
        found = json.loads((folder / IDENTITY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and "run" in found else None


def verified_identity(folder: Path, key: bytes) -> dict[str, Any] | None:
    """The identity of the run that wrote the export in `folder`, once its signature and every file it
    lists check (None: there is no voxpipe-run.json). IntegrityError when there is one that does not
    verify."""
    path = Path(folder) / IDENTITY_FILE
    if not path.is_file():
        return None
    try:
        found = json.loads(path.read_text())
        claimed = found.pop("hmac", None)
        files = found.get("files")
    except (OSError, ValueError, AttributeError, KeyError, TypeError) as e:
        raise IntegrityError("bad-identity", f"{path}: unreadable ({e})") from e
    if "run" not in found:
        raise IntegrityError("bad-identity", f"{path}: names no run")
    if claimed is None:
        raise IntegrityError("unsigned", f"{path}: unsigned (written by a voxpipe that did not sign run "
                                         "identities, or by hand)")
    if not signature_matches(key, found, claimed):
        raise IntegrityError("bad-signature", f"{path}: its signature does not match: it was edited, or "
                                              f"signed with another key ({KEY_ENV} or {user_key_path()})")
    entries_ok = isinstance(files, dict) and all(
        isinstance(e, dict) and isinstance(e.get("size"), int) and isinstance(e.get("sha256"), str)
        for e in files.values())
    if not entries_ok:
        raise IntegrityError("bad-identity", f"{path}: malformed file entries")
    try:
        check_files(Path(folder), files, exact=True, where=path, ignore=(IDENTITY_FILE,))
    except IntegrityError as e:
        raise IntegrityError(
            "foreign-files", f"{path}: signed for other files than those beside it ({e}), so it was copied "
                             "from another export or the export changed after train wrote it") from e
    return found


def identity_or_why(folder: Path, key: bytes) -> tuple[dict[str, Any] | None, str]:
    """(`verified_identity`, "") or (None, why it is not this export's identity)."""
    try:
        found = verified_identity(folder, key)
    except IntegrityError as e:
        return None, str(e)
    return found, "" if found is not None else "it records no run identity (not written by voxpipe's train)"


def foreign_exports(root: Path, identity: dict[str, Any], key: bytes) -> bool:
    """Does `root` (a run's exports/) hold a step export that is not this run's (or does not verify)?"""
    if not root.is_dir():
        return False
    exports = [d for d in root.iterdir() if d.is_dir() and d.name.startswith("step-")]
    return any((identity_or_why(d, key)[0] or {}).get("run") != identity["run"] for d in exports)


def sign_report_identity(identity: dict[str, Any], key: bytes) -> str:
    """report.json's `identity_hmac`: report.json names the run only with it."""
    return signature(key, identity)


def _identity_in(path: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(path.read_text()).get("identity")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, dict) and "run" in found else None


def _checkpoint_identity(folder: Path, key: bytes) -> dict[str, Any] | None:
    """trainer.json's identity, once trainer.json matches the checkpoint's signed manifest."""
    try:
        entry = read_manifest(folder, key)["files"].get("trainer.json")
        if entry is None:
            return None
        check_file(folder / "trainer.json", entry)
    except IntegrityError:
        return None
    return _identity_in(folder / "trainer.json")


def _report_identity(path: Path, key: bytes) -> dict[str, Any] | None:
    """report.json's identity, once its `identity_hmac` checks."""
    found = _identity_in(path)
    try:
        claimed = json.loads(path.read_text()).get("identity_hmac")
    except (OSError, ValueError, AttributeError):
        return None
    return found if found is not None and signature_matches(key, found, claimed) else None


def folder_run(run_dir: Path, key: bytes) -> tuple[dict[str, Any] | None, str]:
    """The identity of the run a train output folder holds, and where it was read.

    The newest checkpoint whose trainer.json verifies first (a fresh start moves older ones aside, so it is
    the current run even while that run is still going), then a signed report.json (written when a run
    ends)."""
    checkpoints = run_dir / "checkpoints"
    if checkpoints.is_dir():
        steps = sorted(
            (int(d.name.removeprefix("step-")), d) for d in checkpoints.iterdir()
            if d.name.startswith("step-") and d.name.removeprefix("step-").isdigit()
        )
        for _, folder in reversed(steps):
            if (found := _checkpoint_identity(folder, key)) is not None:
                return found, str(folder / "trainer.json")
    if (found := _report_identity(run_dir / "report.json", key)) is not None:
        return found, str(run_dir / "report.json")
    return None, ""

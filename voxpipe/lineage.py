"""Where a run came from: data version (DVC's md5), git commit, KFP run id.

The data version is the md5 DVC itself records for a path (`dvc.lock`, `.dvc` files): a file's md5,
or for a folder the md5 of DVC's sorted JSON listing of (relpath, md5) plus ".dir". Computing it
here gives the same value with or without DVC installed, so an MLflow run and a DVC commit can be
matched by it. Like DVC, it leaves out the file names .dvcignore hides (a folder's run.json, the
timings of one run; the local key and hash cache); tests/test_dvc.py keeps the two lists equal.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

from voxpipe.files import file_digest
from voxpipe.report import RUN_FACTS


def md5_file(path: Path) -> str:
    """A file's md5 as DVC computes it."""
    return file_digest(path, "md5")


# the file names .dvcignore hides from DVC: md5s computed here must be the ones DVC computes
DVC_IGNORED = frozenset({RUN_FACTS, "file_hashes.json", ".voxpipe-key"})


def dvc_md5(path: Path) -> str:
    """DVC 3's md5 of a file or a folder (`<md5>.dir`)."""
    if path.is_file():
        return md5_file(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such file or folder")
    entries = [
        {"md5": md5_file(f), "relpath": f.relative_to(path).as_posix()}
        for f in path.rglob("*") if f.is_file() and f.name not in DVC_IGNORED
    ]
    entries.sort(key=lambda e: e["relpath"])
    listing = json.dumps(entries, sort_keys=True).encode()
    return hashlib.md5(listing, usedforsecurity=False).hexdigest() + ".dir"


# what the pipeline itself writes into a checkout: DVC's lock and the metrics it commits (work/). A run's
# own records changing says nothing about the code that ran, so they do not make it "dirty"
PIPELINE_RECORDS = (":(top,exclude)dvc.lock", ":(top,exclude)work")


def git_commit(cwd: Path | None = None) -> tuple[str | None, bool]:
    """(commit, dirty) of the code that ran: $VOXPIPE_GIT_COMMIT (baked into images), else `git`; dirty
    means a tracked file other than the pipeline's own records differs. "unknown" (images/Dockerfile's
    default when built without the build-arg) claims nothing."""
    baked = os.environ.get("VOXPIPE_GIT_COMMIT")
    if baked and baked != "unknown":
        return baked, False
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None, False
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ":/", *PIPELINE_RECORDS], cwd=cwd,
            capture_output=True, text=True, timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None, False
    return head.stdout.strip(), bool(status.stdout.strip())


def kfp_run_id() -> str | None:
    """The KFP pipeline run: KFP v2 sets no env var itself, so the component passes
    `dsl.PIPELINE_JOB_ID_PLACEHOLDER` into $KFP_RUN_ID."""
    return os.environ.get("KFP_RUN_ID") or None

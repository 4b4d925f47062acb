"""One writer per output folder: an exclusive lock on `--out`, and workers that die with their launcher.

Two runs writing one folder corrupt each other's checkpoints and shards, and the loser crashes far
from the cause. The lock is a `flock` on `.NAME.voxpipe-lock` next to the output folder NAME (beside
it, not inside: DVC hashes and deletes what is inside), held by the step's process (rank 0 under
torchrun) for the whole run. The kernel drops it when the holder dies, however it dies, so a
lock left by a dead process is never "stale": the file stays, but nobody holds it. The file names
the holder (pid, host, step) so that the second run's message can say who is writing.

torchrun starts its workers in their own sessions, so killing the launcher's process group leaves
them running (and writing). `die_with_launcher` asks the kernel to SIGKILL a worker when its parent
dies; checkpoints and shards are written atomically, so a kill at any moment leaves no half file.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from voxpipe.errors import StepError

LOCK_SUFFIX = ".voxpipe-lock"
_PR_SET_PDEATHSIG = 1


def prepare_output(out: Path) -> Path:
    """Create `out` (and its parents); a StepError naming the folder if it is a file or not writable."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise StepError(f"--out {out} is an existing file, not a folder; choose a folder path (the step "
                        "writes several files there)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StepError(f"--out {out}: cannot create the output folder ({e.strerror}); choose a writable "
                        "location") from None
    try:  # a real write: permission bits do not tell root about a read-only file system
        tempfile.TemporaryFile(dir=out).close()
    except OSError as e:
        raise StepError(f"--out {out}: the folder is not writable ({e.strerror}); choose a writable "
                        "location, or fix its permissions or mount") from None
    return out


def lock_path(out: Path) -> Path:
    out = Path(out).resolve()
    return out.parent / f".{out.name}{LOCK_SUFFIX}"


@contextmanager
def hold_output(out: Path, step: str) -> Iterator[None]:
    """Hold the exclusive lock on `out` while the block runs; a second holder gets a StepError."""
    out = prepare_output(out)
    path = lock_path(out)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise StepError(f"--out {out}: cannot create the lock file {path} ({e.strerror}); choose a writable "
                        "location") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise StepError(
                f"--out {out} is in use by another run ({_describe_holder(path)}); two runs writing one "
                "folder corrupt each other. Wait for it to finish, stop it, or choose another --out"
            ) from None
        _name_holder(fd, path, out, step)
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays (another run may already hold it)


def _name_holder(fd: int, path: Path, out: Path, step: str) -> None:
    """Write who holds the lock into it (for the next run's message). On a full volume this small write
    is the first to fail: a StepError naming the folder, before the step writes anything."""
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "step": step, "since": time.time()}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
    except OSError as e:
        full = e.errno in (errno.ENOSPC, errno.EDQUOT)
        raise StepError(
            f"--out {out}: cannot write the lock file {path} ({e.strerror}); "
            + ("the volume holding the output folder is full (or over its quota): free space there (`df -h "
               f"{out.parent}`) or choose an --out on a volume with room, then rerun; nothing was written yet"
               if full else "choose a writable location, or fix its permissions or mount")
        ) from None


def _describe_holder(path: Path) -> str:
    try:
        holder = json.loads(path.read_text(encoding="utf-8"))
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["since"]))
        return f"`voxpipe {holder['step']}`, pid {holder['pid']} on host {holder['host']}, since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown: the lock file is being written"


@contextmanager
def guard_step(out: str | None, step: str) -> Iterator[None]:
    """What every `voxpipe <step>` runs inside: workers die with torchrun; rank 0 holds `out`'s lock."""
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a torchrun worker
        die_with_launcher()
    if out is None or os.environ.get("RANK", "0") != "0":
        yield
        return
    with hold_output(Path(out), step):
        yield


def die_with_launcher() -> None:
    """On Linux, have the kernel SIGKILL this process when its parent (the launcher) exits."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the launcher died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)

"""Real servers for the tests (`mlflow server`, moto's S3), each in its own process group on 127.0.0.1."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MLFLOW = str(Path(sys.executable).with_name("mlflow"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(args: list[str], health: str, log: Path, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> Iterator[None]:
    """A server process (its own process group) until the block ends; up once `health` answers 200."""
    with log.open("w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 240
            while True:
                assert proc.poll() is None, log.read_text()[-3000:]
                try:
                    with urllib.request.urlopen(health, timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                assert time.monotonic() < deadline, f"{args[0]} did not come up:\n{log.read_text()[-3000:]}"
                time.sleep(0.3)
            yield
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


# MLflow's GenAI job runner (a runner and four huey consumers, each a process importing mlflow, started with
# every server): voxpipe submits no job, and the consumers can outlast SIGTERM by the 10 s `serving` waits
NO_JOBS = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


@functools.cache
def _migrated_once() -> Path:
    """One empty store migrated by voxpipe's own `sqlite_store.create`, in a folder removed at exit."""
    from voxpipe.track.sqlite_store import create

    folder = Path(tempfile.mkdtemp(prefix="voxpipe-mlflow-store-"))
    atexit.register(shutil.rmtree, folder, True)
    with warnings.catch_warnings():  # MLflow's own SQLAlchemy deprecation (`noload`), not ours to fix
        warnings.simplefilter("ignore", DeprecationWarning)
        create(folder / "mlflow.db")
    return folder / "mlflow.db"


def migrated_store(db: Path) -> Path:
    """An empty MLflow sqlite store at `db` whose schema is already migrated: a copy of one store this test
    process migrated once. MLflow runs its ~50 schema migrations on every new database file (about 10 s of
    a server's start on a loaded 2-core machine); a user pays that once, a test module per server."""
    shutil.copyfile(_migrated_once(), db)
    return db


@contextmanager
def mlflow_server(root: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`mlflow server` on a free port with a sqlite store (a new one migrated already: `migrated_store`)
    and artifacts under `root`; yields its URI. Without MLflow's job runner (`NO_JOBS`)."""
    if not (root / "mlflow.db").exists():
        migrated_store(root / "mlflow.db")
    env = {**(os.environ if env is None else env), **NO_JOBS}
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    args = [MLFLOW, "server", *extra, "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination", str(root / "artifacts")]
    with serving(args, f"{uri}/health", root / "server.log", env, cwd=root):
        yield uri

"""Real servers for the tests (`mlflow server`, moto's S3), each in its own process group on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
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


@contextmanager
def mlflow_server(root: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`mlflow server` on a free port with a sqlite store and artifacts under `root`; yields its URI."""
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    args = [MLFLOW, "server", *extra, "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination", str(root / "artifacts")]
    with serving(args, f"{uri}/health", root / "server.log", env, cwd=root):
        yield uri

"""Headless Chromium driven over its DevTools protocol, for tests that use a page's own controls (the
listening test, the proofreading page) or read a page that renders on scroll (the MLflow UI).

One helper, because the cleanup is the hard part: Chromium's renderer and utility processes outlive its
main process by a moment and keep writing into the profile folder, so removing the folder right after
`terminate()` failed with "Directory not empty: 'Default'" (CI, test_track.py). Chromium runs in a session
of its own here, and the whole process group is ended and waited for before the profile is removed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class DevTools:
    """A tab's socket and the browser's socket, with numbered calls; `deadline` bounds every wait."""

    tab: Any
    browser: Any
    deadline: float

    def __post_init__(self) -> None:
        self._numbers = iter(range(1, 1_000_000))

    def call(self, method: str, *, browser: bool = False, **params: Any) -> dict:
        sock = self.browser if browser else self.tab
        number = next(self._numbers)
        sock.send(json.dumps({"id": number, "method": method, "params": params}))
        while True:
            reply = json.loads(sock.recv())
            if reply.get("id") == number:
                assert "error" not in reply, reply
                return reply.get("result", {})

    def run(self, expression: str, await_promise: bool = False) -> str:
        """The value of a JavaScript expression in the tab, as a string."""
        found = self.call("Runtime.evaluate", expression=expression, awaitPromise=await_promise,
                          returnByValue=True)
        return str(found.get("result", {}).get("value", ""))

    def open(self, url: str, ready: str) -> None:
        """Navigate, then wait until the JavaScript expression `ready` is truthy."""
        self.call("Page.navigate", url=url)
        while self.run(f"({ready}) ? 'y' : ''") != "y":
            self.wait_a_little(f"{url} never became ready ({ready})")

    def wait_a_little(self, what: str) -> None:
        assert time.monotonic() < self.deadline, what
        time.sleep(0.2)


def _end_group(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM to Chromium's process group, then wait until no process of it is left (SIGKILL at the end)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    proc.wait(timeout=timeout)
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(proc.pid, signal.SIGKILL if time.monotonic() > deadline else 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


@contextmanager
def chromium_devtools(timeout: float = 90, window: str = "1400,1000") -> Iterator[DevTools]:
    import websocket  # websocket-client, which the kubernetes client brings

    with tempfile.TemporaryDirectory() as profile:
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={window}", "--remote-debugging-port=0", f"--user-data-dir={profile}",
                "about:blank"]
        proc = subprocess.Popen([CHROMIUM, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        sockets = []
        try:
            deadline = time.monotonic() + timeout
            port_file = Path(profile) / "DevToolsActivePort"
            while not port_file.is_file() or not port_file.read_text().strip():
                assert time.monotonic() < deadline, "Chromium did not open its DevTools port"
                time.sleep(0.2)
            base = f"http://127.0.0.1:{port_file.read_text().split()[0]}"
            version = json.loads(urllib.request.urlopen(f"{base}/json/version").read())
            targets = json.loads(urllib.request.urlopen(f"{base}/json").read())
            tab = next(t for t in targets if t["type"] == "page")
            for url in (tab["webSocketDebuggerUrl"], version["webSocketDebuggerUrl"]):
                # Chromium 156 refuses an unlisted Origin: send none
                sockets.append(websocket.create_connection(url, timeout=timeout, suppress_origin=True))
            yield DevTools(*sockets, deadline=deadline)
        finally:
            for sock in sockets:
                sock.close()
            _end_group(proc)

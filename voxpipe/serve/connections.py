"""The connections `voxpipe serve` holds, bounded: uvicorn's HTTP protocol (h11) with what uvicorn lacks, a
header timeout and a connection cap (uvicorn's own `limit_concurrency` answers every route 503, /health too,
and closes nothing; its `timeout_keep_alive` only runs between requests and stops at the first byte, so a
client trickling a request line held a file descriptor forever).

- A request's line and headers must be complete within `serve.header_timeout_s` of the connection opening
  (or of the last answer on a kept-alive one); else the connection is closed.
- A client that leaves its answer unread for `serve.stall_timeout_s` (the send buffer full all that time)
  is cut off: the request sees a disconnect, so a stream that nobody reads gives its slot back.
- At most `serve.max_connections` are open. A new one past the cap closes the oldest that is still waiting
  for its request (a slow or idle client, never one whose request is running). When every connection has a
  request running, PROBE_ROOM more are let in for the probes alone (/health, /ready: a 503 for any other
  route), and past those a new connection is closed at once: the file descriptors stay bounded, and
  `check_file_limit` makes sure they fit under the process's limit before the server starts.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import h11
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.h11_impl import H11Protocol

from voxpipe.errors import StepError

log = logging.getLogger("voxpipe.serve")
PROBES = ("/health", "/ready")  # what a connection past the cap may still ask
PROBE_ROOM = 8  # connections past the cap kept for the probes while every other one has a request running
# connections accepted in one go before the guard sees them (asyncio's accept loop takes up to the listen
# backlog at a time; uvicorn's default, 2048, took every file descriptor at once), and the kernel's queue
BACKLOG = 32
OTHER_FILES = 48  # the server's own (the listening socket, the event loop's, logs, the registry's database)


@dataclass
class Guard:
    """The shared state of every connection of one server."""

    header_timeout_s: float
    max_connections: int
    stall_timeout_s: float
    open: set[Any] = field(default_factory=set)
    waiting: dict[Any, None] = field(default_factory=dict)  # waiting for a request's headers, oldest first
    evicted: int = 0  # slow or idle connections closed to make room
    refused: int = 0  # connections closed at once: the cap and the probes' room were full


def check_file_limit(max_connections: int) -> None:
    """Raise the soft limit on open files up to the hard one if the cap needs it; a cap that does not fit is
    one paragraph before the server starts, not `Too many open files` tracebacks under load."""
    need = max_connections + PROBE_ROOM + 2 * BACKLOG + OTHER_FILES  # the cap's, and a batch closing
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard == resource.RLIM_INFINITY or hard >= need:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
            return
        raise StepError(f"serve.max_connections {max_connections}: it needs {need} open files (the cap, "
                        f"{PROBE_ROOM} for the probes, {2 * BACKLOG} accepted at once, {OTHER_FILES} for the "
                        "server's own), but this "
                        f"process may open at most {hard} (ulimit -n); lower serve.max_connections or raise "
                        "the limit")


def _probes_only(app: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    async def guarded(scope: dict, receive: Callable, send: Callable) -> None:
        if scope.get("type") == "http" and scope.get("path") not in PROBES:
            await service_unavailable(scope, receive, send)
            return
        await app(scope, receive, send)

    return guarded


def guarded_protocol(guard: Guard) -> type[H11Protocol]:
    """uvicorn's h11 protocol class with the header timeout and the connection cap of `guard`."""

    class Guarded(H11Protocol):
        _timer: asyncio.TimerHandle | None = None
        _stall: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(guard.open) >= guard.max_connections and not self._make_room():
                if len(guard.open) >= guard.max_connections + PROBE_ROOM:
                    guard.refused += 1
                    transport.abort()
                    return
                self.app = _probes_only(self.app)
            guard.open.add(self)
            self._arm()

        def _make_room(self) -> bool:
            for oldest in guard.waiting:
                guard.evicted += 1
                oldest._close("the connection cap (serve.max_connections) was reached")
                return True
            return False

        def _arm(self) -> None:
            self._disarm()
            self._timer = self.loop.call_later(guard.header_timeout_s, self._close,
                                               f"no complete request within {guard.header_timeout_s:g} s "
                                               "(serve.header_timeout_s)")
            guard.waiting[self] = None

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            guard.waiting.pop(self, None)

        def _close(self, why: str) -> None:
            self._disarm()
            log.debug("voxpipe serve: closed a connection from %s: %s", self.client, why)
            if not self.transport.is_closing():
                self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            if self._timer is not None and self.conn.their_state is not h11.IDLE:
                self._disarm()  # the headers are in; the body has its own limit (serve.body_timeout_s)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm()  # a kept-alive connection's next request gets the same time

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._stall is None:
                self._stall = self.loop.call_later(guard.stall_timeout_s, self._cut_off)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._stall is not None:
                self._stall.cancel()
                self._stall = None

        def _cut_off(self) -> None:
            self._stall = None
            log.debug("voxpipe serve: cut off %s: its answer unread for %g s (serve.stall_timeout_s)",
                      self.client, guard.stall_timeout_s)
            self.transport.abort()  # close() would wait to send what it does not read

        def connection_lost(self, exc: Exception | None) -> None:
            if self._stall is not None:
                self._stall.cancel()
                self._stall = None
            self._disarm()
            guard.open.discard(self)
            super().connection_lost(exc)

    return Guarded

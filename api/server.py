"""uvicorn's HTTP protocols with read deadlines, and the server options ``dpgov serve`` uses.

uvicorn closes idle keep-alive connections but waits forever for a request that is only partly
sent: a client that sends half a request line, or headers without their body, holds a
connection (and, with ``limit_concurrency``, a slot) for as long as it likes. These protocols
give each request a deadline for its headers (``header_timeout_seconds`` from the moment the
connection is ready for a request) and one for its body (``body_timeout_seconds`` from the end
of its headers); a connection that misses one is closed, with a 408 if no response is under
way. The limits are read from :class:`dp_governor.api.settings.Settings` once per process, like the
app's own settings (``dpgov serve`` puts them in every worker's environment).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import inspect
import os
import socket
import tempfile
from collections.abc import Callable
from typing import Any, Literal

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from dp_governor.api.settings import Settings

__all__ = [
    "DeadlineH11Protocol",
    "DeadlineHttpToolsProtocol",
    "PortInUse",
    "bind_port",
    "free_port",
    "report_start_failure",
    "run_server",
    "serve_options",
]

Phase = Literal["headers", "body"]
WORKER_HEALTHCHECK_SECONDS = 120


def _answer(status: str, text: str) -> bytes:
    """A whole plain-text HTTP/1.1 answer that closes the connection."""
    body = text.encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


_TIMED_OUT = _answer("408 Request Timeout", "the request was not sent in time")
_TOO_LARGE = _answer("431 Request Header Fields Too Large", "the request headers are too large")


@functools.cache
def _limits() -> tuple[float, float, int]:
    """``(header seconds, body seconds, max header bytes)`` from this process's settings."""
    s = Settings()
    return s.header_timeout_seconds, s.body_timeout_seconds, s.max_header_bytes


class ReadDeadline:
    """One timer per connection for the part of a request being read (headers or body)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, expire: Callable[[Phase], None]) -> None:
        self.header_seconds, self.body_seconds, self.max_header_bytes = _limits()
        self._loop = loop
        self._expire = expire
        self._timer: asyncio.TimerHandle | None = None
        self.phase: Phase | None = None

    def enter(self, phase: Phase | None) -> None:
        """Start ``phase``'s deadline; staying in the same phase keeps the running one."""
        if phase == self.phase:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.phase = phase
        if phase is not None:
            seconds = self.header_seconds if phase == "headers" else self.body_seconds
            self._timer = self._loop.call_later(seconds, self._fire)

    def _fire(self) -> None:
        phase, self.phase, self._timer = self.phase, None, None
        if phase is not None:
            self._expire(phase)


def _close(transport: asyncio.Transport, answer: bytes | None) -> None:
    if transport.is_closing():
        return
    if answer is not None:
        transport.write(answer)
    transport.close()


class DeadlineHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with read deadlines and a cap on header bytes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = ReadDeadline(self.loop, self._timed_out)
        self._in_message = False
        self._header_bytes = 0

    def _timed_out(self, phase: Phase) -> None:
        idle = self.cycle is None or self.cycle.response_complete
        _close(self.transport, _TIMED_OUT if phase == "headers" and idle else None)

    def _await_request(self) -> None:
        self._header_bytes = 0
        self.deadline.enter("headers")

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the first request's header deadline."""
        super().connection_made(transport)
        self._await_request()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the deadline."""
        self.deadline.enter(None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Parse; bytes that leave the headers still incomplete count toward their cap."""
        super().data_received(data)
        if self.deadline.phase == "headers" and self._in_message:
            self._header_bytes += len(data)
            if self._header_bytes > self.deadline.max_header_bytes:
                _close(self.transport, _TOO_LARGE)

    def on_message_begin(self) -> None:
        """A request starts (its header deadline is already running)."""
        super().on_message_begin()
        self._in_message = True

    def on_headers_complete(self) -> None:
        """The headers are in: the body's deadline starts."""
        super().on_headers_complete()
        self.deadline.enter("body")

    def on_message_complete(self) -> None:
        """The whole request is in: no deadline while the app answers."""
        self._in_message = False
        self.deadline.enter(None)
        super().on_message_complete()

    def on_response_complete(self) -> None:
        """Answered: wait for the next request under a new header deadline."""
        super().on_response_complete()
        if not self.transport.is_closing() and not self.pipeline and not self._in_message:
            self._await_request()


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with read deadlines (h11 itself caps header bytes)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = ReadDeadline(self.loop, self._timed_out)

    def _timed_out(self, phase: Phase) -> None:
        idle = self.cycle is None or self.cycle.response_complete
        _close(self.transport, _TIMED_OUT if phase == "headers" and idle else None)

    def _follow(self) -> None:
        state = self.conn.their_state
        if self.transport.is_closing():
            self.deadline.enter(None)
        elif state is h11.IDLE:
            self.deadline.enter("headers")
        elif state is h11.SEND_BODY:
            self.deadline.enter("body")
        else:
            self.deadline.enter(None)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the first request's header deadline."""
        super().connection_made(transport)
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the deadline."""
        self.deadline.enter(None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Parse, then follow the client's state: headers, body, or a whole request."""
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        """Answered (and any pipelined request started): follow the client's state."""
        super().on_response_complete()
        self._follow()


class PortInUse(OSError):
    """The address to listen on is taken (or not this machine's); the message names it."""


def bind_port(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0: a free port), as uvicorn would bind it.

    Bound before anything is announced, and handed to uvicorn, so that a port another
    process holds is one clear error up front (:class:`PortInUse`) rather than a banner
    followed by uvicorn's log line, and nobody can take the port in between.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # uvicorn's own choice
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        what = {
            errno.EADDRINUSE: "is in use by another process",
            errno.EACCES: "needs privileges this process lacks",
            errno.EADDRNOTAVAIL: "is not an address of this machine",
        }.get(exc.errno or 0, f"cannot be bound ({exc.strerror})")
        raise PortInUse(exc.errno, f"{host}:{port} {what}") from None
    sock.set_inheritable(True)  # the workers of --workers serve on it
    return sock


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` nobody listens on now: for a child process told which port to serve.

    An in-process server binds :func:`bind_port` ``(host, 0)`` and keeps the socket instead,
    so that nothing can take the port in between.
    """
    with bind_port(host, 0) as sock:
        return int(sock.getsockname()[1])


def serve_options(settings: Settings) -> dict[str, Any]:
    """The uvicorn options for these settings: protocol, keep-alive, header cap, limit."""
    try:
        import httptools  # noqa: F401
    except ImportError:  # uvicorn without its [standard] extras
        protocol = "dp_governor.api.server:DeadlineH11Protocol"
    else:
        protocol = "dp_governor.api.server:DeadlineHttpToolsProtocol"
    options: dict[str, Any] = {
        "http": protocol,
        "timeout_keep_alive": settings.keep_alive_seconds,
        "h11_max_incomplete_event_size": settings.max_header_bytes,
        "limit_concurrency": settings.limit_concurrency,
    }
    if "timeout_worker_healthcheck" in inspect.signature(uvicorn.Config).parameters:
        # With --workers, uvicorn kills a worker that does not answer its supervisor's ping
        # within this time, and a worker cannot answer while it is still importing: the default
        # 5 s killed and restarted every worker, forever, on a busy two-core machine.
        options["timeout_worker_healthcheck"] = WORKER_HEALTHCHECK_SECONDS
    return options


# The file a worker writes its one-line start-up failure to, for `dpgov serve` to print. Set by
# `serve` for its workers only; not a setting (outside the DPGOV_ prefix).
WORKER_REPORT_ENV = "DP_GOVERNOR_WORKER_REPORT"


def report_start_failure(reason: str) -> None:
    """Record why this worker cannot start, for the supervising ``dpgov serve`` (if any)."""
    path = os.environ.get(WORKER_REPORT_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(" ".join(reason.split()) + "\n")


def run_server(
    app: str, workers: int, *, sock: socket.socket | None = None, **options: Any
) -> str | None:
    """Serve ``app`` (a factory's import path) until stopped; the reason a worker could not start.

    uvicorn restarts a worker that dies while serving. A worker that fails while starting (its
    settings, keys or database: it would fail the same way on every restart) reports why, and
    the server stops instead of restarting it forever; that one-line reason is returned
    (``None``: a normal stop). ``sock``: the socket :func:`bind_port` bound (default: uvicorn
    binds ``host`` and ``port`` itself).
    """
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors.multiprocess import Multiprocess

    config = uvicorn.Config(app, factory=True, workers=workers, **options)
    if workers == 1:
        server = uvicorn.Server(config)
        server.run(sockets=None if sock is None else [sock])
        return None if server.started else "the server could not start (see the log above)"

    class Supervisor(Multiprocess):
        """uvicorn's supervisor that stops, rather than restarts, when a worker reported."""

        failed = False

        def keep_subprocess_alive(self) -> None:
            if os.path.getsize(report.name) > 0:
                self.failed = True
                self.should_exit.set()
                return
            super().keep_subprocess_alive()

    with tempfile.NamedTemporaryFile("r", prefix="dpgov-workers-", encoding="utf-8") as report:
        os.environ[WORKER_REPORT_ENV] = report.name
        try:
            supervisor = Supervisor(config, sockets=[sock or config.bind_socket()])
            supervisor.run()
        finally:
            del os.environ[WORKER_REPORT_ENV]
        reasons = report.read().splitlines()
    started = not any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes)
    if not supervisor.failed and started:
        return None
    return reasons[0] if reasons else "a worker could not start (see the log above)"

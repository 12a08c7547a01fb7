"""ASGI middleware around every route: HEAD as GET, the request body limit, latency by route."""

from __future__ import annotations

import logging
import time

from prometheus_client import Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dp_governor.api.errors import TOO_LARGE
from dp_governor.api.logs import log_fields

__all__ = ["BodyLimit", "HeadAsGet", "Timing"]

_requests = logging.getLogger("dpgov.requests")  # one line a request: its route template


class HeadAsGet:
    """ASGI middleware: a HEAD request is answered as its GET, with the same headers, no body.

    RFC 9110 (section 9.3.2) asks a server to answer HEAD wherever it answers GET; FastAPI
    routes declare GET alone. The route sees a GET (on a copy of the scope: the server's own
    view stays HEAD), and every body chunk it sends is dropped, so ``Content-Length`` and the
    status are the GET's. A path without GET answers 405 naming ``Allow``, as for any method.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run a HEAD as a GET and send its answer without the body."""
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        inner = {**scope, "method": "GET"}
        try:
            await self.app(inner, receive, headers_only)
        finally:
            if "route" in inner:  # the request's route template, for the latency and log lines
                scope["route"] = inner["route"]


class BodyLimit:
    """ASGI middleware: 413 for bodies over the limit, by Content-Length or while streaming.

    The body is never buffered beyond the limit: a chunked upload is cut off as soon as it
    crosses it.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer 413 as soon as the body is known to be over the limit."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_big = int(value) > self.limit
                except ValueError:
                    too_big = False
                if too_big:
                    await _too_large(send, self.limit)
                    return
        received = 0
        limit = self.limit
        state = {"started": False, "blocked": False}

        async def guarded_send(message: Message) -> None:
            if state["blocked"]:
                return  # we already answered 413; drop the app's own reply
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    if not state["started"]:
                        await _too_large(send, limit)
                    state["blocked"] = True
                    return {"type": "http.disconnect"}
            return message

        await self.app(scope, limited, guarded_send)


async def _too_large(send: Send, limit: int) -> None:
    body = f'{{"detail":"request body is larger than {limit} bytes"}}'.encode()
    await send(
        {
            "type": "http.response.start",
            "status": TOO_LARGE,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"})


class Timing:
    """ASGI middleware: request latency by route template and method (no body buffering).

    Labels come from a fixed set (route templates, known methods, else "unmatched"/"other"),
    so clients cannot create metric series.
    """

    def __init__(self, app: ASGIApp, histogram: Histogram) -> None:
        self.app = app
        self.histogram = histogram

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the request and observe its latency under its route template."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # unless the app answers

        async def observed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, observed_send)
        finally:
            seconds = time.perf_counter() - start
            path = getattr(scope.get("route"), "path", "unmatched")
            method = scope["method"] if scope["method"] in _METHODS else "other"
            self.histogram.labels(path, method).observe(seconds)
            if _requests.isEnabledFor(logging.INFO):
                ms = round(seconds * 1000, 2)
                _requests.info(
                    "%s %s %d %.1f ms",
                    method,
                    path,
                    status,
                    ms,
                    extra=log_fields(method=method, route=path, status=status, duration_ms=ms),
                )

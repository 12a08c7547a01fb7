"""The report fast lane: single reports served by :func:`api.routes.reports.accept_report`.

The framework's routing, dependency and response-model machinery is most of a report's cost,
and this is the hot path; the lane reads a well-formed ``POST /v1/use-cases/{name}/reports``
itself and calls the route's own :func:`~api.routes.reports.accept_report`, answering errors
through the one mapping (:func:`dp_governor.api.errors.error_response`).
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dp_governor.api._bodies import decode_json, duplicated_header
from dp_governor.api.errors import BAD_REQUEST, error_response
from dp_governor.api.routes.reports import accept_report
from dp_governor.budget.errors import InvalidRequest

__all__ = ["ReportLane"]

_REPORT_PATH = re.compile(r"^/v1/use-cases/([a-z0-9][a-z0-9-]{0,62})/reports$")
_LANE_ROUTE = SimpleNamespace(path="/v1/use-cases/{name}/reports")  # Timing's route label


class ReportLane:
    """ASGI middleware: serve well-formed single-report submissions without the framework.

    It handles ``POST /v1/use-cases/{name}/reports`` with a JSON body and valid headers through
    the same :func:`~api.routes.reports.accept_report` as the documented route, and the same
    :func:`~api.errors.error_response`; a JSON body that does not decode (too deeply nested, a
    lone surrogate) is a 422 naming the body; anything else irregular (missing or oversized
    headers, another content type) is replayed to the FastAPI route, which answers it. Every
    request, on any route, that repeats ``X-Device-Id`` or ``Idempotency-Key`` is refused here
    with 400, so the lane and the routes never read different copies.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve a well-formed single report here; pass anything else on."""
        if scope["type"] == "http":
            twice = duplicated_header(scope["headers"])
            if twice is not None:
                refusal = JSONResponse(
                    {"detail": f"`{twice}` is sent more than once", "field": twice},
                    status_code=BAD_REQUEST,
                )
                await refusal(scope, receive, send)
                return
        match = _REPORT_PATH.match(scope.get("path", "")) if scope["type"] == "http" else None
        if match is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        headers = dict(scope["headers"])
        device = headers.get(b"x-device-id")
        idem = headers.get(b"idempotency-key")
        is_json = headers.get(b"content-type", b"").split(b";")[0].strip() == b"application/json"
        regular = (
            is_json
            and device is not None
            and 1 <= len(device) <= 256
            and (idem is None or 1 <= len(idem) <= 255)
        )
        body: Any = None
        if is_json:
            try:
                body = decode_json(raw)
            except InvalidRequest as exc:
                scope["route"] = _LANE_ROUTE
                response = error_response(exc)
                assert response is not None
                await response(scope, replay, send)
                return
        if not regular:
            await self.app(scope, replay, send)
            return
        assert device is not None
        scope["route"] = _LANE_ROUTE
        try:
            response = await accept_report(
                scope["app"].state,
                match.group(1),
                device.decode("latin-1"),
                body,
                None if idem is None else idem.decode("latin-1"),
            )
        except Exception as exc:
            mapped = error_response(exc)
            if mapped is None:
                raise
            response = mapped
        await response(scope, replay, send)

"""The one error mapping: a domain exception to an HTTP status and body.

The exception handlers (:func:`install`), the report fast lane (:mod:`dp_governor.api._lane`)
and the relay's per-item results (:meth:`dp_governor.pipeline.ingest.Ingestor.submit_many`) all take
their statuses from :func:`status_of`, so one error has one status wherever it is answered.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import Scope

from dp_governor.api.schemas import ErrorBody
from dp_governor.budget.errors import IdempotencyConflict, InvalidRequest
from dp_governor.mechanisms import InvalidReport
from dp_governor.pipeline.ingest import PolicyChanged
from dp_governor.policies.errors import PolicyConflict, UnknownUseCase, error_message

__all__ = [
    "ACCEPTED",
    "BAD_REQUEST",
    "CONFLICT",
    "DOMAIN_ERRORS",
    "ERROR_RESPONSES",
    "FORBIDDEN",
    "INVALID",
    "MAX_JSON_DEPTH",
    "NOT_FOUND",
    "REFUSED",
    "SERVICE_UNAVAILABLE",
    "TOO_LARGE",
    "UNAUTHORIZED",
    "HttpError",
    "PolicyChanged",
    "allowed_methods",
    "error_response",
    "field_errors",
    "install",
    "status_of",
]

ACCEPTED = 202  # a report charged and enqueued
BAD_REQUEST = 400  # a request that cannot be read (a header sent twice, a body not UTF-8)
UNAUTHORIZED = 401  # no credentials where the route needs them
FORBIDDEN = 403  # credentials that do not allow this
NOT_FOUND = 404  # an unknown use case or job
CONFLICT = 409  # an idempotency key reused, a policy conflict, a job held by another process
TOO_LARGE = 413  # a body or batch over its limit
INVALID = 422  # a request or report that names the field at fault
REFUSED = 429  # a report refused at a cap (a decision, not an error), or a rate limit
SERVICE_UNAVAILABLE = 503  # a job stopped by a database still locked after its busy timeout
MAX_JSON_DEPTH = 16  # deeper JSON bodies are refused with 422 on `body`

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        BAD_REQUEST: "A body that cannot be read (not UTF-8, not the declared encoding).",
        UNAUTHORIZED: "No credentials: `X-Device-Id` or `Authorization: Bearer <admin token>`.",
        FORBIDDEN: "Credentials that do not allow this.",
        NOT_FOUND: "Unknown use case (or route).",
        CONFLICT: "Idempotency-key or policy conflict.",
        TOO_LARGE: "Body or batch too large.",
        REFUSED: "A budget cap or a rate limit; see `Retry-After`.",
    }.items()
}
"""The error statuses every route may answer, each with :class:`ErrorBody` (see ``app.py``)."""


class HttpError(Exception):
    """An HTTP error with a plain message (mapped by :func:`error_response`).

    ``field`` is the parameter, header or body field at fault, when the message names one:
    the body carries it as ``field`` (``ErrorBody``), so a client need not parse the sentence.
    """

    def __init__(
        self,
        status: int,
        detail: str,
        headers: dict[str, str] | None = None,
        *,
        field: str | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers
        self.field = field


DOMAIN_ERRORS: tuple[type[Exception], ...] = (
    InvalidReport,
    InvalidRequest,
    UnknownUseCase,
    IdempotencyConflict,
    PolicyConflict,
    PolicyChanged,
    HttpError,
)


def status_of(exc: Exception) -> int | None:
    """The HTTP status of a domain error (``None``: not a domain error).

    >>> status_of(UnknownUseCase("x")), status_of(PolicyChanged("x")), status_of(KeyError("x"))
    (404, 409, None)
    """
    if isinstance(exc, InvalidReport | InvalidRequest):
        return INVALID
    if isinstance(exc, UnknownUseCase):
        return NOT_FOUND
    if isinstance(exc, IdempotencyConflict | PolicyConflict | PolicyChanged):
        return CONFLICT
    if isinstance(exc, HttpError):
        return exc.status
    return None


def error_response(exc: Exception) -> JSONResponse | None:
    """The HTTP answer to a domain error, with :func:`status_of`'s status (``None``: not one)."""
    status = status_of(exc)
    if status is None:
        return None
    if isinstance(exc, InvalidReport):
        loc = ["body", *exc.field.split(".")]
        item = {"loc": loc, "field": exc.field, "msg": str(exc), "type": "value_error"}
        return JSONResponse({"detail": [item]}, status_code=status)
    if isinstance(exc, InvalidRequest):
        item = {"loc": [exc.field], "field": exc.field, "msg": str(exc), "type": "value_error"}
        return JSONResponse({"detail": [item]}, status_code=status)
    if isinstance(exc, IdempotencyConflict):
        return JSONResponse({"detail": str(exc), "field": "Idempotency-Key"}, status_code=status)
    if isinstance(exc, PolicyConflict):
        return JSONResponse({"detail": str(exc), "field": exc.field}, status_code=status)
    if isinstance(exc, HttpError):
        body = (
            {"detail": exc.detail}
            if exc.field is None
            else {"detail": exc.detail, "field": exc.field}
        )
        return JSONResponse(body, status_code=status, headers=exc.headers)
    return JSONResponse({"detail": str(exc)}, status_code=status)


_NAMED = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")  # a model check's message names its field


def field_errors(exc: ValidationError | RequestValidationError) -> list[dict[str, Any]]:
    """Pydantic's errors as the 422 body lists them: ``loc``, ``field`` (dotted), ``msg``."""
    out = []
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ())]
        msg = error_message(err)  # `Finite`: said as the policies' checks say it
        named = _NAMED.match(msg)
        given = err.get("input")
        if named and loc in ([], ["body"]) and isinstance(given, dict) and named[1] in given:
            loc = [*loc, named[1]]  # a whole-model check names the field it is about first
        out.append(
            {
                "loc": loc,
                "field": ".".join(loc[1:] if loc and loc[0] == "body" else loc),
                "msg": msg,
                "type": str(err.get("type", "value_error")),
            }
        )
    return out


async def _validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError | ValidationError)
    return JSONResponse({"detail": field_errors(exc)}, status_code=INVALID)


async def _domain(_: Request, exc: Exception) -> JSONResponse:
    response = error_response(exc)
    assert response is not None
    return response


async def _http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if isinstance(exc.__cause__, RecursionError):  # FastAPI's JSON parse of a deep body
        deep = InvalidRequest("body", f"nests deeper than {MAX_JSON_DEPTH} levels")
        response = error_response(deep)
        assert response is not None
        return response
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(allowed_methods(request.app, request.scope))
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)


_METHODS = ("DELETE", "GET", "PATCH", "POST", "PUT")


def allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """The methods some route answers on this scope's path, for a 405's ``Allow``.

    Each method is tried against the router (its included routers too), rather than read
    from the routes, which FastAPI may nest; HEAD goes with GET (:class:`HeadAsGet`).
    """
    allowed = [
        method
        for method in _METHODS
        if any(
            route.matches({**scope, "method": method})[0] == Match.FULL
            for route in app.router.routes
        )
    ]
    return sorted(allowed + ["HEAD"] * ("GET" in allowed))


def install(app: FastAPI) -> None:
    """Register the handlers: validation errors 422, domain errors mapped, HTTP errors as JSON."""
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(ValidationError, _validation)
    for error in DOMAIN_ERRORS:
        app.add_exception_handler(error, _domain)
    app.add_exception_handler(StarletteHTTPException, _http)

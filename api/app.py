"""The FastAPI service: ``create_app(settings)``; engine, ledger, scheduler live in the lifespan."""

from __future__ import annotations

import gc
import hmac
import json
import logging
import math
import os
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, date, datetime
from types import SimpleNamespace
from typing import Annotated, Any, Literal

import orjson
from fastapi import Body, Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError
from pydantic import Field as PydField
from sqlalchemy import func, select
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.dashboard import EstimatePanel, render_dashboard
from api.ingestion.committer import GroupCommitter
from api.ingestion.ingest import Ingestor, PolicyChanged, SubmitRequest
from api.ingestion.pipeline import load_sketch
from api.ingestion.tables import InboxRow
from api.integrity import kept_checkpoints, verify_service
from api.jobs import JOBS, RUNTIMES, Runtime, lease_of, release_job, run_job, start_scheduler
from api.ratelimit import RateLimiter
from api.settings import Settings, service_keys
from budget import (
    BudgetStatus,
    Clock,
    IdempotencyConflict,
    InvalidRequest,
    Ledger,
    PolicyConflict,
    SystemClock,
    UnknownUseCase,
    create_db_engine,
    init_db,
    utc_day,
)
from budget.audit_log import Verification
from budget.clock import day_date
from budget.reporting.device import DeviceOdometer, DeviceWide
from budget.reporting.report import EffectiveEpsilonReport, ReportBasis, finish_report
from budget.reporting.views import (
    Distribution,
    Timeline,
    WhatIf,
    cumulative_series,
    device_timeline,
    distribution,
    what_if,
)
from mechanisms import InvalidReport, SfpSketch
from mechanisms.sfp import DiscoveredWord
from policies import DEFAULT_POLICIES, Policy, PolicyBase, PolicyCreate, PolicyPublic, budget_key
from policies.device import device_budget_versions

__all__ = ["create_app"]

log = logging.getLogger("dpgov.api")


# -- request size ---------------------------------------------------------------------------------


class BodyLimit:
    """ASGI middleware: 413 for bodies over the limit, by Content-Length or while streaming.

    The body is never buffered beyond the limit: a chunked upload is cut off as soon as it
    crosses it.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
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
            "status": 413,
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
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            route = scope.get("route")
            method = scope["method"] if scope["method"] in _METHODS else "other"
            self.histogram.labels(getattr(route, "path", "unmatched"), method).observe(
                time.perf_counter() - start
            )


def _policy_example(name: str, **changes: Any) -> dict[str, Any]:
    """A default policy's fields (without name and description) as an OpenAPI example."""
    base = next(p for p in DEFAULT_POLICIES if p["name"] == name)
    value = {k: v for k, v in base.items() if k not in ("name", "description")}
    return {"value": {**value, **changes}}


_POLICY_EXAMPLES = {
    "emoji with caps": _policy_example(
        "emoji", window_epsilon_cap=120.0, lifetime_epsilon_cap=1000.0
    ),
    "safari domains (shared budget)": _policy_example("safari-energy-domains"),
    "new words (SFP)": _policy_example("quicktype"),
}

REPORT_CACHE_ENTRIES = 32  # effective-epsilon reports kept, one per distinct delta asked
_REPORT_PATH = re.compile(r"^/v1/use-cases/([a-z0-9][a-z0-9-]{0,62})/reports$")
_LANE_ROUTE = SimpleNamespace(path="/v1/use-cases/{name}/reports")
_SINGLE_HEADERS = {b"x-device-id": "X-Device-Id", b"idempotency-key": "Idempotency-Key"}


def duplicated_header(headers: Sequence[tuple[bytes, bytes]]) -> str | None:
    """The first of ``X-Device-Id`` / ``Idempotency-Key`` sent more than once, else ``None``.

    Two copies would be read differently by different parsers (the first or the last), so a
    request carrying two is refused rather than guessed at.

    >>> duplicated_header([(b"x-device-id", b"a"), (b"x-device-id", b"b")])
    'X-Device-Id'
    """
    seen: set[bytes] = set()
    for name, _ in headers:
        if name in _SINGLE_HEADERS:
            if name in seen:
                return _SINGLE_HEADERS[name]
            seen.add(name)
    return None


_MAX_JSON_DEPTH = 16


def check_json(value: Any) -> Any:
    r"""``value`` if it nests at most 16 levels and holds no lone surrogate, else 422 on `body`.

    A report is three levels deep at most; deeper values break error messages (``repr``
    recursion) and a lone surrogate (``"\ud800"``) cannot be encoded as UTF-8 again, so both
    are refused where the body is read, naming the problem.

    >>> check_json({"j": 1, "bits": "AA=="})
    {'j': 1, 'bits': 'AA=='}
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    raise InvalidRequest(
                        "body", "holds a lone surrogate (such as \\ud800), which is not a character"
                    ) from None
        elif isinstance(item, dict | list):
            if depth > _MAX_JSON_DEPTH:
                raise InvalidRequest("body", f"nests deeper than {_MAX_JSON_DEPTH} levels")
            if isinstance(item, dict):
                stack.extend((k, depth) for k in item)
                stack.extend((v, depth + 1) for v in item.values())
            else:
                stack.extend((v, depth + 1) for v in item)
    return value


def decode_json(raw: bytes) -> Any:
    """A JSON body as the report routes read it, through :func:`check_json` (422 on `body`)."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise InvalidRequest("body", f"nests deeper than {_MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        raise InvalidRequest("body", f"is not valid JSON: {exc}") from None
    return check_json(value)


class ReportLane:
    """ASGI middleware: serve well-formed single-report submissions without the framework.

    It handles ``POST /v1/use-cases/{name}/reports`` with a JSON body and valid headers through
    the same ``accept_report`` as the documented route, and the same :func:`error_response`;
    a JSON body that does not decode (too deeply nested, a lone surrogate) is a 422 naming the
    body; anything else irregular (missing or oversized headers, another content type) is
    replayed to the FastAPI route, which answers it. The framework's routing, dependency and
    response-model machinery is most of a report's cost, and this is the hot path. Every
    request, on any route, that repeats ``X-Device-Id`` or ``Idempotency-Key`` is refused here
    with 400, so the lane and the routes never read different copies.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            twice = duplicated_header(scope["headers"])
            if twice is not None:
                refusal = JSONResponse(
                    {"detail": f"`{twice}` is sent more than once", "field": twice},
                    status_code=400,
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
            and (idem is None or len(idem) <= 255)
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
            response = await scope["app"].state.accept_report(
                scope["app"],
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


def _batch_body(max_items: int) -> dict[str, Any]:
    """The OpenAPI request body of the relay endpoint (parsed by hand, so described by hand)."""
    item = {
        "type": "object",
        "required": ["device_id"],
        "additionalProperties": False,
        "properties": {
            "device_id": {"type": "string", "minLength": 1, "maxLength": 256},
            "report": {
                "type": "object",
                "description": "The report body, exactly as the single-report route takes it.",
            },
            "idempotency_key": {"type": "string", "minLength": 1, "maxLength": 255},
        },
    }
    example = {
        "items": [
            {"device_id": "d-1", "report": {"j": 1, "l": 2, "bit": 1}},
            {"device_id": "d-2", "report": {"j": 3, "l": 4, "bit": -1}, "idempotency_key": "k"},
        ]
    }
    schema = {
        "type": "object",
        "required": ["items"],
        "additionalProperties": False,
        "properties": {"items": {"type": "array", "maxItems": max_items, "items": item}},
    }
    content = {"schema": schema, "examples": {"relay": {"value": example}}}
    return {"required": True, "content": {"application/json": content}}


# -- response models ------------------------------------------------------------------------------


class Receipt(BaseModel):
    """A 202 answer: the charge receipt and what remains today (never a report id)."""

    receipt: str
    use_case: str
    policy_version: int
    epsilon: float
    day: date
    reports_left_today: int
    replayed: bool


class BatchItemResult(BaseModel):
    """One item of a batch answer."""

    status: int
    receipt: str | None = None
    reason: str | None = None
    retry_at: datetime | None = None
    field: str | None = None
    error: str | None = None


class BatchResult(BaseModel):
    """Per-item results, in the order of the items."""

    accepted: int
    results: list[BatchItemResult]


class ErrorBody(BaseModel):
    """An error: ``detail`` says what is wrong (a list of field errors for 422)."""

    detail: str | list[dict[str, Any]]
    field: str | None = None


_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        400: "A body that cannot be read (not UTF-8, not the declared encoding).",
        401: "No credentials: `X-Device-Id` or `Authorization: Bearer <admin token>`.",
        403: "Credentials that do not allow this.",
        404: "Unknown use case (or route).",
        409: "Idempotency-key or policy conflict.",
        413: "Body or batch too large.",
        429: "A budget cap or a rate limit; see `Retry-After`.",
    }.items()
}


class AuditVerification(BaseModel):
    """The audit chain's state: entries checked, head, checkpoints, and the first failure."""

    ok: bool
    entries: int
    head_seq: int
    head_hash: str
    checkpoints: int
    latest_checkpoint_seq: int | None
    latest_checkpoint_at: str | None
    first_bad: int | None
    problem: str | None
    state_checked: bool = PydField(
        description="Whether the tables the gate decides on were checked against the chain."
    )
    note: str | None = PydField(description="Why the state was not checked, when it was not.")
    kept_checkpoints: int = PydField(description="Checkpoints read from `checkpoint_file`.")


class DeviceBudget(BaseModel):
    """One device's budget: the device-wide budget first (``null``: none set), then per use case."""

    device_id: str
    device: DeviceWide | None = None
    odometer: DeviceOdometer | None = None
    use_cases: list[BudgetStatus]


class EstimateItem(BaseModel):
    """One candidate's estimated count."""

    item: str
    count: float
    stderr: float


class Estimates(BaseModel):
    """Published estimates (count >= the policy's threshold) over a day range."""

    use_case: str
    days: list[date]
    n: int
    publish_threshold: float
    estimates: list[EstimateItem]


class EstimateQuery(BaseModel):
    """The body of ``POST .../estimates:query``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    candidates: list[Annotated[str, StringConstraints(max_length=1000)]] = PydField(
        min_length=1, max_length=1_000_000
    )
    start: date | None = PydField(default=None, alias="from")
    end: date | None = PydField(default=None, alias="to")


class Discovery(BaseModel):
    """A word discovered by SFP, with its estimate."""

    word: str
    count: float
    stderr: float


class Discoveries(BaseModel):
    """SFP's discovered words over a day range."""

    use_case: str
    days: list[date]
    n: int
    words: list[Discovery]


def _public(p: Policy) -> PolicyPublic:
    data = p.model_dump()
    data["budget"] = budget_key(p)
    data["epsilon_per_day"] = p.epsilon_per_report * p.max_reports_per_day
    return PolicyPublic.model_validate(data)


def _errors(exc: ValidationError | RequestValidationError) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ())]
        out.append(
            {
                "loc": loc,
                "field": ".".join(loc[1:] if loc and loc[0] == "body" else loc),
                "msg": str(err.get("msg")),
                "type": str(err.get("type", "value_error")),
            }
        )
    return out


# -- dependencies ---------------------------------------------------------------------------------


def get_ledger(request: Request) -> Ledger:
    """The app's ledger (built in the lifespan)."""
    ledger: Ledger = request.app.state.ledger
    return ledger


def get_ingestor(request: Request) -> Ingestor:
    """The app's ingestor (built in the lifespan)."""
    ingestor: Ingestor = request.app.state.ingestor
    return ingestor


def admin_credential(
    request: Request,
    authorization: Annotated[str | None, Header(description="`Bearer <admin token>`")] = None,
) -> bool:
    """The one admin check: True for the admin token, False without ``Authorization``.

    Any other credential is refused, never ignored: a wrong token is 403 and counts toward
    the client's failures (``admin_failures_per_minute``), a client over that limit gets 429
    even with the right token until its wait is over, ``Bearer`` with nothing after it is 401,
    and a server without an admin token refuses every one with 403. The compare is
    constant-time and never admits an empty token.
    """
    if not authorization:
        return False
    expected = request.app.state.settings.admin_token
    if expected is None:
        raise _Http(
            403,
            "admin routes are disabled: this server has no admin token (set DPGOV_ADMIN_TOKEN"
            " to at least 32 characters and restart)",
        )
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() == "bearer" and not token:
        raise _Http(401, "admin routes need `Authorization: Bearer <token>`; the token is empty")
    failures: RateLimiter = request.app.state.admin_failures
    client = request.client.host if request.client else "unknown"
    wait = failures.blocked(client)
    if wait:
        raise _Http(429, "too many bad admin tokens; retry later", {"Retry-After": str(wait)})
    secret = expected.get_secret_value().encode()
    if scheme.lower() == "bearer" and secret and hmac.compare_digest(token.encode(), secret):
        return True
    failures.hit(client)
    raise _Http(403, "the admin token is not valid")


AdminCredential = Annotated[bool, Depends(admin_credential)]


def require_admin(admin: AdminCredential) -> None:
    """Admin-only routes: 401 without credentials (and :func:`admin_credential`'s refusals)."""
    if not admin:
        raise _Http(401, "admin routes need `Authorization: Bearer <token>`")


LedgerDep = Annotated[Ledger, Depends(get_ledger)]
IngestorDep = Annotated[Ingestor, Depends(get_ingestor)]
AdminDep = Depends(require_admin)
DeviceHeader = Annotated[
    str,
    Header(
        alias="X-Device-Id",
        min_length=1,
        max_length=256,
        description="The submitting device's id (pseudonymised with HMAC before storage).",
    ),
]
UseCaseName = Annotated[str, Path(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9-]*$")]


# -- the app --------------------------------------------------------------------------------------


def create_app(settings: Settings | None = None, *, clock: Clock | None = None) -> FastAPI:
    """Build the service. Nothing connects until the lifespan starts."""
    settings = settings or Settings()
    clock = clock or SystemClock()
    registry = CollectorRegistry()
    reports_total = Counter(
        "dpgov_reports_total",
        "Reports by use case and outcome.",
        ["use_case", "outcome"],
        registry=registry,
    )
    latency = Histogram(
        "dpgov_request_seconds", "Request latency by route.", ["route", "method"], registry=registry
    )
    inbox_depth = Gauge("dpgov_inbox_depth", "Reports waiting in the inbox.", registry=registry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.admin_token is None:
            log.warning(
                "no admin token is set: every admin route refuses. Set DPGOV_ADMIN_TOKEN to at"
                " least 32 characters (python3 -c 'import secrets;"
                " print(secrets.token_urlsafe(32))') and restart."
            )
        engine = create_db_engine(settings.database_url)
        try:  # the keys must be the database's (KeyRefused names the setting to provide)
            init_service_db(engine)
            keys = service_keys(settings, engine, generate=True, record=True)
        except Exception:
            engine.dispose()
            raise
        secret = keys.device_key_secret
        ledger = Ledger(engine, secret, audit_key=keys.audit_key)
        loaded = ledger.policies.ensure_defaults()
        if loaded:
            log.info("loaded %d default policies into an empty database", len(loaded))
        ingestor = Ingestor(ledger, secret)
        key = uuid.uuid4().hex
        RUNTIMES[key] = Runtime(
            ledger,
            ingestor,
            clock,
            settings.shuffle_batch,
            min_batch=settings.flush_min_batch,
            lease_seconds=settings.job_lease_seconds,
            checkpoint_file=settings.checkpoint_file,
        )
        app.state.ledger = ledger
        app.state.ingestor = ingestor
        app.state.runtime_key = key
        committer = GroupCommitter(ingestor, clock)
        committer.start()
        app.state.committer = committer
        scheduler = None
        if settings.scheduler:
            scheduler = start_scheduler(
                key,
                {
                    "flush-inbox": settings.flush_seconds,
                    "aggregate": settings.aggregate_seconds,
                    "checkpoint": settings.checkpoint_seconds,
                },
            )
        # Everything loaded so far (framework, ORM, numpy) lives as long as the process: keep it
        # out of the cyclic collector's full passes, which otherwise rescan it every few
        # batches and cost a quarter of the relay path.
        gc.freeze()
        try:
            yield
        finally:
            await committer.stop()
            if scheduler is not None:
                scheduler.shutdown(wait=True)
            RUNTIMES.pop(key, None)
            engine.dispose()

    app = FastAPI(
        responses=_ERROR_RESPONSES,
        title="dp-governor",
        version="0.1.0",
        description="Privacy accounting and budget governance for local-DP telemetry.",
        lifespan=lifespan,
    )
    app.add_middleware(ReportLane)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)

    app.add_middleware(Timing, histogram=latency)

    # -- errors: one mapping (also used by the report fast lane) -------------------------------

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _errors(exc)}, status_code=422)

    @app.exception_handler(ValidationError)
    async def _model_validation(_: Request, exc: ValidationError) -> JSONResponse:
        return JSONResponse({"detail": _errors(exc)}, status_code=422)

    async def _domain(_: Request, exc: Exception) -> JSONResponse:
        response = error_response(exc)
        assert response is not None
        return response

    for error in DOMAIN_ERRORS:
        app.add_exception_handler(error, _domain)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if isinstance(exc.__cause__, RecursionError):  # FastAPI's JSON parse of a deep body
            deep = InvalidRequest("body", f"nests deeper than {_MAX_JSON_DEPTH} levels")
            response = error_response(deep)
            assert response is not None
            return response
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # Allow: every method of every route on this path
            methods = {
                m
                for route in app.router.routes
                if isinstance(route, APIRoute) and route.matches(request.scope)[0] != Match.NONE
                for m in route.methods or ()
            }
            headers["Allow"] = ", ".join(sorted(methods))
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)

    app.state.settings = settings
    device_limit = RateLimiter(settings.device_rate_per_minute, max_keys=settings.rate_limit_keys)
    app.state.device_limit = device_limit
    app.state.admin_failures = RateLimiter(
        settings.admin_failures_per_minute, max_keys=settings.rate_limit_keys
    )

    # -- reports -------------------------------------------------------------------------------

    @app.post(
        "/v1/use-cases/{name}/reports",
        status_code=202,
        response_model=Receipt,
        responses={
            404: {"description": "Unknown use case"},
            409: {"description": "Idempotency key reused for a different report"},
            422: {"description": "Invalid report; `detail[].field` names the field"},
            429: {"description": "A cap is reached; `Retry-After` says when to retry"},
        },
        tags=["reports"],
    )
    async def submit_report(
        name: UseCaseName,
        request: Request,
        ingestor: IngestorDep,
        device_id: DeviceHeader,
        body: Annotated[
            Any,
            Body(
                openapi_examples={
                    "hcms": {"value": {"j": 17, "l": 1023, "bit": -1}},
                    "cms": {"value": {"j": 4021, "bits": "AAAA...base64 of m bits"}},
                    "sfp": {
                        "value": {
                            "word": {"j": 1, "bits": "..."},
                            "fragment": {"j": 2, "bits": "..."},
                            "position": 4,
                        }
                    },
                }
            ),
        ],
        idempotency_key: Annotated[
            str | None, Header(alias="Idempotency-Key", max_length=255)
        ] = None,
    ) -> Receipt | JSONResponse:
        """Submit one privatized report; it is charged and enqueued atomically.

        Well-formed requests are served by the report fast lane (the same logic without the
        framework's per-request machinery); this route documents them and answers the rest.
        """
        check_json(body)
        return await accept_report(request.app, name, device_id, body, idempotency_key)

    async def accept_report(
        asgi: Any, name: str, device_id: str, body: Any, idempotency_key: str | None
    ) -> JSONResponse:
        """Rate limit, group-commit, answer: 202 receipt or 429 refusal (errors raise).

        An unknown use case is refused before the rate limiter and the metrics see the
        request, so rotating names or device ids cannot grow either.
        """
        ingestor: Ingestor = asgi.state.ingestor
        if not ingestor.known(name) and not await run_in_threadpool(ingestor.look_up, name):
            reports_total.labels("unknown", "unknown_use_case").inc()  # one series for all
            raise UnknownUseCase(name)
        wait = device_limit.hit(device_id)
        if wait:
            reports_total.labels(name, "rate_limited").inc()
            raise _Http(
                429,
                f"too many requests from this device; retry in {wait} s",
                {"Retry-After": str(wait)},
            )
        committer: GroupCommitter = asgi.state.committer
        decision = await committer.submit(SubmitRequest(name, device_id, body, idempotency_key))
        reports_total.labels(name, decision.reason).inc()
        if not decision.accepted:
            return _refusal(decision, clock)
        receipt = {
            "receipt": ingestor.receipt(decision),
            "use_case": decision.use_case,
            "policy_version": decision.policy_version,
            "epsilon": decision.epsilon,
            "day": day_date(decision.day).isoformat(),
            "reports_left_today": decision.reports_left_today,
            "replayed": decision.replayed,
        }
        return JSONResponse(receipt, status_code=202)

    app.state.accept_report = accept_report

    @app.post(
        "/v1/use-cases/{name}/reports:batch",
        response_model=BatchResult,
        tags=["reports"],
        openapi_extra={"requestBody": _batch_body(settings.max_batch_items)},
    )
    async def submit_batch(
        name: UseCaseName, request: Request, ingestor: IngestorDep, _admin: None = AdminDep
    ) -> Response:
        """A relay forwards many devices' reports; each item is charged on its own.

        Parsed and answered with orjson rather than through response models: at tens of
        thousands of items per second the framework's per-item validation would dominate.
        """
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest("body", f"is not valid JSON: {exc.msg}") from None
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(body, dict) or set(body) != {"items"} or not isinstance(items, list):
            raise InvalidRequest("items", "must be the only field, a list of batch items")
        if len(items) > settings.max_batch_items:
            raise _Http(
                413, f"`items` holds {len(items)} items; the maximum is {settings.max_batch_items}"
            )
        results = await run_in_threadpool(ingestor.submit_many, name, items, now=clock.now())
        out = []
        outcomes: dict[str, int] = {}
        accepted = 0
        for r in results:
            d = r.decision
            if d is not None:
                outcomes[d.reason] = outcomes.get(d.reason, 0) + 1
                accepted += d.accepted
                out.append(
                    {
                        "status": r.status,
                        "receipt": ingestor.receipt(d) if d.accepted else None,
                        "reason": d.reason,
                        "retry_at": d.retry_at,
                        "field": None,
                        "error": None,
                    }
                )
            else:
                out.append(
                    {
                        "status": r.status,
                        "receipt": None,
                        "reason": None,
                        "retry_at": None,
                        "field": r.field,
                        "error": r.error,
                    }
                )
        for reason, n in outcomes.items():
            reports_total.labels(name, reason).inc(n)
        return Response(
            orjson.dumps({"accepted": accepted, "results": out}), media_type="application/json"
        )

    # -- budgets -------------------------------------------------------------------------------

    @app.get("/v1/devices/{device_id}/budget", response_model=DeviceBudget, tags=["budgets"])
    def device_budget(
        device_id: Annotated[str, Path(min_length=1, max_length=256)],
        ledger: LedgerDep,
        admin: AdminCredential,
        x_device_id: Annotated[str | None, Header(alias="X-Device-Id")] = None,
    ) -> DeviceBudget:
        """A device reads its own budget (X-Device-Id equal to the path); admins read any."""
        if not admin:
            if x_device_id is None:
                raise _Http(401, "send `X-Device-Id` (the device itself) or an admin token")
            if x_device_id != device_id:
                raise _Http(403, "a device may read only its own budget")
        status = ledger.status(device_id, now=clock.now())
        return DeviceBudget(
            device_id=device_id,
            device=ledger.device_wide(device_id, now=clock.now()),
            odometer=ledger.device_odometer(device_id),
            use_cases=status,
        )

    @app.get("/v1/device-budget", tags=["budgets"])
    def device_budget_versions_route(ledger: LedgerDep) -> list[dict[str, Any]]:
        """Every version of the device-wide budget, oldest first (the last is in force)."""
        with ledger.engine.connect() as conn:
            return [v.model_dump(mode="json") for v in device_budget_versions(conn)]

    # -- use cases -----------------------------------------------------------------------------

    @app.get("/v1/use-cases", response_model=list[PolicyPublic], tags=["use cases"])
    def list_use_cases(ledger: LedgerDep) -> list[PolicyPublic]:
        """Every active use case's current policy."""
        return [_public(p) for p in ledger.policies.list()]

    @app.get("/v1/use-cases/{name}", response_model=PolicyPublic, tags=["use cases"])
    def get_use_case(name: UseCaseName, ledger: LedgerDep) -> PolicyPublic:
        """A use case's current policy."""
        return _public(ledger.policies.get(name))

    @app.get("/v1/use-cases/{name}/versions", response_model=list[PolicyPublic], tags=["use cases"])
    def use_case_versions(name: UseCaseName, ledger: LedgerDep) -> list[PolicyPublic]:
        """Every version of a use case's policy, oldest first (deleted ones too)."""
        return [_public(p) for p in ledger.policies.versions(name)]

    @app.put("/v1/use-cases/{name}", response_model=PolicyPublic, tags=["use cases"])
    def put_use_case(
        name: UseCaseName,
        body: Annotated[
            dict[str, Any],
            Body(
                description="A policy (the fields of `PolicyCreate`); `name` may be omitted.",
                openapi_examples=_POLICY_EXAMPLES,
            ),
        ],
        ledger: LedgerDep,
        _admin: None = AdminDep,
    ) -> PolicyPublic:
        """Create or replace a use case's policy (a new version; spent budget is kept)."""
        data = dict(body)
        if data.setdefault("name", name) != name:
            raise InvalidRequest("name", f"must equal the path's use case {name!r}")
        policy = PolicyCreate.model_validate(data)
        return _public(ledger.policies.apply(policy, actor="admin"))

    @app.delete("/v1/use-cases/{name}", response_model=PolicyPublic, tags=["use cases"])
    def delete_use_case(
        name: UseCaseName, ledger: LedgerDep, _admin: None = AdminDep
    ) -> PolicyPublic:
        """Retire a use case (an inactive version); its history and charges stay."""
        return _public(ledger.policies.delete(name, actor="admin"))

    # -- estimates -----------------------------------------------------------------------------

    def _day_range(start: date | None, end: date | None) -> tuple[int, int]:
        today = utc_day(clock.now())
        first = (
            utc_day(datetime(start.year, start.month, start.day, tzinfo=UTC))
            if start
            else today - 89
        )
        last = utc_day(datetime(end.year, end.month, end.day, tzinfo=UTC)) if end else today
        if first > last:
            raise InvalidRequest("from", "must not be after `to`")
        return first, last

    @app.get("/v1/use-cases/{name}/estimates", response_model=Estimates, tags=["estimates"])
    def estimates(
        name: UseCaseName,
        ingestor: IngestorDep,
        candidates: Annotated[list[str], Query(min_length=1, max_length=300_000)],
        start: Annotated[date | None, Query(alias="from")] = None,
        end: Annotated[date | None, Query(alias="to")] = None,
        _admin: None = AdminDep,
    ) -> Estimates:
        """Frequency estimates with standard errors from the chosen days' sketches (>= T)."""
        return _estimate(ingestor, name, candidates, start, end)

    @app.post("/v1/use-cases/{name}/estimates:query", response_model=Estimates, tags=["estimates"])
    def estimates_query(
        name: UseCaseName,
        ingestor: IngestorDep,
        query: EstimateQuery,
        _admin: None = AdminDep,
    ) -> Estimates:
        """As ``GET .../estimates``, with the candidates in the body (for long lists)."""
        return _estimate(ingestor, name, query.candidates, query.start, query.end)

    def _estimate(
        ingestor: Ingestor, name: str, candidates: list[str], start: date | None, end: date | None
    ) -> Estimates:
        policy = ingestor.ledger.policies.get(name)
        first, last = _day_range(start, end)
        sketch, days = load_sketch(ingestor.ledger, ingestor, policy, first, last)
        est = sketch.estimate(candidates)
        items = [
            EstimateItem(item=str(c), count=float(n), stderr=float(s))
            for c, n, s in zip(est.candidates, est.counts, est.stderr, strict=True)
            if n >= policy.publish_threshold
        ]
        items.sort(key=lambda e: -e.count)
        return Estimates(
            use_case=name,
            days=[day_date(d) for d in days],
            n=est.n,
            publish_threshold=policy.publish_threshold,
            estimates=items,
        )

    @app.get("/v1/use-cases/{name}/discoveries", response_model=Discoveries, tags=["estimates"])
    def discoveries(
        name: UseCaseName,
        ingestor: IngestorDep,
        start: Annotated[date | None, Query(alias="from")] = None,
        end: Annotated[date | None, Query(alias="to")] = None,
        _admin: None = AdminDep,
    ) -> Discoveries:
        """Words discovered by SFP over the chosen days, above the publication threshold."""
        policy = ingestor.ledger.policies.get(name)
        if policy.mechanism != "sfp":
            raise InvalidRequest("name", f"use case {name!r} is not an SFP use case")
        first, last = _day_range(start, end)
        sketch, days = load_sketch(ingestor.ledger, ingestor, policy, first, last)
        assert isinstance(sketch, SfpSketch)
        found = cached_discovery(policy, days, sketch)
        return Discoveries(
            use_case=name,
            days=[day_date(d) for d in days],
            n=sketch.n,
            words=[Discovery(word=d.word, count=d.count, stderr=d.stderr) for d in found],
        )

    # -- operations ----------------------------------------------------------------------------

    @app.get("/healthz", tags=["operations"])
    def healthz(ledger: LedgerDep) -> dict[str, str]:
        """Liveness and database reachability."""
        with ledger.engine.connect() as conn:
            conn.execute(select(1))
        return {"status": "ok"}

    @app.get("/metrics", response_class=PlainTextResponse, tags=["operations"])
    def metrics(ledger: LedgerDep) -> PlainTextResponse:
        """Prometheus metrics."""
        with ledger.engine.connect() as conn:
            inbox_depth.set(
                conn.execute(select(func.count()).select_from(InboxRow.__table__)).scalar_one()  # type: ignore[attr-defined]
            )
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/audit/verify", response_model=AuditVerification, tags=["audit"])
    def audit_verify(ledger: LedgerDep, _admin: None = AdminDep) -> AuditVerification:
        """Check the whole audit chain, its tags and its signed checkpoints.

        ``ok`` false names the first bad entry and what is wrong with it. Admins only: it
        reads the whole log.
        """
        kept = kept_checkpoints(settings.checkpoint_file)
        verdict = verify_service(ledger, now=clock.now(), kept=kept)
        return AuditVerification(**verdict.to_dict())

    @app.get("/v1/audit/devices/{device_id}", response_model=Timeline, tags=["audit"])
    def audit_device(
        device_id: Annotated[str, Path(min_length=1, max_length=256)],
        ledger: LedgerDep,
        admin: AdminCredential,
        x_device_id: Annotated[str | None, Header(alias="X-Device-Id")] = None,
    ) -> Timeline:
        """A device's charge timeline and cumulative epsilon, per use case and in total.

        Window and lifetime curves, with the tight bounds; a device reads its own, admins any.
        """
        if not admin:
            if x_device_id is None:
                raise _Http(401, "send `X-Device-Id` (the device itself) or an admin token")
            if x_device_id != device_id:
                raise _Http(403, "a device may read only its own timeline")
        return device_timeline(ledger, device_id, now=clock.now())

    @app.get("/v1/audit/use-cases/{name}/distribution", response_model=Distribution, tags=["audit"])
    def audit_distribution(
        name: UseCaseName,
        ledger: LedgerDep,
        scope: Annotated[Literal["window", "lifetime"], Query()] = "window",
        bins: Annotated[int, Query(ge=1, le=200)] = 20,
    ) -> Distribution:
        """Histogram and quantiles of cumulative epsilon per device (public: names no device)."""
        return distribution(ledger, name, now=clock.now(), scope=scope, bins=bins)

    @app.post("/v1/use-cases/{name}/what-if", response_model=WhatIf, tags=["use cases"])
    def what_if_route(
        name: UseCaseName,
        body: Annotated[
            dict[str, Any],
            Body(
                description="A proposed policy: any fields of `PolicyCreate`; the others are"
                " the current policy's.",
                openapi_examples={
                    "halve emoji": {"value": {"max_reports_per_day": 1, "window_epsilon_cap": 60}}
                },
            ),
        ],
        ledger: LedgerDep,
        _admin: None = AdminDep,
    ) -> WhatIf:
        """What a proposed policy would do on today's ledger; nothing is changed.

        Devices whose next report today would be refused, devices over the proposed caps, and
        the effective-epsilon figures, each under the current and the proposed policy.
        """
        current = ledger.policies.get(name)
        data = current.model_dump(include=set(PolicyBase.model_fields))
        if body.get("name", name) != name:
            raise InvalidRequest("name", f"must equal the path's use case {name!r}")
        data.update(body)
        return what_if(ledger, name, PolicyCreate.model_validate(data), now=clock.now())

    # The report's delta-free basis (one scan of the ledger) is kept for report_cache_seconds;
    # each delta's report is derived from it (one composition per distinct device ledger) and
    # kept in an LRU of REPORT_CACHE_ENTRIES, emptied when the basis is renewed. The lock makes
    # one thread compute while the others wait for its answer.
    basis_cache: list[tuple[float, ReportBasis]] = []
    report_cache: OrderedDict[float | None, EffectiveEpsilonReport] = OrderedDict()
    report_lock = threading.Lock()
    app.state.effective_epsilon_reports = report_cache  # for tests: its size is bounded
    verify_cache: dict[str, tuple[float, Verification]] = {}
    discovered: dict[tuple[str, int, tuple[int, ...], int], list[DiscoveredWord]] = {}

    def cached_discovery(
        policy: Policy, days: Sequence[int], sketch: SfpSketch
    ) -> list[DiscoveredWord]:
        """SFP discovery (seconds on a full sketch) once per policy version, days and size."""
        key = (policy.name, policy.version, tuple(days), sketch.n)
        found = discovered.get(key)
        if found is None:
            found = sketch.discover_detailed(threshold=policy.publish_threshold or None)
            if len(discovered) > 16:
                discovered.clear()
            discovered[key] = found
        return found

    def cached_report(ledger: Ledger, delta: float | None) -> EffectiveEpsilonReport:
        """The report at ``delta`` (validated by the route): bounded memory, cheap per delta."""
        with report_lock:
            if not basis_cache or time.monotonic() >= basis_cache[0][0]:
                basis = ledger.effective_epsilon_basis(now=clock.now())
                basis_cache[:] = [(time.monotonic() + settings.report_cache_seconds, basis)]
                report_cache.clear()
            found = report_cache.get(delta)
            if found is not None:
                report_cache.move_to_end(delta)
                return found
            report = finish_report(basis_cache[0][1], accountant=ledger.accountant, delta=delta)
            report_cache[delta] = report
            while len(report_cache) > REPORT_CACHE_ENTRIES:
                report_cache.popitem(last=False)
            return report

    def cached_verification(ledger: Ledger) -> Verification:
        cached = verify_cache.get("chain")
        if cached is not None and time.monotonic() < cached[0]:
            return cached[1]
        kept = kept_checkpoints(settings.checkpoint_file)
        result = verify_service(ledger, now=clock.now(), kept=kept)
        verify_cache["chain"] = (time.monotonic() + settings.verify_cache_seconds, result)
        return result

    public_page: list[tuple[float, str]] = []  # at most one entry: the page without estimates
    public_page_lock = threading.Lock()

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def dashboard(
        ledger: LedgerDep,
        ingestor: IngestorDep,
        admin: AdminCredential,
        estimate: Annotated[str | None, Query(max_length=63)] = None,
        candidates: Annotated[list[str] | None, Query(max_length=1000)] = None,
    ) -> HTMLResponse:
        """The dashboard page (:mod:`api.dashboard`).

        Public: policies, the effective-epsilon report, cumulative epsilon, histograms and the
        chain's status, rendered at most once per ``report_cache_seconds`` into one cached page
        whatever the query. Estimates are what ``GET .../estimates`` and ``.../discoveries``
        protect, so with the admin token only: SFP's words, and with
        ``?estimate=NAME&candidates=...`` a dictionary's estimates.
        """
        if not admin:
            if estimate is not None or candidates:
                raise _Http(
                    401,
                    "estimates on the dashboard need `Authorization: Bearer <admin token>`,"
                    " as `GET /v1/use-cases/{name}/estimates` does",
                )
            with public_page_lock:  # one render at a time; the others wait for its page
                if public_page and time.monotonic() < public_page[0][0]:
                    return HTMLResponse(public_page[0][1])
                page = render_page(ledger, ingestor, None, None)
                public_page[:] = [(time.monotonic() + settings.report_cache_seconds, page)]
            return HTMLResponse(page)
        return HTMLResponse(render_page(ledger, ingestor, estimate, candidates or []))

    def render_page(
        ledger: Ledger, ingestor: Ingestor, estimate: str | None, candidates: list[str] | None
    ) -> str:
        """The dashboard's HTML; ``candidates`` None: the public page, with no estimates."""
        now = clock.now()
        today = utc_day(now)
        policies = ledger.policies.list()
        if estimate is not None and estimate not in {p.name for p in policies}:
            raise UnknownUseCase(estimate)
        panels = []
        for p in policies if candidates is not None else []:
            if p.mechanism != "sfp" and p.name != estimate:
                continue
            sketch, days = load_sketch(ledger, ingestor, p, today - p.retention_days + 1, today)
            if isinstance(sketch, SfpSketch):
                found = cached_discovery(p, days, sketch)
                rows = [(w.word, w.count, w.stderr) for w in found]
                panels.append(EstimatePanel(p.name, f"{p.name}: discovered words", sketch.n, rows))
            elif candidates:
                est = sketch.estimate(candidates)
                rows = sorted(
                    (
                        (str(c), float(n), float(s))
                        for c, n, s in zip(est.candidates, est.counts, est.stderr, strict=True)
                        if n >= p.publish_threshold
                    ),
                    key=lambda r: -r[1],
                )
                panels.append(EstimatePanel(p.name, f"{p.name}: estimates", est.n, rows))
        hint = (
            "With the admin token, ?estimate=USE_CASE&candidates=a&candidates=b adds a"
            " dictionary's estimates (and SFP's discovered words)."
        )
        return render_dashboard(
            policies=policies,
            report=cached_report(ledger, None),
            series=[cumulative_series(ledger, p.name, now=now) for p in policies],
            distributions=[distribution(ledger, p.name, now=now) for p in policies],
            estimates=panels,
            chain=cached_verification(ledger),
            hint=hint + " JSON for all of this: /v1/audit/effective-epsilon, /v1/audit/use-cases/"
            "NAME/distribution, /v1/audit/verify; API documentation at /docs.",
        )

    @app.get("/v1/audit/effective-epsilon", response_model=EffectiveEpsilonReport, tags=["audit"])
    def effective_epsilon(
        ledger: LedgerDep,
        delta: Annotated[
            float | None,
            Query(gt=0, lt=1, description="Delta of the tight bounds; default the policies'."),
        ] = None,
    ) -> EffectiveEpsilonReport:
        """The effective-epsilon report Tang et al. (2017) ask for.

        What each use case's policy allows per report, day, window and year, beside what
        devices actually spent, and the total across use cases. Public, as Tang et al. ask:
        it names no device. The ledger is read at most every ``report_cache_seconds``; any
        delta's figures are derived from that reading, one composition per distinct device
        ledger (the last 32 deltas asked are kept). ``as_of`` and ``provenance`` say how it was
        computed; each (epsilon, delta) figure says what it is (``bound``, ``kind``, ``note``).
        """
        return cached_report(ledger, delta)

    @app.post("/v1/admin/jobs/{job}:run", tags=["operations"])
    def run_job_now(
        job: str,
        request: Request,
        _admin: None = AdminDep,
        force: Annotated[
            bool, Query(description="Take the job's lease from whoever holds it (after a crash).")
        ] = False,
    ) -> dict[str, Any]:
        """Run a scheduled job now (``flush-inbox``, ``aggregate``, ``purge``, ``checkpoint``)."""
        if job not in JOBS:
            raise _Http(404, f"unknown job {job!r}; jobs: {', '.join(JOBS)}")
        result = run_job(job, request.app.state.runtime_key, force=force)
        if result is None:
            raise _Http(
                409, f"job {job!r} is running in another process; force=true takes its lease"
            )
        return {"job": job, "result": result}

    @app.post("/v1/admin/jobs/{job}:release", tags=["operations"])
    def release_job_now(job: str, request: Request, _admin: None = AdminDep) -> dict[str, Any]:
        """Clear a job's lease whoever holds it (a crashed process); ``released``: it was held."""
        if job not in JOBS:
            raise _Http(404, f"unknown job {job!r}; jobs: {', '.join(JOBS)}")
        released = release_job(request.app.state.ledger.engine, job)
        return {"job": job, "lease": lease_of(job), "released": released}

    return app


class _Http(Exception):
    """An HTTP error with a plain message (mapped by the app's handler)."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers


DOMAIN_ERRORS: tuple[type[Exception], ...] = (
    InvalidReport,
    InvalidRequest,
    UnknownUseCase,
    IdempotencyConflict,
    PolicyConflict,
    PolicyChanged,
    _Http,
)


def error_response(exc: Exception) -> JSONResponse | None:
    """The one mapping of domain errors to HTTP answers (``None``: not a domain error)."""
    if isinstance(exc, InvalidReport):
        loc = ["body", *exc.field.split(".")]
        item = {"loc": loc, "field": exc.field, "msg": str(exc), "type": "value_error"}
        return JSONResponse({"detail": [item]}, status_code=422)
    if isinstance(exc, InvalidRequest):
        item = {"loc": [exc.field], "field": exc.field, "msg": str(exc), "type": "value_error"}
        return JSONResponse({"detail": [item]}, status_code=422)
    if isinstance(exc, UnknownUseCase):
        return JSONResponse({"detail": str(exc)}, status_code=404)
    if isinstance(exc, IdempotencyConflict):
        return JSONResponse({"detail": str(exc), "field": "Idempotency-Key"}, status_code=409)
    if isinstance(exc, PolicyConflict):
        return JSONResponse({"detail": str(exc), "field": exc.field}, status_code=409)
    if isinstance(exc, PolicyChanged):
        return JSONResponse({"detail": str(exc)}, status_code=409)
    if isinstance(exc, _Http):
        return JSONResponse({"detail": exc.detail}, status_code=exc.status, headers=exc.headers)
    return None


def _refusal(decision: Any, clock: Clock) -> JSONResponse:
    headers = {}
    if decision.retry_at is not None:
        seconds = max(1, math.ceil((decision.retry_at - clock.now()).total_seconds()))
        headers["Retry-After"] = str(seconds)
    by = decision.refused_by
    headers["X-Refused-By"] = str(by)
    caps = {
        "daily_cap": "daily epsilon limit" if by in ("device", "quota") else "daily report cap",
        "window_cap": "window epsilon cap",
        "lifetime_cap": "lifetime epsilon cap",
        "lifetime_filter": "lifetime (epsilon, delta) filter",
    }
    whose = {
        "device": "the device-wide budget",
        "quota": f"use case {decision.use_case!r}'s quota of the device-wide budget",
    }.get(by, f"budget {decision.budget!r}")
    return JSONResponse(
        {
            "detail": f"the {caps[decision.reason]} of {whose} is reached",
            "reason": decision.reason,
            "refused_by": by,
            "use_case": decision.use_case,
            "budget": decision.budget,
            "retry_at": decision.retry_at.isoformat() if decision.retry_at else None,
        },
        status_code=429,
        headers=headers,
    )


def init_service_db(engine: Any) -> None:
    """Create the ledger, policy and pipeline tables (a new SQLite file readable by us alone)."""
    import api.ingestion.tables  # noqa: F401 - registers the pipeline tables

    create_private_sqlite_file(engine)
    init_db(engine)


def create_private_sqlite_file(engine: Any) -> None:
    """Create a missing SQLite database file with mode 0600, like the secrets beside it.

    SQLite gives its ``-wal`` and ``-shm`` files the database file's mode. An existing file,
    an in-memory database and PostgreSQL are left alone.
    """
    if engine.dialect.name != "sqlite":
        return
    path = engine.url.database
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass

"""Reports: one device's report, and a relay's batch of many devices' reports.

A single report goes from the route (or the fast lane, :mod:`dp_governor.api._lane`) to
:func:`accept_report`, the group committer (:mod:`dp_governor.api._committer`),
:meth:`dp_governor.pipeline.ingest.Ingestor.submit_group` and the ledger's gate.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Final

import orjson
from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import State

from dp_governor.api._bodies import check_json
from dp_governor.api._committer import GroupCommitter
from dp_governor.api._ratelimit import RateLimiter
from dp_governor.api.deps import (
    AdminDep,
    ClockDep,
    DeviceHeader,
    IdempotencyKeyHeader,
    IngestorDep,
    MetricsDep,
    SettingsDep,
    UseCaseName,
)
from dp_governor.api.errors import ACCEPTED, INVALID, REFUSED, TOO_LARGE, HttpError, status_of
from dp_governor.api.metrics import Metrics
from dp_governor.api.schemas import BatchResult, Receipt, ReportBody, batch_body
from dp_governor.budget import Clock, Decision, InvalidRequest, UnknownUseCase
from dp_governor.budget.clock import day_date
from dp_governor.pipeline.ingest import Ingestor, SubmitRequest

__all__ = ["accept_report", "batch_router", "refusal", "router"]

router = APIRouter(tags=["reports"])


# Real reports of the default emoji (CMS, m = 1024) and QuickType (SFP) policies, as examples.
_CMS_EXAMPLE: Final = {
    "j": 53182,
    "bits": (
        "UIAELzoCwAIhsABIAAAIAAAgCAARAEADCISAABCCABAgACQAAIAAAAABDAAIAEQQAgAAAEBIIACAAgAA"
        "gYAAAAAAAAAKAACABMBUARjAAABDAAAAoAMABAAQIgCBAgGAIAEAICAAAAAwIEFAAABDhQAiIRABAKAB"
        "AQIAAABIAAA="
    ),
}
_SFP_EXAMPLE: Final = {
    "word": {
        "j": 175,
        "bits": (
            "GZLK8+gs0aZbAgSCgjCAIAZOiAESBJA8jBgQgTjgF4Igg0AQCAABQIgw0AiCBEOAIAAFFATCkCgAcAGr"
            "PhAKQEFwAwSgACgAziVoEd1BCAW4DkSKQDWIwAUCIBgQoBhCATADJkCCLAPiFZQAQAQ4eAIiUYAQiigw"
            "ECwyAAWIQAs="
        ),
    },
    "fragment": {
        "j": 1170,
        "bits": (
            "gAAAAAAAAAAAAAAAAEgABAQAAEAEQAAAgAAAAAAgIAAQAAIAAQBgAAAAAAAAAAgAABhAAAAAAAABgAAA"
            "AAAAYEAIAAAAQIAEFQAAAAAAAAIAAAAAAAAQAAAAgAAAAAABAAAAgAACIAACEABAACAAAAAAAAAAAAAA"
            "AAAAAICAAoA="
        ),
    },
    "position": 8,
}


@router.post(
    "/v1/use-cases/{name}/reports",
    status_code=ACCEPTED,
    response_model=Receipt,
    responses={
        404: {"description": "Unknown use case"},
        409: {"description": "Idempotency key reused for a different report"},
        422: {"description": "Invalid report; `detail[].field` names the field"},
        429: {
            "description": "A cap is reached, or the report's day can no longer be counted"
            " (`clock_behind`); `Retry-After` says when to retry"
        },
    },
)
async def submit_report(
    name: UseCaseName,
    request: Request,
    ingestor: IngestorDep,
    device_id: DeviceHeader,
    body: Annotated[
        ReportBody,
        Body(
            openapi_examples={
                "hcms": {"value": {"j": 17, "l": 1023, "bit": -1}},
                "cms": {"value": _CMS_EXAMPLE},
                "sfp": {"value": _SFP_EXAMPLE},
            }
        ),
    ],
    idempotency_key: IdempotencyKeyHeader = None,
) -> Receipt | JSONResponse:
    """Submit one privatized report; it is charged and enqueued atomically.

    Well-formed requests are served by the report fast lane (the same logic without the
    framework's per-request machinery); this route documents them and answers the rest.
    """
    check_json(body)
    return await accept_report(request.app.state, name, device_id, body, idempotency_key)


async def accept_report(
    state: State, name: str, device_id: str, body: Any, idempotency_key: str | None
) -> JSONResponse:
    """Rate limit, group-commit, answer: 202 receipt or 429 refusal (errors raise).

    ``state`` is the app's (what the lifespan built). An unknown use case is refused before
    the rate limiter and the metrics see the request, so rotating names or device ids cannot
    grow either.
    """
    ingestor: Ingestor = state.ingestor
    metrics: Metrics = state.metrics
    if not ingestor.known(name) and not await run_in_threadpool(ingestor.look_up, name):
        metrics.reports_total.labels("unknown", "unknown_use_case").inc()  # one series for all
        raise UnknownUseCase(name)
    device_limit: RateLimiter = state.device_limit
    wait = device_limit.hit(device_id)
    if wait:
        metrics.reports_total.labels(name, "rate_limited").inc()
        raise HttpError(
            REFUSED,
            f"too many requests from this device; retry in {wait} s",
            {"Retry-After": str(wait)},
        )
    committer: GroupCommitter = state.committer
    decision = await committer.submit(SubmitRequest(name, device_id, body, idempotency_key))
    metrics.reports_total.labels(name, decision.reason).inc()
    if not decision.accepted:
        return refusal(decision, state.clock)
    receipt = {
        "receipt": ingestor.receipt(decision),
        "use_case": decision.use_case,
        "policy_version": decision.policy_version,
        "epsilon": decision.epsilon,
        "day": day_date(decision.day).isoformat(),
        "reports_left_today": decision.reports_left_today,
        "replayed": decision.replayed,
    }
    return JSONResponse(receipt, status_code=ACCEPTED)


def refusal(decision: Decision, clock: Clock) -> JSONResponse:
    """The 429 answer to a report refused at a cap, with ``Retry-After`` when it is known."""
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
        "window_filter": "window (epsilon, delta) filter",
        "lifetime_filter": "lifetime (epsilon, delta) filter",
    }
    whose = {
        "device": "the device-wide budget",
        "quota": f"use case {decision.use_case!r}'s quota of the device-wide budget",
    }.get(by or "", f"budget {decision.budget!r}")
    if decision.reason == "clock_behind":
        detail = (
            "the report is dated before what the ledger already holds for this device (this"
            " server's clock is behind another's or a purge's); retry at `retry_at`"
        )
    else:
        detail = f"the {caps[decision.reason]} of {whose} is reached"
    return JSONResponse(
        {
            "detail": detail,
            "reason": decision.reason,
            "refused_by": by,
            "use_case": decision.use_case,
            "budget": decision.budget,
            "retry_at": decision.retry_at.isoformat() if decision.retry_at else None,
        },
        status_code=REFUSED,
        headers=headers,
    )


async def submit_batch(
    name: UseCaseName,
    request: Request,
    ingestor: IngestorDep,
    settings: SettingsDep,
    clock: ClockDep,
    metrics: MetricsDep,
    _admin: None = AdminDep,
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
        raise HttpError(
            TOO_LARGE,
            f"`items` holds {len(items)} items; the maximum is {settings.max_batch_items}",
            field="items",
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
                    "status": ACCEPTED if d.accepted else REFUSED,
                    "receipt": ingestor.receipt(d) if d.accepted else None,
                    "reason": d.reason,
                    "retry_at": d.retry_at,
                    "field": None,
                    "error": None,
                    "replayed": d.replayed,
                }
            )
        else:
            out.append(
                {
                    "status": status_of(r.problem) if r.problem is not None else INVALID,
                    "receipt": None,
                    "reason": None,
                    "retry_at": None,
                    "field": r.field,
                    "error": r.error,
                    "replayed": False,
                }
            )
    for reason, n in outcomes.items():
        metrics.reports_total.labels(name, reason).inc(n)
    return Response(
        orjson.dumps({"accepted": accepted, "results": out}), media_type="application/json"
    )


def batch_router(max_items: int) -> APIRouter:
    """The relay route, built per app: its OpenAPI body states the app's ``max_batch_items``."""
    batch = APIRouter(tags=["reports"])
    batch.add_api_route(
        "/v1/use-cases/{name}/reports:batch",
        submit_batch,
        methods=["POST"],
        response_model=BatchResult,
        openapi_extra={"requestBody": batch_body(max_items)},
    )
    return batch

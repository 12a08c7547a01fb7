"""The routes' dependencies: what the lifespan built, the admin check, typed parameters.

Everything a route needs from the app is reached through one of these (``app.state`` is read
here only), so a route's signature says what it uses.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Header, Path, Query, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine

from dp_governor.api._caches import Caches
from dp_governor.api._handles import ledger_engine, policy_store
from dp_governor.api._ratelimit import RateLimiter
from dp_governor.api.errors import FORBIDDEN, REFUSED, UNAUTHORIZED, HttpError
from dp_governor.api.metrics import Metrics
from dp_governor.api.settings import Settings
from dp_governor.budget import Clock, Ledger
from dp_governor.pipeline.ingest import Ingestor
from dp_governor.policies.repository import PolicyStore

__all__ = [
    "ADMIN_BEARER",
    "AdminCredential",
    "AdminDep",
    "AllowLoosen",
    "CachesDep",
    "ClockDep",
    "DeviceHeader",
    "DevicePath",
    "EngineDep",
    "GroupName",
    "IdempotencyKeyHeader",
    "IngestorDep",
    "LedgerDep",
    "MetricsDep",
    "PolicyStoreDep",
    "ReadableDevice",
    "SettingsDep",
    "UseCaseName",
    "admin_credential",
    "get_caches",
    "get_clock",
    "get_ingestor",
    "get_ledger",
    "get_metrics",
    "get_settings",
    "readable_device",
    "require_admin",
]


def get_ledger(request: Request) -> Ledger:
    """The app's ledger (built in the lifespan)."""
    ledger: Ledger = request.app.state.ledger
    return ledger


def get_ingestor(request: Request) -> Ingestor:
    """The app's ingestor (built in the lifespan)."""
    ingestor: Ingestor = request.app.state.ingestor
    return ingestor


def get_settings(request: Request) -> Settings:
    """The settings the app was created with."""
    settings: Settings = request.app.state.settings
    return settings


def get_clock(request: Request) -> Clock:
    """The app's clock (the system clock, or a test's)."""
    clock: Clock = request.app.state.clock
    return clock


def get_caches(request: Request) -> Caches:
    """The app's read caches (:class:`dp_governor.api._caches.Caches`)."""
    caches: Caches = request.app.state.caches
    return caches


def get_metrics(request: Request) -> Metrics:
    """The app's Prometheus metrics."""
    metrics: Metrics = request.app.state.metrics
    return metrics


ADMIN_BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="adminToken",
    description="The admin token (`DPGOV_ADMIN_TOKEN`), sent as `Authorization: Bearer <token>`.",
)


def admin_credential(request: Request) -> bool:
    """The one admin check: True for the admin token, False without ``Authorization``.

    It reads the raw header (the security scheme's parser would pass other schemes over in
    silence).

    Any other credential is refused, never ignored: a wrong token is 403 and counts toward
    the client's failures (``admin_failures_per_minute``), a client over that limit gets 429
    even with the right token until its wait is over, ``Bearer`` with nothing after it is 401,
    and a server without an admin token refuses every one with 403. The compare is
    constant-time and never admits an empty token.
    """
    authorization = request.headers.get("authorization")
    if not authorization:
        return False
    expected = request.app.state.settings.admin_token
    if expected is None:
        raise HttpError(
            FORBIDDEN,
            "admin routes are disabled: this server has no admin token (set DPGOV_ADMIN_TOKEN"
            " to at least 32 characters and restart)",
        )
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() == "bearer" and not token:
        raise HttpError(
            UNAUTHORIZED,
            "admin routes need `Authorization: Bearer <token>`; the token is empty",
            field="Authorization",
        )
    failures: RateLimiter = request.app.state.admin_failures
    client = request.client.host if request.client else "unknown"
    wait = failures.blocked(client)
    if wait:
        raise HttpError(
            REFUSED, "too many bad admin tokens; retry later", {"Retry-After": str(wait)}
        )
    secret = expected.get_secret_value().encode()
    if scheme.lower() == "bearer" and secret and hmac.compare_digest(token.encode(), secret):
        return True
    failures.hit(client)
    raise HttpError(FORBIDDEN, "the admin token is not valid", field="Authorization")


AdminCredential = Annotated[bool, Depends(admin_credential)]


def require_admin(
    admin: AdminCredential,
    _scheme: Annotated[HTTPAuthorizationCredentials | None, Security(ADMIN_BEARER)] = None,
) -> None:
    """Admin-only routes: 401 without credentials (and :func:`admin_credential`'s refusals).

    ``_scheme`` declares the ``adminToken`` bearer scheme on these operations in the OpenAPI
    document (the lock and "Authorize" in ``/docs``); :func:`admin_credential` decides.
    """
    if not admin:
        raise HttpError(
            UNAUTHORIZED, "admin routes need `Authorization: Bearer <token>`", field="Authorization"
        )


LedgerDep = Annotated[Ledger, Depends(get_ledger)]


def get_policy_store(ledger: LedgerDep) -> PolicyStore:
    """The store of every policy version, the one way routes read and write policies."""
    return policy_store(ledger)


def get_engine(ledger: LedgerDep) -> Engine:
    """The ledger's engine, for the operations routes' lease and activity queries."""
    return ledger_engine(ledger)


PolicyStoreDep = Annotated[PolicyStore, Depends(get_policy_store)]
EngineDep = Annotated[Engine, Depends(get_engine)]
IngestorDep = Annotated[Ingestor, Depends(get_ingestor)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
ClockDep = Annotated[Clock, Depends(get_clock)]
CachesDep = Annotated[Caches, Depends(get_caches)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
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
IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        description="A key the device chooses per report: a retry with the same key and body"
        " replays the first answer and charges nothing; the same key with another body is 409.",
    ),
]
UseCaseName = Annotated[
    str,
    Path(
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9][a-z0-9-]*$",
        description="The use case (a slug, as in `GET /v1/use-cases`).",
    ),
]
AllowLoosen = Annotated[
    bool,
    Query(
        description="Write a change that loosens a policy (lets some device spend more than the"
        " policies before it: a larger epsilon, cap, delta or filter target, a smaller group or"
        " batch, or caps that stop counting spend they counted). Without it such a change is"
        " refused with 409 naming `allow_loosen` and listing what loosens.",
    ),
]
GroupName = Annotated[
    str,
    Path(
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9][a-z0-9-]*$",
        description="The budget group (a policy's `budget_group`).",
    ),
]
DevicePath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=256,
        description="The device's id, as the device sends it in `X-Device-Id`.",
    ),
]


def readable_device(
    device_id: DevicePath,
    admin: AdminCredential,
    x_device_id: Annotated[
        str | None,
        Header(
            alias="X-Device-Id",
            description="The calling device's own id; it must equal the path's (admins send"
            " the admin token instead).",
        ),
    ] = None,
) -> str:
    """The path's device, if the caller may read its records: the device itself, or an admin.

    401 with neither ``X-Device-Id`` nor the admin token, 403 for another device's id.
    """
    if not admin:
        if x_device_id is None:
            raise HttpError(
                UNAUTHORIZED,
                "send `X-Device-Id` (the device itself) or an admin token",
                field="X-Device-Id",
            )
        if x_device_id != device_id:
            raise HttpError(
                FORBIDDEN,
                "a device may read only its own records (`X-Device-Id` is another id)",
                field="X-Device-Id",
            )
    return device_id


ReadableDevice = Annotated[str, Depends(readable_device)]

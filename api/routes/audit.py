"""Audit: the chain's verification, a device's timeline, distributions, effective epsilon."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Security
from fastapi.security import HTTPAuthorizationCredentials

from dp_governor.api import wire
from dp_governor.api._handles import policy_store
from dp_governor.api._integrity import kept_checkpoints, verify_service
from dp_governor.api.deps import (
    ADMIN_BEARER,
    AdminCredential,
    AdminDep,
    CachesDep,
    ClockDep,
    IngestorDep,
    LedgerDep,
    MetricsDep,
    ReadableDevice,
    SettingsDep,
    UseCaseName,
)
from dp_governor.api.errors import SERVICE_UNAVAILABLE, UNAUTHORIZED, HttpError
from dp_governor.api.schemas import (
    AuditVerification,
    Distribution,
    EffectiveEpsilonReport,
    ErrorBody,
    Finite,
    Timeline,
)
from dp_governor.budget.reporting.views import device_timeline
from dp_governor.policies.errors import UnknownUseCase

__all__ = ["router"]

router = APIRouter(tags=["audit"])


@router.get("/v1/audit/verify", response_model=AuditVerification)
def audit_verify(
    ledger: LedgerDep,
    settings: SettingsDep,
    clock: ClockDep,
    ingestor: IngestorDep,
    metrics: MetricsDep,
    _admin: None = AdminDep,
) -> AuditVerification:
    """Check the whole audit chain, its tags and its signed checkpoints.

    ``ok`` false names the first bad entry and what is wrong with it. Admins only: it
    reads the whole log.
    """
    kept = kept_checkpoints(settings.checkpoint_file)
    verdict = verify_service(ledger, now=clock.now(), kept=kept, seal=ingestor.seal)
    metrics.verified(verdict.ok)
    return AuditVerification(**verdict.to_dict())


@router.get("/v1/audit/devices/{device_id}", response_model=Timeline)
def audit_device(device_id: ReadableDevice, ledger: LedgerDep, clock: ClockDep) -> Timeline:
    """A device's charge timeline and cumulative epsilon, per use case and in total.

    Window and lifetime curves, with the tight bounds; a device reads its own, admins any.
    """
    return wire.timeline(device_timeline(ledger, device_id, now=clock.now()))


_PENDING: dict[int | str, dict[str, Any]] = {
    SERVICE_UNAVAILABLE: {
        "model": ErrorBody,
        "description": "The figures are being computed for the policies in force (after a"
        " policy edit, or on a new install); `Retry-After` says when to ask again.",
    }
}


@router.get(
    "/v1/audit/use-cases/{name}/distribution", response_model=Distribution, responses=_PENDING
)
def audit_distribution(
    name: UseCaseName,
    ledger: LedgerDep,
    caches: CachesDep,
    scope: Annotated[
        Literal["window", "lifetime"],
        Query(description="`window`: epsilon in the retention window; `lifetime`: ever."),
    ] = "window",
    bins: Annotated[int, Query(ge=1, le=200, description="Histogram bins.")] = 20,
) -> Distribution:
    """Histogram and quantiles of cumulative epsilon per device (public: names no device).

    From the figures the ``dashboard`` job stored for the policies in force (any bin count
    derives from them, whatever the ledger's size; 503 while they are being computed).
    """
    policy_store(ledger).get(name)  # UnknownUseCase (404): a name never defined or retired
    spends = caches.figures(ledger).spends_of(name, scope)
    if spends is None:  # retired between the two reads: the figures follow the book in force
        raise UnknownUseCase(name)
    return wire.distribution(spends.distribution(bins))


@router.get(
    "/v1/audit/effective-epsilon", response_model=EffectiveEpsilonReport, responses=_PENDING
)
def effective_epsilon(
    ledger: LedgerDep,
    caches: CachesDep,
    admin: AdminCredential,
    delta: Annotated[
        Finite | None,
        Query(
            gt=0,
            lt=1,
            description="Delta of the tight bounds; default the policies'. Another delta"
            " reads the ledger, so it needs the admin token.",
        ),
    ] = None,
    _scheme: Annotated[HTTPAuthorizationCredentials | None, Security(ADMIN_BEARER)] = None,
) -> EffectiveEpsilonReport:
    """The effective-epsilon report Tang et al. (2017) ask for.

    What each use case's policy allows per report, day, window and year, beside what
    devices actually spent, and the total across use cases. Public, as Tang et al. ask:
    it names no device. At the policies' delta (no ``delta``) it is the report the
    ``dashboard`` job stored: no request computes it. Another ``delta`` (admin token only,
    since it reads the ledger: no visitor can make a request expensive): the ledger is read
    at most every ``report_cache_seconds``; any delta's figures are derived from that
    reading, one composition per distinct device ledger (the last 32 deltas asked are
    kept). ``as_of`` and ``provenance`` say how it was computed; each (epsilon, delta)
    figure says what it is (``bound``, ``kind``, ``note``).
    """
    if delta is None:
        return wire.effective_epsilon(caches.figures(ledger).report)
    if not admin:
        raise HttpError(
            UNAUTHORIZED,
            "`delta`: a report at another delta than the policies' reads the whole ledger, so"
            " it needs `Authorization: Bearer <token>`; without `delta` the report is public",
            field="delta",
        )
    return wire.effective_epsilon(caches.report(ledger, delta))

"""The transparency log: its signed checkpoint, leaves and consistency proofs, a device's record.

Public routes read bounded amounts (one checkpoint, at most 1,000 leaves, one proof of
``O(log n)`` hashes); a device's record is read by the device itself or an admin.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import PlainTextResponse

from dp_governor.api import wire
from dp_governor.api.deps import LedgerDep, ReadableDevice, UseCaseName
from dp_governor.api.errors import NOT_FOUND, HttpError
from dp_governor.api.schemas import ConsistencyProof, DeviceRecord, IsoDay, TlogCheckpoint
from dp_governor.budget.clock import date_day
from dp_governor.budget.errors import InvalidRequest
from dp_governor.budget.reporting.claims import logged_claim, render_report
from dp_governor.budget.reporting.transparency import device_record
from dp_governor.mechanisms.merkle import encode_hashes

__all__ = ["router"]

router = APIRouter(tags=["transparency"])
_MAX_LEAVES = 1_000


@router.get("/v1/tlog/checkpoint", response_model=TlogCheckpoint)
def tlog_checkpoint(ledger: LedgerDep) -> TlogCheckpoint:
    """The newest signed checkpoint and the log's verifier key (public)."""
    point = ledger.tlog.latest()
    return TlogCheckpoint(
        origin=ledger.tlog.origin,
        vkey=ledger.tlog.verifier.vkey(),
        size=0 if point is None else point.size,
        note=None if point is None else point.note,
    )


@router.get("/v1/tlog/leaves", response_model=list[str])
def tlog_leaves(
    ledger: LedgerDep,
    start: Annotated[int, Query(ge=0, description="First leaf index.")],
    end: Annotated[int, Query(ge=1, description="One past the last leaf index.")],
) -> list[str]:
    """The leaves ``[start, end)``, at most 1,000 (public: monitors and recomputes read them)."""
    if not start < end <= start + _MAX_LEAVES:
        raise InvalidRequest("end", f"must be in ({start}, {start + _MAX_LEAVES}], got {end}")
    return [leaf.decode() for leaf in ledger.tlog.entries(start, end)]


@router.get("/v1/tlog/consistency", response_model=ConsistencyProof)
def tlog_consistency(
    ledger: LedgerDep,
    old: Annotated[int, Query(ge=0, description="The smaller tree size.")],
    new: Annotated[int, Query(ge=0, description="The larger tree size.")],
) -> ConsistencyProof:
    """The consistency proof from tree size ``old`` to ``new`` (public; witnesses read it)."""
    try:
        proof = ledger.tlog.consistency(old, new)
    except ValueError as exc:
        raise InvalidRequest("new", str(exc)) from None
    return ConsistencyProof(old=old, new=new, proof=encode_hashes(proof))


@router.get("/v1/devices/{device_id}/tlog", response_model=DeviceRecord)
def tlog_device_record(
    device_id: ReadableDevice,
    ledger: LedgerDep,
    day: Annotated[IsoDay, Query(description="The UTC day, YYYY-MM-DD.")],
) -> DeviceRecord:
    """A device's leaves of one day with inclusion proofs, and the gate's totals that day.

    The device itself (``X-Device-Id``) or an admin; the answer holds the device's label key.
    """
    number = date_day(day)
    return wire.device_record(device_record(ledger, device_id, number))


@router.get("/v1/tlog/reports/{name}/{day}", response_class=PlainTextResponse)
def tlog_daily_report(
    ledger: LedgerDep,
    name: UseCaseName,
    day: Annotated[IsoDay, Path(description="The UTC day, YYYY-MM-DD.")],
) -> PlainTextResponse:
    """The day's transparency report of a use case, rendered from its claim in the log (public).

    ``dpgov audit recompute --log`` regenerates it byte for byte from the public leaves.
    """
    number = date_day(day)
    claim = logged_claim(ledger, name, number)
    if claim is None:
        raise HttpError(NOT_FOUND, f"no claim for use case {name!r} on {day.isoformat()}")
    return PlainTextResponse(render_report(claim))

"""The transparency log: its signed checkpoint, leaves and consistency proofs, a device's record.

Public routes read bounded amounts (one checkpoint, at most 1,000 leaves, one proof of
``O(log n)`` hashes, one tile of 256 hashes or leaves); a device's record is read by the device
itself or an admin. ``/checkpoint`` and ``/tile/...`` are the C2SP ``tlog-tiles`` resources
(static-asset style, outside the JSON API's schema).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response
from fastapi.responses import PlainTextResponse

from dp_governor.api import wire
from dp_governor.api.deps import LedgerDep, ReadableDevice, UseCaseName
from dp_governor.api.errors import NOT_FOUND, HttpError
from dp_governor.api.schemas import ConsistencyProof, DeviceRecord, IsoDay, TlogCheckpoint
from dp_governor.budget.audit.tiles import read_tile
from dp_governor.budget.clock import date_day
from dp_governor.budget.errors import InvalidRequest
from dp_governor.budget.reporting.claims import logged_claim, render_report
from dp_governor.budget.reporting.transparency import device_record
from dp_governor.mechanisms.merkle import encode_hashes
from dp_governor.mechanisms.tiles import TilePath

__all__ = ["router"]

router = APIRouter(tags=["transparency"])
_MAX_LEAVES = 1_000
_IMMUTABLE = "public, max-age=31536000, immutable"


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


@router.get("/checkpoint", include_in_schema=False)
def tiles_checkpoint(ledger: LedgerDep) -> Response:
    """The newest signed checkpoint with its cosignatures (C2SP ``tlog-tiles``; 404 before one)."""
    point = ledger.tlog.latest()
    if point is None:
        raise HttpError(NOT_FOUND, "the log has signed no checkpoint yet")
    return Response(
        point.note,
        media_type="text/plain; charset=utf-8",
        headers={"Cache-Control": "max-age=5"},
    )


@router.get("/tile/{path:path}", include_in_schema=False)
def tiles_tile(ledger: LedgerDep, path: str) -> Response:
    """A tile ``<L>/<N>[.p/<W>]`` or entry bundle ``entries/<N>[.p/<W>]`` (C2SP ``tlog-tiles``).

    404 for one the newest checkpoint does not cover; 422 naming ``path`` for a malformed one.
    """
    try:
        tile = TilePath.parse(path)
    except ValueError as exc:
        raise InvalidRequest("path", str(exc)) from None
    try:
        data = read_tile(ledger.tlog, tile)
    except ValueError as exc:
        raise HttpError(NOT_FOUND, str(exc)) from None
    if data is None:
        raise HttpError(NOT_FOUND, f"the newest checkpoint has no {tile.path()}")
    return Response(
        data, media_type="application/octet-stream", headers={"Cache-Control": _IMMUTABLE}
    )

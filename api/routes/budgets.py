"""Budgets: what a device has left (the device itself or an admin reads it); the device-wide one."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path

from api.deps import AdminCredential, ClockDep, LedgerDep
from api.errors import HttpError
from api.schemas import DeviceBudget
from policies.device import device_budget_versions

__all__ = ["router"]

router = APIRouter(tags=["budgets"])


@router.get("/v1/devices/{device_id}/budget", response_model=DeviceBudget)
def device_budget(
    device_id: Annotated[str, Path(min_length=1, max_length=256)],
    ledger: LedgerDep,
    admin: AdminCredential,
    clock: ClockDep,
    x_device_id: Annotated[str | None, Header(alias="X-Device-Id")] = None,
) -> DeviceBudget:
    """A device reads its own budget (X-Device-Id equal to the path); admins read any."""
    if not admin:
        if x_device_id is None:
            raise HttpError(401, "send `X-Device-Id` (the device itself) or an admin token")
        if x_device_id != device_id:
            raise HttpError(403, "a device may read only its own budget")
    status = ledger.status(device_id, now=clock.now())
    return DeviceBudget(
        device_id=device_id,
        device=ledger.device_wide(device_id, now=clock.now()),
        odometer=ledger.device_odometer(device_id),
        use_cases=status,
    )


@router.get("/v1/device-budget")
def device_budget_versions_route(ledger: LedgerDep) -> list[dict[str, Any]]:
    """Every version of the device-wide budget, oldest first (the last is in force)."""
    with ledger.engine.connect() as conn:
        return [v.model_dump(mode="json") for v in device_budget_versions(conn)]

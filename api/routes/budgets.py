"""Budgets: what a device has left (the device itself or an admin reads it); the device-wide one."""

from __future__ import annotations

from fastapi import APIRouter

from dp_governor.api import wire
from dp_governor.api.deps import ClockDep, LedgerDep, ReadableDevice
from dp_governor.api.schemas import DeviceBudget, DeviceBudgetPublic
from dp_governor.policies.device import device_budget_versions

__all__ = ["router"]

router = APIRouter(tags=["budgets"])


@router.get("/v1/devices/{device_id}/budget", response_model=DeviceBudget)
def device_budget(device_id: ReadableDevice, ledger: LedgerDep, clock: ClockDep) -> DeviceBudget:
    """A device reads its own budget (X-Device-Id equal to the path); admins read any."""
    status = ledger.status(device_id, now=clock.now())
    return wire.device_budget(
        device_id=device_id,
        device=ledger.device_wide(device_id, now=clock.now()),
        odometer=ledger.device_odometer(device_id),
        use_cases=status,
    )


@router.get("/v1/device-budget", response_model=list[DeviceBudgetPublic])
def device_budget_versions_route(ledger: LedgerDep) -> list[DeviceBudgetPublic]:
    """Every version of the device-wide budget, oldest first (the last is in force).

    Public, as the use cases' policies are: a device plans its reports by the limits and
    quotas it draws from.
    """
    with ledger.connect() as conn:
        return [wire.device_budget_version(v) for v in device_budget_versions(conn)]

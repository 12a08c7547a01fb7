"""Use cases: their policies (list, read, history, create or replace, retire) and what-if."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body

from api.deps import AdminDep, ClockDep, LedgerDep, UseCaseName
from api.schemas import POLICY_EXAMPLES, public_policy
from budget import InvalidRequest
from budget.reporting.views import WhatIf, what_if
from policies import PolicyBase, PolicyCreate, PolicyPublic

__all__ = ["router"]

router = APIRouter(tags=["use cases"])


@router.get("/v1/use-cases", response_model=list[PolicyPublic])
def list_use_cases(ledger: LedgerDep) -> list[PolicyPublic]:
    """Every active use case's current policy."""
    return [public_policy(p) for p in ledger.policies.list()]


@router.get("/v1/use-cases/{name}", response_model=PolicyPublic)
def get_use_case(name: UseCaseName, ledger: LedgerDep) -> PolicyPublic:
    """A use case's current policy."""
    return public_policy(ledger.policies.get(name))


@router.get("/v1/use-cases/{name}/versions", response_model=list[PolicyPublic])
def use_case_versions(name: UseCaseName, ledger: LedgerDep) -> list[PolicyPublic]:
    """Every version of a use case's policy, oldest first (deleted ones too)."""
    return [public_policy(p) for p in ledger.policies.versions(name)]


@router.put("/v1/use-cases/{name}", response_model=PolicyPublic)
def put_use_case(
    name: UseCaseName,
    body: Annotated[
        dict[str, Any],
        Body(
            description="A policy (the fields of `PolicyCreate`); `name` may be omitted.",
            openapi_examples=POLICY_EXAMPLES,
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
    return public_policy(ledger.policies.apply(policy, actor="admin"))


@router.delete("/v1/use-cases/{name}", response_model=PolicyPublic)
def delete_use_case(name: UseCaseName, ledger: LedgerDep, _admin: None = AdminDep) -> PolicyPublic:
    """Retire a use case (an inactive version); its history and charges stay."""
    return public_policy(ledger.policies.delete(name, actor="admin"))


@router.post("/v1/use-cases/{name}/what-if", response_model=WhatIf)
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
    clock: ClockDep,
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

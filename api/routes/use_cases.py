"""Use cases and budget groups: policies (list, read, history, create or replace, retire), what-if.

A write that loosens a policy (:func:`dp_governor.budget.rule.loosening.loosenings`) is refused with
409 naming ``allow_loosen`` unless the request sets it; a budget group's shared terms change for all
its members at once (``PUT /v1/budget-groups/{group}``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body

from dp_governor.api import wire
from dp_governor.api.deps import (
    AdminDep,
    AllowLoosen,
    ClockDep,
    GroupName,
    LedgerDep,
    PolicyStoreDep,
    SettingsDep,
    UseCaseName,
)
from dp_governor.api.schemas import BudgetGroupPublic, GroupTerms, PolicyPublic, WhatIf
from dp_governor.api.settings import Settings
from dp_governor.budget import InvalidRequest, UnknownUseCase
from dp_governor.budget.reporting.views import what_if
from dp_governor.policies import DEFAULT_POLICIES, Policy, PolicyBase, PolicyCreate
from dp_governor.policies.model import GroupTerms as StoredTerms
from dp_governor.policies.repository import GROUP_FIELDS, PolicyStore

__all__ = ["router"]

router = APIRouter(tags=["use cases"])


def _policy_example(name: str, **changes: Any) -> dict[str, Any]:
    """A default policy's fields (without name and description) as an OpenAPI example."""
    base = next(p for p in DEFAULT_POLICIES if p["name"] == name)
    value = {k: v for k, v in base.items() if k not in ("name", "description")}
    return {"value": {**value, **changes}}


POLICY_EXAMPLES = {
    "emoji with caps": _policy_example(
        "emoji", window_epsilon_cap=120.0, lifetime_epsilon_cap=1000.0
    ),
    "safari domains (shared budget)": _policy_example("safari-energy-domains"),
    "new words (SFP)": _policy_example("quicktype"),
}


def _public(policy: Policy, settings: Settings) -> PolicyPublic:
    """A policy as this server publishes it (its report schema as the server enforces it)."""
    return wire.policy(policy, family_required=settings.require_report_family)


@router.get("/v1/use-cases", response_model=list[PolicyPublic])
def list_use_cases(store: PolicyStoreDep, settings: SettingsDep) -> list[PolicyPublic]:
    """Every active use case's current policy."""
    return [_public(p, settings) for p in store.list()]


@router.get("/v1/use-cases/{name}", response_model=PolicyPublic)
def get_use_case(name: UseCaseName, store: PolicyStoreDep, settings: SettingsDep) -> PolicyPublic:
    """A use case's current policy."""
    return _public(store.get(name), settings)


@router.get("/v1/use-cases/{name}/versions", response_model=list[PolicyPublic])
def use_case_versions(
    name: UseCaseName, store: PolicyStoreDep, settings: SettingsDep
) -> list[PolicyPublic]:
    """Every version of a use case's policy, oldest first (deleted ones too)."""
    return [_public(p, settings) for p in store.versions(name)]


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
    store: PolicyStoreDep,
    settings: SettingsDep,
    allow_loosen: AllowLoosen = False,
    _admin: None = AdminDep,
) -> PolicyPublic:
    """Create or replace a use case's policy (a new version; spent budget is kept).

    A change that loosens the policy needs `allow_loosen=true` (409 without it, listing what
    loosens). A budget group's shared terms change for every member at once: `PUT
    /v1/budget-groups/{group}`.
    """
    data = dict(body)
    if data.setdefault("name", name) != name:
        raise InvalidRequest("name", f"must equal the path's use case {name!r}")
    policy = PolicyCreate.model_validate(data)
    return _public(store.apply(policy, actor="admin", allow_loosen=allow_loosen), settings)


@router.delete("/v1/use-cases/{name}", response_model=PolicyPublic)
def delete_use_case(
    name: UseCaseName, store: PolicyStoreDep, settings: SettingsDep, _admin: None = AdminDep
) -> PolicyPublic:
    """Retire a use case (an inactive version); its history and charges stay."""
    return _public(store.delete(name, actor="admin"), settings)


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
    store: PolicyStoreDep,
    clock: ClockDep,
    _admin: None = AdminDep,
) -> WhatIf:
    """What a proposed policy would do on today's ledger; nothing is changed.

    Devices whose next report today would be refused, devices over the proposed caps, and
    the effective-epsilon figures, each under the current and the proposed policy.
    """
    current = store.get(name)
    data = current.model_dump(include=set(PolicyBase.model_fields))
    if body.get("name", name) != name:
        raise InvalidRequest("name", f"must equal the path's use case {name!r}")
    data.update(body)
    return wire.what_if(what_if(ledger, name, PolicyCreate.model_validate(data), now=clock.now()))


def _group(store: PolicyStore, group: str) -> BudgetGroupPublic:
    members = [p for p in store.list() if p.budget_group == group]
    if not members:
        raise UnknownUseCase(f"budget group {group!r}")
    terms = StoredTerms.model_validate(members[0].model_dump(include=set(GROUP_FIELDS)))
    names = [p.name for p in members]
    return BudgetGroupPublic(name=group, members=names, terms=wire.group_terms(terms))


@router.get("/v1/budget-groups/{group}", response_model=BudgetGroupPublic)
def get_budget_group(group: GroupName, store: PolicyStoreDep) -> BudgetGroupPublic:
    """A budget group's active members and the terms they share."""
    return _group(store, group)


@router.put("/v1/budget-groups/{group}", response_model=BudgetGroupPublic)
def put_budget_group(
    group: GroupName,
    terms: GroupTerms,
    store: PolicyStoreDep,
    allow_loosen: AllowLoosen = False,
    _admin: None = AdminDep,
) -> BudgetGroupPublic:
    """Set a budget group's shared terms: a new version of every member, in one transaction.

    Every shared field is given (`null` for none). Tightening applies at once; a change that
    loosens needs `allow_loosen=true`. A member whose policy would no longer validate (a cap
    below its epsilon per report) refuses the whole change with 422 naming the field.
    """
    store.update_group(group, wire.submitted_terms(terms), actor="admin", allow_loosen=allow_loosen)
    return _group(store, group)


@router.post("/v1/budget-groups/{group}/what-if", response_model=list[WhatIf])
def group_what_if(
    group: GroupName,
    terms: GroupTerms,
    ledger: LedgerDep,
    store: PolicyStoreDep,
    clock: ClockDep,
    _admin: None = AdminDep,
) -> list[WhatIf]:
    """What new shared terms would do on today's ledger, one answer per member; nothing changes.

    Each member's answer compares its current policy with the proposal, all members changed
    together; `loosens` lists what writing it would need `allow_loosen` for.
    """
    members = [p for p in store.list() if p.budget_group == group]
    if not members:
        raise UnknownUseCase(f"budget group {group!r}")
    shared = terms.model_dump()
    proposed = [
        PolicyCreate.model_validate(
            {**p.model_dump(include=set(PolicyBase.model_fields)), **shared}
        )
        for p in members
    ]
    now = clock.now()
    return [wire.what_if(what_if(ledger, p.name, p, now=now, alongside=proposed)) for p in proposed]

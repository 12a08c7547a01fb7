"""The read side's results as the wire models of :mod:`dp_governor.api.schemas`, one each.

The routes answer with these, so a change to a ``budget`` dataclass or a ``policies`` model
changes the API only if its conversion here changes too (a field the wire model lacks fails
validation, in the tests, not on a user's screen).
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel

from dp_governor.api import schemas
from dp_governor.budget.ledger import BudgetStatus
from dp_governor.budget.reporting.report import EffectiveEpsilonReport
from dp_governor.budget.reporting.transparency import DeviceRecord
from dp_governor.budget.reporting.views import Distribution, Timeline, WhatIf
from dp_governor.budget.rule.standing import DeviceOdometer, DeviceWide
from dp_governor.mechanisms.merkle import encode_hashes
from dp_governor.mechanisms.published import FAMILY_FIELD
from dp_governor.policies import Policy, publish
from dp_governor.policies.device import DeviceBudgetVersion
from dp_governor.policies.model import GroupTerms

__all__ = [
    "device_budget",
    "device_budget_version",
    "distribution",
    "effective_epsilon",
    "group_terms",
    "policy",
    "submitted_terms",
    "timeline",
    "what_if",
]

M = TypeVar("M", bound=BaseModel)


def _read(model: type[M], value: object) -> M:
    """``value``'s fields, read by name, as ``model`` (nested objects likewise)."""
    return model.model_validate(value, from_attributes=True)


def policy(p: Policy, *, family_required: bool) -> schemas.PolicyPublic:
    """A policy version as published (:func:`dp_governor.policies.publish`) by this server.

    Its report schema requires the ``family`` field only when the server refuses bodies
    without it (``family_required``: the ``require_report_family`` setting), so that the
    schema accepts exactly what the server accepts.
    """
    published = publish(p)
    if not family_required:
        schema = published.randomizer.report_schema
        schema["required"] = [f for f in schema["required"] if f != FAMILY_FIELD]
    return _read(schemas.PolicyPublic, published)


def device_budget_version(v: DeviceBudgetVersion) -> schemas.DeviceBudgetPublic:
    """A version of the device-wide budget as published."""
    return _read(schemas.DeviceBudgetPublic, v.public())


def group_terms(terms: GroupTerms) -> schemas.GroupTerms:
    """A budget group's shared terms as the API shows them."""
    return _read(schemas.GroupTerms, terms)


def submitted_terms(terms: schemas.GroupTerms) -> GroupTerms:
    """Shared terms as submitted (validated alike), as the policy store takes them."""
    return GroupTerms.model_validate(terms.model_dump())


def device_budget(
    *,
    device_id: str,
    device: DeviceWide | None,
    odometer: DeviceOdometer,
    use_cases: list[BudgetStatus],
) -> schemas.DeviceBudget:
    """A device's budget: the device-wide standing, its odometer, each use case."""
    fields = {"device_id": device_id, "device": device, "odometer": odometer}
    return _read(schemas.DeviceBudget, fields | {"use_cases": use_cases})


def timeline(t: Timeline) -> schemas.Timeline:
    """A device's charge timeline."""
    return _read(schemas.Timeline, t)


def distribution(d: Distribution) -> schemas.Distribution:
    """A use case's histogram of per-device epsilon."""
    return _read(schemas.Distribution, d)


def effective_epsilon(report: EffectiveEpsilonReport) -> schemas.EffectiveEpsilonReport:
    """The effective-epsilon report."""
    return _read(schemas.EffectiveEpsilonReport, report)


def what_if(w: WhatIf) -> schemas.WhatIf:
    """What a proposed policy would do."""
    return _read(schemas.WhatIf, w)


def device_record(r: DeviceRecord) -> schemas.DeviceRecord:
    """A device's transparency record on the wire (its label key in hex, proofs in base64)."""
    return schemas.DeviceRecord(
        day=r.day,
        label_key=r.label_key.hex(),
        label=r.label,
        checkpoint=r.checkpoint,
        size=r.size,
        covered=r.covered,
        leaves=[
            schemas.LeafProof(index=x.index, leaf=x.leaf.decode(), proof=encode_hashes(x.proof))
            for x in r.leaves
        ],
        gate=[
            schemas.GateTotal(use_case=uc, reports=n, epsilon_micro=eps)
            for uc, (n, eps) in r.gate.items()
        ],
    )

"""The wire models say what the read side's objects hold, field for field, in the same order."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pydantic import BaseModel

from dp_governor.api import schemas
from dp_governor.budget.ledger import BudgetStatus
from dp_governor.budget.privacy.accountant import PrivacyLoss
from dp_governor.budget.reporting import central, report, views
from dp_governor.budget.reporting.loss import DeviceLoss
from dp_governor.budget.rule.standing import DeviceOdometer, DeviceWide, QuotaStatus
from dp_governor.policies._randomizer import PublishedHashFamily, Randomizer
from dp_governor.policies.device import DeviceBudgetPublic
from dp_governor.policies.model import GroupTerms, PolicyPublic

DATACLASSES: list[tuple[Any, type[BaseModel]]] = [
    (BudgetStatus, schemas.BudgetStatus),
    (QuotaStatus, schemas.QuotaStatus),
    (DeviceWide, schemas.DeviceWide),
    (DeviceOdometer, schemas.DeviceOdometer),
    (PrivacyLoss, schemas.PrivacyLoss),
    (DeviceLoss, schemas.DeviceLoss),
    (report.Spread, schemas.Spread),
    (report.LossSpread, schemas.LossSpread),
    (report.UseCaseLine, schemas.UseCaseLine),
    (report.DeviceTotals, schemas.DeviceTotals),
    (report.EffectiveEpsilonReport, schemas.EffectiveEpsilonReport),
    (central.CentralLoss, schemas.CentralLoss),
    (central.BatchFigure, schemas.BatchFigure),
    (central.DayFigure, schemas.DayFigure),
    (central.CentralLine, schemas.CentralLine),
    (views.Series, schemas.Series),
    (views.Timeline, schemas.Timeline),
    (views.Distribution, schemas.Distribution),
    (views.WhatIf, schemas.WhatIf),
]
MODELS: list[tuple[type[BaseModel], type[BaseModel]]] = [
    (PolicyPublic, schemas.PolicyPublic),
    (Randomizer, schemas.Randomizer),
    (PublishedHashFamily, schemas.PublishedHashFamily),
    (GroupTerms, schemas.GroupTerms),
    (DeviceBudgetPublic, schemas.DeviceBudgetPublic),
]


def _default(value: Any) -> Any:
    """A field's default as a value (a factory's product), or the marker of none."""
    if value.default_factory not in (None, dataclasses.MISSING):
        return value.default_factory()
    return value.default


@pytest.mark.parametrize(("domain", "wire"), DATACLASSES, ids=lambda c: c.__name__)
def test_a_wire_model_holds_its_dataclass_fields(domain: Any, wire: type[BaseModel]) -> None:
    fields = dataclasses.fields(domain)
    assert [f.name for f in fields] == list(wire.model_fields)
    for f in fields:
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            assert _default(f) == _default(wire.model_fields[f.name]), f.name
        else:
            assert wire.model_fields[f.name].is_required(), f.name


@pytest.mark.parametrize(("domain", "wire"), MODELS, ids=lambda c: c.__name__)
def test_a_wire_model_publishes_its_policy_model(
    domain: type[BaseModel], wire: type[BaseModel]
) -> None:
    assert list(domain.model_fields) == list(wire.model_fields)
    for name, field in domain.model_fields.items():
        assert field.is_required() == wire.model_fields[name].is_required(), name
        assert _default(field) == _default(wire.model_fields[name]), name

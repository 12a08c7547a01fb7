"""The client's calls, shared by both clients, and the answers they read into wire models."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from functools import cache
from typing import Any, Literal, Protocol

import httpx
from pydantic import TypeAdapter

from dp_governor.api.client._transport import Call
from dp_governor.api.schemas import (
    BatchResult,
    ConsistencyProof,
    DeviceBudget,
    DeviceRecord,
    EffectiveEpsilonReport,
    Estimates,
    JobRun,
    PolicyPublic,
    TlogCheckpoint,
    WhatIf,
)
from dp_governor.api.schemas import Receipt as ReceiptBody
from dp_governor.mechanisms import CMS, HCMS, SFP, from_published
from dp_governor.mechanisms.published import FAMILY_FIELD

__all__ = [
    "JobResult",
    "Mechanism",
    "Receipt",
    "Refusal",
    "RelayItem",
    "ReportBody",
    "SubmitResult",
    "auth_headers",
    "build_randomizer",
    "iso_day",
]

Mechanism = CMS | HCMS | SFP
JobResult = JobRun
"""A job run now: its name and what it reports (the route's :class:`JobRun`)."""


class _ToDict(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


ReportBody = Mapping[str, Any] | _ToDict


class Receipt(ReceiptBody):
    """A 202: the report was charged and stored (``accepted``: always true)."""

    accepted: Literal[True] = True


@dataclass(frozen=True, slots=True)
class Refusal:
    """A budget cap's 429: nothing was spent; retry at ``retry_at`` (UTC)."""

    detail: str
    reason: str
    use_case: str
    budget: str
    retry_at: datetime | None
    accepted: bool = False


SubmitResult = Receipt | Refusal


@dataclass(frozen=True, slots=True)
class RelayItem:
    """One device's report in a relay's batch (``idempotency_key``: a random one if ``None``)."""

    device_id: str
    report: ReportBody
    idempotency_key: str | None = None


@cache
def _adapter(kind: Any) -> TypeAdapter[Any]:
    """A cached pydantic adapter that validates JSON into ``kind``."""
    return TypeAdapter(kind)


def _json(kind: Any) -> Any:
    """A parser of an answer's JSON into ``kind``."""
    return lambda response: _adapter(kind).validate_json(response.content)


def _report_dict(report: ReportBody, family: str | None) -> dict[str, Any]:
    """The JSON body of a report (a dict or a mechanism's report), with ``family`` if known."""
    body = dict(report) if isinstance(report, Mapping) else report.to_dict()
    if family is not None:
        body.setdefault(FAMILY_FIELD, family)
    return body


def _submit_result(response: httpx.Response) -> SubmitResult:
    data = response.json()
    if response.status_code == 202:
        return Receipt.model_validate(data)
    return _adapter(Refusal).validate_python(data)  # type: ignore[no-any-return]


def iso_day(value: object, name: str) -> str:
    """A day parameter as the wire writes it: a ``date`` or an ISO ``YYYY-MM-DD`` string.

    A ``datetime`` (a moment, not a UTC day) or anything else is a ``TypeError``, a string that
    is no such day a ``ValueError``, each naming the parameter.

    >>> iso_day("2026-03-01", "day"), iso_day(date(2026, 3, 1), "day")
    ('2026-03-01', '2026-03-01')
    """
    if isinstance(value, datetime):
        raise TypeError(f"`{name}` must be a date, not a datetime: pass {value.date()!r}")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, str):
        try:  # fromisoformat also reads week dates and basic formats: YYYY-MM-DD alone here
            if date.fromisoformat(value).isoformat() == value:
                return value
        except ValueError:
            pass
        raise ValueError(f"`{name}` must be a day YYYY-MM-DD, got {value!r}")
    raise TypeError(
        f"`{name}` must be a datetime.date or a 'YYYY-MM-DD' string, got {type(value).__name__}"
    )


def _key() -> str:
    return uuid.uuid4().hex


def auth_headers(admin_token: str | None) -> dict[str, str]:
    """The headers every request of a client carries."""
    return {"Authorization": f"Bearer {admin_token}"} if admin_token else {}


def build_randomizer(policy: PolicyPublic) -> Mechanism:
    """The mechanism a published policy prescribes, built from it alone."""
    return from_published(policy.randomizer.model_dump())


class Api:
    """Builds the calls; the families of policies fetched so far go into submitted reports."""

    def __init__(self) -> None:
        self._families: dict[str, str] = {}

    def _policy_call(self, name: str) -> Call:
        def parse(response: httpx.Response) -> PolicyPublic:
            policy = PolicyPublic.model_validate_json(response.content)
            self._families[policy.name] = policy.randomizer.family_id
            return policy

        return Call("GET", f"/v1/use-cases/{name}", parse)

    def _policies_call(self) -> Call:
        def parse(response: httpx.Response) -> list[PolicyPublic]:
            policies = _adapter(list[PolicyPublic]).validate_json(response.content)
            for p in policies:
                self._families[p.name] = p.randomizer.family_id
            return policies  # type: ignore[no-any-return]

        return Call("GET", "/v1/use-cases", parse)

    def _submit_call(
        self, use_case: str, device_id: str, report: ReportBody, idempotency_key: str | None
    ) -> Call:
        headers = {"X-Device-Id": device_id, "Idempotency-Key": idempotency_key or _key()}
        body = _report_dict(report, self._families.get(use_case))
        return Call(
            "POST", f"/v1/use-cases/{use_case}/reports", _submit_result, body, None, headers, (202,)
        )

    def _relay_call(self, use_case: str, items: Sequence[RelayItem]) -> Call:
        family = self._families.get(use_case)
        body = {
            "items": [
                {
                    "device_id": it.device_id,
                    "report": _report_dict(it.report, family),
                    "idempotency_key": it.idempotency_key or _key(),
                }
                for it in items
            ]
        }
        return Call("POST", f"/v1/use-cases/{use_case}/reports:batch", _json(BatchResult), body)

    def _budget_call(self, device_id: str, as_device: bool) -> Call:
        headers = {"X-Device-Id": device_id} if as_device else {}
        path = f"/v1/devices/{device_id}/budget"
        return Call("GET", path, _json(DeviceBudget), headers=headers)

    def _record_call(self, device_id: str, day: date | str) -> Call:
        params = {"day": iso_day(day, "day")}
        path = f"/v1/devices/{device_id}/tlog"
        headers = {"X-Device-Id": device_id}
        return Call("GET", path, _json(DeviceRecord), params=params, headers=headers)

    def _checkpoint_call(self) -> Call:
        return Call("GET", "/v1/tlog/checkpoint", _json(TlogCheckpoint))

    def _consistency_call(self, old: int, new: int) -> Call:
        params = {"old": old, "new": new}
        return Call("GET", "/v1/tlog/consistency", _json(ConsistencyProof), params=params)

    def _report_call(self, delta: float | None) -> Call:
        params = {"delta": delta} if delta is not None else None
        path = "/v1/audit/effective-epsilon"
        return Call("GET", path, _json(EffectiveEpsilonReport), params=params)

    def _what_if_call(self, use_case: str, changes: Mapping[str, Any]) -> Call:
        path = f"/v1/use-cases/{use_case}/what-if"
        return Call("POST", path, _json(WhatIf), dict(changes))

    def _estimates_call(
        self,
        use_case: str,
        candidates: Sequence[str],
        start: date | str | None,
        end: date | str | None,
    ) -> Call:
        body: dict[str, Any] = {"candidates": list(candidates)}
        if start is not None:
            body["from"] = iso_day(start, "start")
        if end is not None:
            body["to"] = iso_day(end, "end")
        path = f"/v1/use-cases/{use_case}/estimates:query"
        return Call("POST", path, _json(Estimates), body)

    def _job_call(self, job: str, wait: float = 0.0) -> Call:
        params = {"wait": wait} if wait else None
        return Call("POST", f"/v1/admin/jobs/{job}:run", _json(JobResult), params=params)

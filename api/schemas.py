"""The HTTP API's request and response models, and the OpenAPI text that goes with them."""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, StringConstraints
from pydantic import Field as PydField

from budget import BudgetStatus
from budget.reporting.device import DeviceOdometer, DeviceWide
from policies import DEFAULT_POLICIES, Policy, PolicyPublic, publish

__all__ = [
    "ERROR_RESPONSES",
    "POLICY_EXAMPLES",
    "AuditVerification",
    "BatchItemResult",
    "BatchResult",
    "DeviceBudget",
    "Discoveries",
    "Discovery",
    "ErrorBody",
    "EstimateItem",
    "EstimateQuery",
    "Estimates",
    "Receipt",
    "batch_body",
    "public_policy",
]


class Receipt(BaseModel):
    """A 202 answer: the charge receipt and what remains today (never a report id)."""

    receipt: str
    use_case: str
    policy_version: int
    epsilon: float
    day: date
    reports_left_today: int
    replayed: bool


class BatchItemResult(BaseModel):
    """One item of a batch answer."""

    status: int
    receipt: str | None = None
    reason: str | None = None
    retry_at: datetime | None = None
    field: str | None = None
    error: str | None = None


class BatchResult(BaseModel):
    """Per-item results, in the order of the items."""

    accepted: int
    results: list[BatchItemResult]


class ErrorBody(BaseModel):
    """An error: ``detail`` says what is wrong (a list of field errors for 422)."""

    detail: str | list[dict[str, Any]]
    field: str | None = None


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        400: "A body that cannot be read (not UTF-8, not the declared encoding).",
        401: "No credentials: `X-Device-Id` or `Authorization: Bearer <admin token>`.",
        403: "Credentials that do not allow this.",
        404: "Unknown use case (or route).",
        409: "Idempotency-key or policy conflict.",
        413: "Body or batch too large.",
        429: "A budget cap or a rate limit; see `Retry-After`.",
    }.items()
}


class AuditVerification(BaseModel):
    """The audit chain's state: entries checked, head, checkpoints, and the first failure."""

    ok: bool
    entries: int
    head_seq: int
    head_hash: str
    checkpoints: int
    latest_checkpoint_seq: int | None
    latest_checkpoint_at: str | None
    first_bad: int | None
    problem: str | None
    state_checked: bool = PydField(
        description="Whether the tables the gate decides on were checked against the chain."
    )
    note: str | None = PydField(description="Why the state was not checked, when it was not.")
    kept_checkpoints: int = PydField(description="Checkpoints read from `checkpoint_file`.")


class DeviceBudget(BaseModel):
    """One device's budget: the device-wide budget first (``null``: none set), then per use case."""

    device_id: str
    device: DeviceWide | None = None
    odometer: DeviceOdometer | None = None
    use_cases: list[BudgetStatus]


class EstimateItem(BaseModel):
    """One candidate's estimated count."""

    item: str
    count: float
    stderr: float


class Estimates(BaseModel):
    """Published estimates (count >= the policy's threshold) over a day range."""

    use_case: str
    days: list[date]
    n: int
    publish_threshold: float
    estimates: list[EstimateItem]


class EstimateQuery(BaseModel):
    """The body of ``POST .../estimates:query``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    candidates: list[Annotated[str, StringConstraints(max_length=1000)]] = PydField(
        min_length=1, max_length=1_000_000
    )
    start: date | None = PydField(default=None, alias="from")
    end: date | None = PydField(default=None, alias="to")


class Discovery(BaseModel):
    """A word discovered by SFP, with its estimate."""

    word: str
    count: float
    stderr: float


class Discoveries(BaseModel):
    """SFP's discovered words over a day range."""

    use_case: str
    days: list[date]
    n: int
    words: list[Discovery]


def public_policy(p: Policy) -> PolicyPublic:
    """A policy as the use-case routes show it (:func:`policies.publish`)."""
    return publish(p)


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


def batch_body(max_items: int) -> dict[str, Any]:
    """The OpenAPI request body of the relay endpoint (parsed by hand, so described by hand)."""
    item = {
        "type": "object",
        "required": ["device_id"],
        "additionalProperties": False,
        "properties": {
            "device_id": {"type": "string", "minLength": 1, "maxLength": 256},
            "report": {
                "type": "object",
                "description": "The report body, exactly as the single-report route takes it.",
            },
            "idempotency_key": {"type": "string", "minLength": 1, "maxLength": 255},
        },
    }
    example = {
        "items": [
            {"device_id": "d-1", "report": {"j": 1, "l": 2, "bit": 1}},
            {"device_id": "d-2", "report": {"j": 3, "l": 4, "bit": -1}, "idempotency_key": "k"},
        ]
    }
    schema = {
        "type": "object",
        "required": ["items"],
        "additionalProperties": False,
        "properties": {"items": {"type": "array", "maxItems": max_items, "items": item}},
    }
    content = {"schema": schema, "examples": {"relay": {"value": example}}}
    return {"required": True, "content": {"application/json": content}}

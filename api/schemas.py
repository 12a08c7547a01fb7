"""The HTTP API's request and response models, and the OpenAPI text that goes with them."""

from __future__ import annotations

import copy
from datetime import date, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, StringConstraints, WithJsonSchema
from pydantic import Field as PydField

from dp_governor.api.errors import (
    BAD_REQUEST,
    CONFLICT,
    FORBIDDEN,
    NOT_FOUND,
    REFUSED,
    TOO_LARGE,
    UNAUTHORIZED,
)
from dp_governor.budget import BudgetStatus
from dp_governor.budget.rule.standing import DeviceOdometer, DeviceWide
from dp_governor.mechanisms import CMS, HCMS, SFP
from dp_governor.mechanisms.published import FAMILY_FIELD
from dp_governor.policies import DEFAULT_POLICIES, Policy, PolicyPublic, publish
from dp_governor.policies.model import GroupTerms

__all__ = [
    "ERROR_RESPONSES",
    "POLICY_EXAMPLES",
    "REPORT_BODY_SCHEMAS",
    "AuditVerification",
    "BatchItemResult",
    "BatchResult",
    "BudgetGroupPublic",
    "DeviceBudget",
    "Discoveries",
    "Discovery",
    "ErrorBody",
    "EstimateItem",
    "EstimateQuery",
    "Estimates",
    "Health",
    "IsoDay",
    "JobRelease",
    "JobRun",
    "Receipt",
    "ReportBody",
    "batch_body",
    "public_policy",
]


_FAMILY = PydField(
    default=None,
    description="The `family_id` of the randomizer the device built (it must equal the policy's);"
    " a report under another family is refused with 422 naming what differs. Required unless"
    " the server sets `DPGOV_REQUIRE_REPORT_FAMILY=false`.",
)


class BudgetGroupPublic(BaseModel):
    """A budget group: its active members and the terms they share."""

    name: str = PydField(description="The group's name (its members' `budget_group`).")
    members: list[str] = PydField(description="The active use cases drawing from the group.")
    terms: GroupTerms = PydField(description="The caps, filters and retention they share.")


_FAMILY_DESCRIPTION = (
    "The randomizer's `family_id` from the policy; a report under another family is refused with"
    " 422 (required when the server sets `DPGOV_REQUIRE_REPORT_FAMILY`)."
)
_BODIES: dict[str, tuple[dict[str, Any], str]] = {  # each mechanism's own body, described
    "HcmsReportBody": (
        HCMS.BODY_SHAPE,
        "An HCMS report (mechanism `hcms`): one privatized Hadamard coefficient.",
    ),
    "CmsReportBody": (CMS.BODY_SHAPE, "A CMS report (mechanism `cms`)."),
    "SfpReportBody": (
        SFP.BODY_SHAPE,
        "An SFP report (mechanism `sfp`): the word's and a fragment's CMS rows.",
    ),
}


def _report_body_schemas() -> tuple[dict[str, Any], dict[str, Any]]:
    """The report body's OpenAPI schema (one of the three) and its components.

    Each component is its mechanism's own description of the body
    (:attr:`dp_governor.mechanisms.Mechanism.BODY_SHAPE`) with the optional ``family`` field.
    """
    family = {"type": "string", "description": _FAMILY_DESCRIPTION}
    components: dict[str, dict[str, Any]] = {}
    for name, (shape, text) in _BODIES.items():
        component: dict[str, Any] = copy.deepcopy(shape)
        components[name] = component | {"title": name, "description": text}
    for component in components.values():
        component["properties"][FAMILY_FIELD] = family
    body = {
        "oneOf": [{"$ref": f"#/components/schemas/{name}"} for name in components],
        "description": "One report, in the shape of the use case's mechanism. The exact schema"
        " (bounds of `j`, `l` and the length of `bits` from k and m) is the policy's"
        " `randomizer.report_schema` (`GET /v1/use-cases/{name}`).",
    }
    return body, components


_REPORT_BODY, REPORT_BODY_SCHEMAS = _report_body_schemas()
ReportBody = Annotated[Any, WithJsonSchema(_REPORT_BODY)]
"""A report body: read as JSON and checked by the ingestor, described as one of the models."""


class Receipt(BaseModel):
    """A 202 answer: the charge receipt and what remains today (never a report id)."""

    receipt: str = PydField(
        description="The charge's receipt: an opaque id a device may keep (never a report id)."
    )
    use_case: str = PydField(description="The use case charged.")
    policy_version: int = PydField(description="The policy version the report was charged under.")
    epsilon: float = PydField(description="Epsilon charged for this report.")
    day: date = PydField(description="The UTC day charged.")
    reports_left_today: int = PydField(
        description="Reports this device may still send today against this budget."
    )
    replayed: bool = PydField(
        description="True when the idempotency key replayed an earlier answer (nothing charged)."
    )


class BatchItemResult(BaseModel):
    """One item of a batch answer."""

    status: int = PydField(
        description="The status the single-report route would answer (202, 409, 422, 429...)."
    )
    receipt: str | None = PydField(
        default=None, description="The receipt when accepted, else null."
    )
    reason: str | None = PydField(
        default=None,
        description="The decision: `accepted`, `daily_cap`, `window_cap`, `lifetime_cap`,"
        " `window_filter` or `lifetime_filter`.",
    )
    retry_at: datetime | None = PydField(
        default=None,
        description="After a refusal, when the next report becomes possible; null: never.",
    )
    field: str | None = PydField(
        default=None, description="For an invalid item, the field at fault."
    )
    error: str | None = PydField(default=None, description="For an invalid item, what is wrong.")


class BatchResult(BaseModel):
    """Per-item results, in the order of the items."""

    accepted: int = PydField(description="How many items were accepted (charged).")
    results: list[BatchItemResult] = PydField(
        description="One result per item, in the order of the items."
    )


class ErrorBody(BaseModel):
    """An error: ``detail`` says what is wrong (a list of field errors for 422)."""

    detail: str | list[dict[str, Any]] = PydField(
        description="What is wrong: a sentence, or for 422 a list of field errors."
    )
    field: str | None = PydField(
        default=None, description="The field, header or parameter at fault, when there is one."
    )


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        BAD_REQUEST: "A body that cannot be read (not UTF-8, not the declared encoding).",
        UNAUTHORIZED: "No credentials: `X-Device-Id` or `Authorization: Bearer <admin token>`.",
        FORBIDDEN: "Credentials that do not allow this.",
        NOT_FOUND: "Unknown use case (or route).",
        CONFLICT: "Idempotency-key or policy conflict.",
        TOO_LARGE: "Body or batch too large.",
        REFUSED: "A budget cap or a rate limit; see `Retry-After`.",
    }.items()
}


class Health(BaseModel):
    """Liveness: the service answers and its database is reachable."""

    status: Literal["ok"] = PydField(description="Always `ok` (otherwise the route fails).")


class JobRun(BaseModel):
    """A scheduled job run now: its name and what it did."""

    job: str = PydField(description="The job that ran.")
    result: dict[str, Any] = PydField(description="What the job did (its own figures).")


class JobRelease(BaseModel):
    """A job's lease cleared: which lease, and whether anyone held it."""

    job: str = PydField(description="The job.")
    lease: str = PydField(description="The lease the job takes (jobs may share one).")
    released: bool = PydField(description="True when the lease was held and is now free.")


class AuditVerification(BaseModel):
    """The audit chain's state: entries checked, head, checkpoints, and the first failure."""

    ok: bool = PydField(description="True when every entry, tag and checkpoint checks out.")
    entries: int = PydField(description="Entries checked.")
    head_seq: int = PydField(description="The last entry's sequence number.")
    head_hash: str = PydField(description="The last entry's chain hash (SHA-256, hex).")
    checkpoints: int = PydField(description="Signed checkpoints in the database.")
    latest_checkpoint_seq: int | None = PydField(
        description="The entry the latest checkpoint signs; null: none yet."
    )
    latest_checkpoint_at: str | None = PydField(
        description="When the latest checkpoint was made (UTC, ISO 8601)."
    )
    first_bad: int | None = PydField(description="The first entry that fails; null when `ok`.")
    problem: str | None = PydField(description="What is wrong with `first_bad`; null when `ok`.")
    state_checked: bool = PydField(
        description="Whether the tables the gate decides on were checked against the chain."
    )
    note: str | None = PydField(description="Why the state was not checked, when it was not.")
    kept_checkpoints: int = PydField(description="Checkpoints read from `checkpoint_file`.")


class DeviceBudget(BaseModel):
    """One device's budget: the device-wide budget first (``null``: none set), then per use case."""

    device_id: str = PydField(description="The device, as in the path.")
    device: DeviceWide | None = PydField(
        default=None,
        description="The device-wide budget that every use case draws from: its limits, what"
        " the device spent and has left today, in its window and over its lifetime, and each"
        " use case against its quota (null: no device-wide budget is set).",
    )
    odometer: DeviceOdometer | None = PydField(
        default=None,
        description="The device's running (epsilon, delta) total under adaptive composition"
        " beside the basic sum (see docs/odometer.md).",
    )
    use_cases: list[BudgetStatus] = PydField(
        description="Its standing against every active use case."
    )


class EstimateItem(BaseModel):
    """One candidate's estimated count."""

    item: str = PydField(description="The candidate.")
    count: float = PydField(
        description="Its estimated count (unbiased; may be negative before the threshold)."
    )
    stderr: float = PydField(
        description="The estimate's standard error (95% interval: count +- 1.96 stderr)."
    )


class Estimates(BaseModel):
    """Published estimates (count >= the policy's threshold) over a day range."""

    use_case: str = PydField(description="The use case.")
    days: list[date] = PydField(description="The UTC days whose sketches were combined.")
    n: int = PydField(description="Reports in those sketches.")
    publish_threshold: float = PydField(description="Estimates below this count are not published.")
    estimates: list[EstimateItem] = PydField(
        description="Candidates at or above the threshold, largest first."
    )


def _iso_day(value: object) -> object:
    """An ISO date ``YYYY-MM-DD`` as given (pydantic would also take a number as a timestamp).

    >>> _iso_day("2026-11-01")
    '2026-11-01'
    """
    if isinstance(value, date) or (
        isinstance(value, str) and len(value) == 10 and value[4] == value[7] == "-"
    ):
        return value
    raise ValueError(f"must be an ISO date (YYYY-MM-DD), got {value!r}")


IsoDay = Annotated[date, BeforeValidator(_iso_day)]
"""A UTC day as an ISO date string; numbers (which pydantic reads as timestamps) are refused."""


class EstimateQuery(BaseModel):
    """The body of ``POST .../estimates:query``."""

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "examples": [{"candidates": ["😂", "❤️"], "from": "2026-11-01", "to": "2026-11-23"}]
        },
    )

    candidates: list[Annotated[str, StringConstraints(max_length=1000)]] = PydField(
        min_length=1, max_length=1_000_000, description="The values to estimate."
    )
    start: IsoDay | None = PydField(
        default=None,
        alias="from",
        description="The first UTC day; default 89 days before today (the last 90 days).",
    )
    end: IsoDay | None = PydField(
        default=None, alias="to", description="The last UTC day; default today."
    )


class Discovery(BaseModel):
    """A word discovered by SFP, with its estimate."""

    word: str = PydField(description="The word SFP found.")
    count: float = PydField(description="Its estimated count.")
    stderr: float = PydField(description="The estimate's standard error.")


class Discoveries(BaseModel):
    """SFP's discovered words over a day range."""

    use_case: str = PydField(description="The SFP use case.")
    days: list[date] = PydField(description="The UTC days whose sketches were combined.")
    n: int = PydField(description="Reports in those sketches.")
    words: list[Discovery] = PydField(
        description="The words found above the publication threshold, most frequent first."
    )


def public_policy(p: Policy) -> PolicyPublic:
    """A policy as the use-case routes show it (:func:`dp_governor.policies.publish`)."""
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

"""The wire models of the report routes: the report body, the receipt, the relay's batch."""

from __future__ import annotations

import copy
from datetime import date, datetime
from typing import Annotated, Any

from pydantic import BaseModel, WithJsonSchema
from pydantic import Field as PydField

from dp_governor.mechanisms.published import FAMILY_FIELD, MECHANISMS

__all__ = [
    "REPORT_BODY_SCHEMAS",
    "BatchItemResult",
    "BatchResult",
    "Receipt",
    "ReportBody",
    "batch_body",
]


_FAMILY_DESCRIPTION = (
    "The `family_id` of the randomizer the device built (it must equal the policy's); a report"
    " under another family is refused with 422 naming what differs. Required unless the server"
    " sets `DPGOV_REQUIRE_REPORT_FAMILY=false`."
)
_BODIES: dict[str, tuple[dict[str, Any], str]] = {  # each mechanism's own body, described
    f"{cls.name.capitalize()}ReportBody": (cls.BODY_SHAPE, cls.BODY_DESCRIPTION)
    for cls in MECHANISMS.values()
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
        description="The charge's receipt: an opaque id a device may keep (never a report id),"
        " unique across the shards of a deployment (docs/api.md#receipts)."
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
        " `window_filter`, `lifetime_filter` or `clock_behind` (dated before what the ledger"
        " holds for the device).",
    )
    retry_at: datetime | None = PydField(
        default=None,
        description="After a refusal, when the next report becomes possible; null: never.",
    )
    field: str | None = PydField(
        default=None, description="For an invalid item, the field at fault."
    )
    error: str | None = PydField(default=None, description="For an invalid item, what is wrong.")
    replayed: bool = PydField(
        default=False,
        description="True when the item's idempotency key replayed an earlier decision"
        " (nothing charged again).",
    )


class BatchResult(BaseModel):
    """Per-item results, in the order of the items."""

    accepted: int = PydField(description="How many items were accepted (charged).")
    results: list[BatchItemResult] = PydField(
        description="One result per item, in the order of the items."
    )


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

"""The wire models of policies: a published policy and its randomizer, budget groups, device budget.

The policy package's own models (:mod:`dp_governor.policies`) validate and store; these are what
the API promises, converted by :mod:`dp_governor.api.wire`. Constraints are stated as the
policies enforce them, so the published schema says what a served value can be.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic import Field as PydField

__all__ = [
    "BudgetGroupPublic",
    "DeviceBudgetPublic",
    "GroupTerms",
    "PolicyPublic",
    "PublishedHashFamily",
    "Randomizer",
]

_TARGET = (
    "{}: the epsilon of the (epsilon, delta) target a privacy filter holds the budget's reports"
    " to, each at epsilon x group size."
)


class PublishedHashFamily(BaseModel):
    """The hash family devices must hash with: algorithm and key."""

    algorithm: str = PydField(description="Always `blake2b-poly31-v1` (docs/mechanisms.md).")
    seed: str = PydField(
        # What the server publishes; parsing stays lenient, so a client still reads an older
        # server's seed that lost its leading zeros (the same key, read as a number).
        json_schema_extra={"pattern": "^[0-9a-f]{64}$"},
        description="The family's 256-bit key in force: exactly 64 lowercase hex digits (the"
        " key's 32 bytes, leading zeros kept; docs/device.md).",
    )


class Randomizer(BaseModel):
    """Everything a device needs to build the server's randomizer (`from_published`)."""

    mechanism: Literal["cms", "hcms", "sfp"] = PydField(description="Which randomizer to build.")
    epsilon: float | None = PydField(default=None, description="CMS and HCMS: epsilon per report.")
    k: int = PydField(description="Hash functions (sketch rows); SFP: of the word sketch.")
    m: int = PydField(description="Sketch width (buckets per row); SFP: of the word sketch.")
    k_fragment: int | None = PydField(default=None, description="SFP only.")
    m_fragment: int | None = PydField(default=None, description="SFP only.")
    epsilon_word: float | None = PydField(default=None, description="SFP only.")
    epsilon_fragment: float | None = PydField(default=None, description="SFP only.")
    alphabet: str | None = PydField(default=None, description="SFP only: the fragments' alphabet.")
    hash_family: PublishedHashFamily = PydField(
        description="The hash family the server decodes with: algorithm and seed."
    )
    family_id: str = PydField(
        description="Identifies mechanism, parameters and hash family; send it as the report"
        " body's `family` field."
    )
    report_schema: dict[str, Any] = PydField(description="JSON schema of one report body.")


class PolicyPublic(BaseModel):
    """A policy version as the API returns it: the seed in force is in ``randomizer`` only."""

    name: str = PydField(max_length=63, description="Use-case slug, e.g. `emoji`.")
    description: str = PydField(
        default="", max_length=500, description="What the use case collects, in a sentence."
    )
    mechanism: Literal["cms", "hcms", "sfp"] = PydField(description="`cms`, `hcms` or `sfp`.")
    k: int = PydField(ge=1, le=1 << 20, description="Hash functions (sketch rows).")
    m: int = PydField(ge=2, le=1 << 24, description="Buckets; a power of two for HCMS.")
    k_fragment: int | None = PydField(default=None, ge=1, le=1 << 20, description="SFP only.")
    m_fragment: int | None = PydField(default=None, ge=2, le=1 << 16, description="SFP only.")
    epsilon_per_report: float = PydField(
        gt=0,
        le=20.0,
        description="Epsilon charged per report (CMS, HCMS; SFP: word + fragment).",
    )
    epsilon_word: float | None = PydField(default=None, gt=0, le=20.0, description="SFP only.")
    epsilon_fragment: float | None = PydField(default=None, gt=0, le=20.0, description="SFP only.")
    max_reports_per_day: int = PydField(
        ge=1, le=1000, description="The daily cap: reports per device and UTC day."
    )
    retention_days: int = PydField(
        default=90,
        ge=1,
        le=3650,
        description="Days the data and charges are kept: the window of the window cap and of"
        " the window filter.",
    )
    group_size: int = PydField(
        default=1, ge=1, le=1000, description="Group-privacy factor: devices per person."
    )
    publish_threshold: float = PydField(
        default=0.0, ge=0, le=1e12, description="Publish counts >= T."
    )
    min_batch_devices: int = PydField(
        default=1,
        ge=1,
        le=10**9,
        description="Distinct devices a shuffled batch needs to publish.",
    )
    window_epsilon_cap: float | None = PydField(
        default=None, gt=0, le=1e9, description="Per device and window."
    )
    lifetime_epsilon_cap: float | None = PydField(
        default=None, gt=0, le=1e9, description="Per device, ever."
    )
    window_filter_epsilon: float | None = PydField(
        default=None, gt=0, le=1e9, description=_TARGET.format("Per device and window")
    )
    window_filter_delta: float | None = PydField(
        default=None, gt=0, lt=1, description="Per device and window: the filter target's delta."
    )
    lifetime_filter_epsilon: float | None = PydField(
        default=None, gt=0, le=1e9, description=_TARGET.format("Per device, ever")
    )
    lifetime_filter_delta: float | None = PydField(
        default=None, gt=0, lt=1, description="Per device, ever: the filter target's delta."
    )
    delta: float = PydField(
        default=1e-9, gt=0, lt=1, description="The delta the tight bounds are computed at."
    )
    budget_group: str | None = PydField(
        default=None, max_length=63, description="Shared budget (caps and account)."
    )
    version: int = PydField(description="The policy version (a new one at each change).")
    active: bool = PydField(description="False once the use case is retired.")
    created_at: datetime = PydField(description="When this version was made (UTC).")
    actor: str = PydField(description="Who made it (`admin`, `defaults`, `policy-file`...).")
    budget: str = PydField(description="The budget this use case draws from (group or own name).")
    epsilon_per_day: float = PydField(description="epsilon_per_report x max_reports_per_day.")
    randomizer: Randomizer = PydField(
        description="What devices build their randomizer from: mechanism, parameters and the"
        " hash family with the seed in force."
    )


class GroupTerms(BaseModel):
    """A budget group's shared terms, as submitted: every field given (``null`` for none).

    The members of a group share one budget, so they share these; a group's terms change for
    all its members at once (:meth:`dp_governor.policies.repository.PolicyStore.update_group`), each
    member's result validated as a ``PolicyCreate``.
    """

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={
            "examples": [
                {
                    "max_reports_per_day": 2,
                    "retention_days": 90,
                    "window_epsilon_cap": None,
                    "lifetime_epsilon_cap": 400.0,
                    "window_filter_epsilon": None,
                    "window_filter_delta": None,
                    "lifetime_filter_epsilon": None,
                    "lifetime_filter_delta": None,
                }
            ]
        },
    )

    max_reports_per_day: int = PydField(
        ge=1, le=1000, description="Reports a device may send a day, all members together."
    )
    retention_days: int = PydField(
        ge=1, le=3650, description="The window of the window cap and filter, in days."
    )
    window_epsilon_cap: float | None = PydField(
        gt=0, le=1e9, description="Epsilon per device and window, all members; null: none."
    )
    lifetime_epsilon_cap: float | None = PydField(
        gt=0, le=1e9, description="Epsilon per device, ever, all members; null: none."
    )
    window_filter_epsilon: float | None = PydField(
        gt=0, le=1e9, description=_TARGET.format("Per device and window")
    )
    window_filter_delta: float | None = PydField(
        gt=0, lt=1, description="Per device and window: the filter target's delta."
    )
    lifetime_filter_epsilon: float | None = PydField(
        gt=0, le=1e9, description=_TARGET.format("Per device, ever")
    )
    lifetime_filter_delta: float | None = PydField(
        gt=0, lt=1, description="Per device, ever: the filter target's delta."
    )


class BudgetGroupPublic(BaseModel):
    """A budget group: its active members and the terms they share."""

    name: str = PydField(description="The group's name (its members' `budget_group`).")
    members: list[str] = PydField(description="The active use cases drawing from the group.")
    terms: GroupTerms = PydField(description="The caps, filters and retention they share.")


class DeviceBudgetPublic(BaseModel):
    """One version of the device-wide budget as the API publishes it (devices plan by it)."""

    model_config = ConfigDict(extra="forbid")

    epsilon_per_day: float | None = PydField(
        default=None,
        gt=0,
        le=1e9,
        description="Epsilon a device may spend per UTC day, all use cases; null: no limit.",
    )
    window_days: int | None = PydField(
        default=None, ge=1, le=3650, description="The device-wide window in days; null: none."
    )
    window_epsilon: float | None = PydField(
        default=None,
        gt=0,
        le=1e9,
        description="Epsilon a device may spend per window, all use cases; null: no limit.",
    )
    lifetime_epsilon: float | None = PydField(
        default=None,
        gt=0,
        le=1e9,
        description="Epsilon a device may spend over its lifetime, all use cases; null: no limit.",
    )
    window_filter_epsilon: float | None = PydField(
        default=None, gt=0, le=1e9, description="Window (epsilon, delta) filter: epsilon."
    )
    window_filter_delta: float | None = PydField(
        default=None, gt=0, lt=1, description="Window (epsilon, delta) filter: delta."
    )
    lifetime_filter_epsilon: float | None = PydField(
        default=None, gt=0, le=1e9, description="Lifetime (epsilon, delta) filter: epsilon."
    )
    lifetime_filter_delta: float | None = PydField(
        default=None, gt=0, lt=1, description="Lifetime (epsilon, delta) filter: delta."
    )
    quotas: dict[str, float] = PydField(
        default_factory=dict,
        description="Per use case, the share (0 < q <= 1) of each device-wide limit it may use.",
    )
    version: int = PydField(description="The version (a new one at each change).")
    created_at: datetime = PydField(description="When this version was made (UTC).")
    actor: str = PydField(description="Who made it (`cli`, `admin`...).")

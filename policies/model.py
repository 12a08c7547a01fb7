"""The use-case policy model: one policy per use case, validated at the edge, versioned in storage.

Entity family as in full-stack-fastapi-template: ``PolicyBase`` (shared fields and their
constraints), ``PolicyCreate`` (strictly validated input), ``PolicyUpdate`` (a partial change),
``Policy`` (the versioned table row) and ``PolicyPublic`` (what the API returns). ``PolicyTerms``
is ``PolicyBase`` without ``hash_seed``: that field is an optional override an operator sets,
and the API publishes the seed in force in ``randomizer.hash_family`` instead, so that a device
never reads a null seed and guesses.
"""

from __future__ import annotations

import hashlib
import math
import re
from datetime import UTC, datetime
from decimal import Decimal
from functools import lru_cache
from typing import Any, Literal, Self

from pydantic import ConfigDict, field_validator, model_validator
from sqlmodel import Field, SQLModel

from dp_governor.mechanisms import CMS, HCMS, SFP, HashFamily
from dp_governor.mechanisms.hadamard import is_power_of_two
from dp_governor.mechanisms.published import build
from dp_governor.mechanisms.sfp import POSITIONS
from dp_governor.policies._randomizer import Randomizer

__all__ = [
    "FILTER_FIELDS",
    "MAX_EPSILON",
    "MAX_SKETCH_BYTES",
    "MICRO",
    "SKETCH_CELL_BYTES",
    "GroupTerms",
    "Mechanism",
    "Policy",
    "PolicyBase",
    "PolicyCreate",
    "PolicyPublic",
    "PolicyTerms",
    "PolicyUpdate",
    "budget_key",
    "default_hash_seed",
    "from_micro",
    "mechanism_for",
    "publish",
    "sketch_bytes",
    "to_micro",
]

MAX_EPSILON = 20.0
MICRO = 1_000_000
# A sketch's counters are at most 8 bytes each (int32, widened to int64 past 2^31 reports); one
# (use case, parameters, day) sketch is held in memory whole when reports are folded into it
# or estimates are read from it, so its size is bounded here, where parameters are accepted.
SKETCH_CELL_BYTES = 8
MAX_SKETCH_BYTES = 1 << 30
SLUG = r"^[a-z0-9][a-z0-9-]{0,62}$"
# A budget's (epsilon, delta) targets, each enforced by a privacy filter (docs/odometer.md).
FILTER_FIELDS = (
    "window_filter_epsilon",
    "window_filter_delta",
    "lifetime_filter_epsilon",
    "lifetime_filter_delta",
)
_TARGET = (
    "{}: the epsilon of the (epsilon, delta) target a privacy filter holds the budget's reports"
    " to, each at epsilon x group size."
)
Mechanism = Literal["cms", "hcms", "sfp"]


def to_micro(value: float, field: str = "epsilon") -> int:
    """Exact integer micro-epsilon of a decimal epsilon with at most 6 decimals.

    >>> to_micro(0.1), to_micro(4)
    (100000, 4000000)
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"`{field}` must be a finite number, got {value!r}")
    return _micro(float(value), field)


@lru_cache(maxsize=4096)
def _micro(value: float, field: str) -> int:
    """The conversion itself, cached (the hot paths convert the same few epsilons)."""
    scaled = Decimal(repr(value)) * MICRO
    if scaled != scaled.to_integral_value():
        raise ValueError(f"`{field}` must be a multiple of 0.000001, got {value!r}")
    return int(scaled)


def from_micro(micro: int) -> float:
    """The float epsilon of an integer micro-epsilon (for display and accounting input).

    >>> from_micro(300000)
    0.3
    """
    return micro / MICRO


def default_hash_seed(name: str) -> str:
    """A deterministic per-use-case hash seed (hex), so devices and server agree by default."""
    return hashlib.sha256(f"dp-governor/hash-seed/{name}".encode()).hexdigest()


class PolicyTerms(SQLModel):
    """The fields every member of the family shows, with their constraints (all but the seed)."""

    name: str = Field(max_length=63, description="Use-case slug, e.g. `emoji`.")
    description: str = Field(default="", max_length=500)
    mechanism: Mechanism = Field(description="`cms`, `hcms` or `sfp`.")
    k: int = Field(ge=1, le=1 << 20, description="Hash functions (sketch rows).")
    m: int = Field(ge=2, le=1 << 24, description="Buckets; a power of two for HCMS.")
    k_fragment: int | None = Field(default=None, ge=1, le=1 << 20, description="SFP only.")
    m_fragment: int | None = Field(default=None, ge=2, le=1 << 16, description="SFP only.")
    epsilon_per_report: float = Field(gt=0, le=MAX_EPSILON)
    epsilon_word: float | None = Field(default=None, gt=0, le=MAX_EPSILON, description="SFP only.")
    epsilon_fragment: float | None = Field(
        default=None, gt=0, le=MAX_EPSILON, description="SFP only."
    )
    max_reports_per_day: int = Field(ge=1, le=1000)
    retention_days: int = Field(default=90, ge=1, le=3650)
    group_size: int = Field(default=1, ge=1, le=1000)
    publish_threshold: float = Field(default=0.0, ge=0, le=1e12, description="Publish counts >= T.")
    min_batch_devices: int = Field(
        default=1, ge=1, le=10**9, description="Distinct devices a shuffled batch needs to publish."
    )
    window_epsilon_cap: float | None = Field(
        default=None, gt=0, le=1e9, description="Per device and window."
    )
    lifetime_epsilon_cap: float | None = Field(
        default=None, gt=0, le=1e9, description="Per device, ever."
    )
    window_filter_epsilon: float | None = Field(
        default=None, gt=0, le=1e9, description=_TARGET.format("Per device and window")
    )
    window_filter_delta: float | None = Field(
        default=None, gt=0, lt=1, description="Per device and window: the filter target's delta."
    )
    lifetime_filter_epsilon: float | None = Field(
        default=None, gt=0, le=1e9, description=_TARGET.format("Per device, ever")
    )
    lifetime_filter_delta: float | None = Field(
        default=None, gt=0, lt=1, description="Per device, ever: the filter target's delta."
    )
    delta: float = Field(default=1e-9, gt=0, lt=1)
    budget_group: str | None = Field(
        default=None, max_length=63, description="Shared budget (caps and account)."
    )


class PolicyBase(PolicyTerms):
    """Fields shared by every stored and submitted member, with their constraints."""

    hash_seed: str | None = Field(
        default=None,
        max_length=64,
        description="An explicit hex seed of the hash family (1-64 hex digits); null: the seed"
        " derived from the use case's name. Either way the API publishes the seed in force as"
        " `randomizer.hash_family.seed`.",
    )


class PolicyCreate(PolicyBase):
    """A policy as submitted: strict types, cross-field rules, exact epsilons."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)  # type: ignore[assignment]

    @field_validator(
        "epsilon_per_report",
        "epsilon_word",
        "epsilon_fragment",
        "window_epsilon_cap",
        "lifetime_epsilon_cap",
        "window_filter_epsilon",
        "lifetime_filter_epsilon",
    )
    @classmethod
    def _micro_exact(cls, value: float | None, info: Any) -> float | None:
        if value is not None:
            to_micro(value, info.field_name)
        return value

    @field_validator("name", "budget_group")
    @classmethod
    def _slug(cls, value: str | None, info: Any) -> str | None:
        if value is not None and not re.fullmatch(SLUG, value):
            raise ValueError(
                f"`{info.field_name}` must be a slug (lowercase letters, digits and '-',"
                f" 1-63 characters, not starting with '-'), got {value!r}"
            )
        return value

    @field_validator("hash_seed")
    @classmethod
    def _hex(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9a-f]{1,64}", value):
            raise ValueError(f"`hash_seed` must be 1-64 lowercase hex digits, got {value!r}")
        return value

    @model_validator(mode="after")
    def _cross_field(self) -> Self:
        sfp_only = ("k_fragment", "m_fragment", "epsilon_word", "epsilon_fragment")
        if self.mechanism == "sfp":
            for name in sfp_only:
                if getattr(self, name) is None:
                    raise ValueError(f"`{name}` is required for mechanism sfp")
            total = to_micro(self.epsilon_word or 0.0) + to_micro(self.epsilon_fragment or 0.0)
            if total != to_micro(self.epsilon_per_report):
                raise ValueError(
                    "`epsilon_word` + `epsilon_fragment` must equal `epsilon_per_report`"
                    f" ({self.epsilon_word} + {self.epsilon_fragment} != {self.epsilon_per_report})"
                )
        else:
            for name in sfp_only:
                if getattr(self, name) is not None:
                    raise ValueError(f"`{name}` is only for mechanism sfp, got {self.mechanism}")
        if self.mechanism == "hcms" and not is_power_of_two(self.m):
            raise ValueError(f"`m` must be a power of 2 for hcms, got {self.m}")
        if self.mechanism != "hcms" and self.m > 1 << 16:
            raise ValueError(f"`m` must be at most 65536 for {self.mechanism}, got {self.m}")
        size = sketch_bytes(self)
        if size > MAX_SKETCH_BYTES:
            cells = "`k` x `m`"
            if self.mechanism == "sfp":
                cells += f" + {len(POSITIONS)} x `k_fragment` x `m_fragment`"
            raise ValueError(
                f"the sketch of {cells} needs {size:,} bytes ({size // SKETCH_CELL_BYTES:,} cells"
                f" of {SKETCH_CELL_BYTES} bytes), over the limit of {MAX_SKETCH_BYTES:,} bytes:"
                " lower `k` or `m`"
            )
        eps = to_micro(self.epsilon_per_report)
        for cap in ("window_epsilon_cap", "lifetime_epsilon_cap"):
            value = getattr(self, cap)
            if value is not None and to_micro(value) < eps:
                raise ValueError(
                    f"`{cap}` must be at least `epsilon_per_report` ({value} < "
                    f"{self.epsilon_per_report}): no report could ever be accepted"
                )
        self._check_filters(eps)
        return self

    def _check_filters(self, eps: int) -> None:
        """Each filter target is given whole and admits a report on its own."""
        for kind in ("window", "lifetime"):
            target, delta = f"{kind}_filter_epsilon", f"{kind}_filter_delta"
            value = getattr(self, target)
            if (value is None) != (getattr(self, delta) is None):
                raise ValueError(f"`{target}` and `{delta}` are given together or not at all")
            if value is not None and to_micro(value) < eps * self.group_size:
                raise ValueError(
                    f"`{target}` must be at least `epsilon_per_report` x `group_size` ({value} <"
                    f" {self.epsilon_per_report} x {self.group_size}): one report alone would"
                    " exceed the target"
                )


class GroupTerms(SQLModel):
    """A budget group's shared terms, as submitted: every field given (``null`` for none).

    The members of a group share one budget, so they share these; a group's terms change for
    all its members at once (:meth:`dp_governor.policies.repository.PolicyStore.update_group`), each
    member's result validated as a ``PolicyCreate``.
    """

    model_config = ConfigDict(  # type: ignore[assignment]
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

    max_reports_per_day: int = Field(
        ge=1, le=1000, description="Reports a device may send a day, all members together."
    )
    retention_days: int = Field(
        ge=1, le=3650, description="The window of the window cap and filter, in days."
    )
    window_epsilon_cap: float | None = Field(
        gt=0, le=1e9, description="Epsilon per device and window, all members; null: none."
    )
    lifetime_epsilon_cap: float | None = Field(
        gt=0, le=1e9, description="Epsilon per device, ever, all members; null: none."
    )
    window_filter_epsilon: float | None = Field(
        gt=0, le=1e9, description=_TARGET.format("Per device and window")
    )
    window_filter_delta: float | None = Field(
        gt=0, lt=1, description="Per device and window: the filter target's delta."
    )
    lifetime_filter_epsilon: float | None = Field(
        gt=0, le=1e9, description=_TARGET.format("Per device, ever")
    )
    lifetime_filter_delta: float | None = Field(
        gt=0, lt=1, description="Per device, ever: the filter target's delta."
    )


class PolicyUpdate(SQLModel):
    """A partial change to a policy; the merged result is validated as a ``PolicyCreate``."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)  # type: ignore[assignment]

    description: str | None = None
    mechanism: Mechanism | None = None
    k: int | None = None
    m: int | None = None
    k_fragment: int | None = None
    m_fragment: int | None = None
    epsilon_per_report: float | None = None
    epsilon_word: float | None = None
    epsilon_fragment: float | None = None
    max_reports_per_day: int | None = None
    retention_days: int | None = None
    group_size: int | None = None
    publish_threshold: float | None = None
    min_batch_devices: int | None = None
    window_epsilon_cap: float | None = None
    lifetime_epsilon_cap: float | None = None
    window_filter_epsilon: float | None = None
    window_filter_delta: float | None = None
    lifetime_filter_epsilon: float | None = None
    lifetime_filter_delta: float | None = None
    delta: float | None = None
    budget_group: str | None = None
    hash_seed: str | None = None

    def apply_to(self, current: PolicyBase) -> PolicyCreate:
        """Merge into ``current`` and validate the result."""
        merged = current.model_dump(include=set(PolicyBase.model_fields))
        merged.update(self.model_dump(exclude_unset=True))
        return PolicyCreate.model_validate(merged)


def _now() -> datetime:
    return datetime.now(UTC)


class Policy(PolicyBase, table=True):
    """One immutable version of a use case's policy; the highest version is current."""

    __tablename__ = "policies"

    name: str = Field(primary_key=True, max_length=63)
    version: int = Field(primary_key=True, ge=1)
    active: bool = Field(default=True, description="False: the use case was deleted here.")
    created_at: datetime = Field(default_factory=_now)
    actor: str = Field(default="system", max_length=100)
    mechanism: str = Field(max_length=8)  # type: ignore[assignment]


class PolicyPublic(PolicyTerms):
    """A policy version as the API returns it: the seed in force is in ``randomizer`` only."""

    version: int
    active: bool
    created_at: datetime
    actor: str
    budget: str = Field(description="The budget this use case draws from (group or own name).")
    epsilon_per_day: float = Field(description="epsilon_per_report x max_reports_per_day.")
    randomizer: Randomizer = Field(
        description="What devices build their randomizer from: mechanism, parameters and the"
        " hash family with the seed in force."
    )


def publish(policy: Policy) -> PolicyPublic:
    """A policy version as the API returns it, with the randomizer devices must build."""
    data = policy.model_dump(exclude={"hash_seed"})  # in force: randomizer.hash_family.seed
    data["budget"] = budget_key(policy)
    data["epsilon_per_day"] = policy.epsilon_per_report * policy.max_reports_per_day
    data["randomizer"] = Randomizer.of(mechanism_for(policy))
    return PolicyPublic.model_validate(data)


def budget_key(policy: PolicyBase) -> str:
    """The account a use case charges: its budget group, or its own name."""
    return policy.budget_group or policy.name


def sketch_bytes(policy: PolicyBase) -> int:
    """The most memory one day's sketch of the policy's parameters can take, in bytes.

    ``8 k m`` for CMS and HCMS; SFP adds one fragment sketch per position,
    ``8 (k m + 5 k_fragment m_fragment)``.

    >>> sketch_bytes(PolicyBase(name="x", mechanism="cms", k=65536, m=1024,
    ...     epsilon_per_report=4.0, max_reports_per_day=1)) == 512 * 2**20
    True
    """
    cells = policy.k * policy.m
    if policy.mechanism == "sfp":
        cells += len(POSITIONS) * (policy.k_fragment or 0) * (policy.m_fragment or 0)
    return SKETCH_CELL_BYTES * cells


def mechanism_for(policy: PolicyBase) -> CMS | HCMS | SFP:
    """The mechanism object (parameters and hash family) a policy prescribes."""
    family = HashFamily(int(policy.hash_seed or default_hash_seed(policy.name), 16))
    parameters = policy.model_dump() | {"epsilon": policy.epsilon_per_report}
    return build(policy.mechanism, parameters, family)

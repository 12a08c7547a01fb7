"""The device-wide budget: one versioned limit every use case of a device draws from.

Per-use-case caps bound each use case; they do not bound what one device releases across all of
them. A deployment may set a device-wide budget, epsilon per UTC day, per window of
``window_days`` days and per lifetime (each optional), and a quota per use case inside it: the
share of each device-wide limit that one use case may take, so that no use case starves the
others. Figures are basic (pure) composition of group-scaled epsilons: a report of ``eps`` at
``group_size`` ``g`` counts ``g x eps`` (:mod:`dp_governor.budget.rule.device`). Optionally, a
window and a lifetime ``(epsilon, delta)`` target, each enforced by a privacy filter
(:mod:`dp_governor.budget.rule.filter`) over the same group-scaled reports.

Stored like policies: every version is kept (``device_budgets``), the highest is in force, and
a version with every limit empty switches the device-wide budget off.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self

import orjson
from pydantic import ConfigDict, field_validator, model_validator
from sqlalchemy import Column, Connection, Engine, Text, select, text
from sqlmodel import Field, SQLModel

from dp_governor.policies.model import MICRO, SLUG, to_micro
from dp_governor.policies.repository import lock_book

__all__ = [
    "DeviceBudgetCreate",
    "DeviceBudgetPublic",
    "DeviceBudgetVersion",
    "DeviceLimits",
    "device_budget_versions",
    "limits_of",
    "loosening",
    "write_device_budget",
]


# The limits, each optional; raising or removing one loosens the budget (:func:`loosening`).
_LIMITS = (
    "epsilon_per_day",
    "window_epsilon",
    "lifetime_epsilon",
    "window_filter_epsilon",
    "window_filter_delta",
    "lifetime_filter_epsilon",
    "lifetime_filter_delta",
)


class DeviceBudgetCreate(SQLModel):
    """A device-wide budget as submitted (API body or the policy file's ``device_budget``)."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)  # type: ignore[assignment]

    epsilon_per_day: float | None = Field(
        default=None,
        gt=0,
        le=1e9,
        description="Epsilon a device may spend per UTC day, all use cases; null: no limit.",
    )
    window_days: int | None = Field(
        default=None, ge=1, le=3650, description="The device-wide window in days; null: none."
    )
    window_epsilon: float | None = Field(
        default=None,
        gt=0,
        le=1e9,
        description="Epsilon a device may spend per window, all use cases; null: no limit.",
    )
    lifetime_epsilon: float | None = Field(
        default=None,
        gt=0,
        le=1e9,
        description="Epsilon a device may spend over its lifetime, all use cases; null: no limit.",
    )
    window_filter_epsilon: float | None = Field(
        default=None, gt=0, le=1e9, description="Window (epsilon, delta) filter: epsilon."
    )
    window_filter_delta: float | None = Field(
        default=None, gt=0, lt=1, description="Window (epsilon, delta) filter: delta."
    )
    lifetime_filter_epsilon: float | None = Field(
        default=None, gt=0, le=1e9, description="Lifetime (epsilon, delta) filter: epsilon."
    )
    lifetime_filter_delta: float | None = Field(
        default=None, gt=0, lt=1, description="Lifetime (epsilon, delta) filter: delta."
    )
    quotas: dict[str, float] = Field(
        default_factory=dict,
        description="Per use case, the share (0 < q <= 1) of each device-wide limit it may use.",
    )

    @field_validator(
        "epsilon_per_day",
        "window_epsilon",
        "lifetime_epsilon",
        "window_filter_epsilon",
        "lifetime_filter_epsilon",
    )
    @classmethod
    def _micro_exact(cls, value: float | None, info: Any) -> float | None:
        if value is not None:
            to_micro(value, info.field_name)
        return value

    @field_validator("quotas")
    @classmethod
    def _quotas(cls, value: dict[str, float]) -> dict[str, float]:
        for name, share in value.items():
            if not re.fullmatch(SLUG, name):
                raise ValueError(f"`quotas` keys must be use-case slugs, got {name!r}")
            if not 0 < share <= 1:
                raise ValueError(f"`quotas.{name}` must be > 0 and <= 1, got {share!r}")
            to_micro(share, f"quotas.{name}")
        return value

    @model_validator(mode="after")
    def _cross_field(self) -> Self:
        for kind in ("window", "lifetime"):
            eps, delta = f"{kind}_filter_epsilon", f"{kind}_filter_delta"
            if (getattr(self, eps) is None) != (getattr(self, delta) is None):
                raise ValueError(f"`{eps}` and `{delta}` are given together or not at all")
        windowed = self.window_epsilon is not None or self.window_filter_epsilon is not None
        if self.window_days is None and windowed:
            raise ValueError("`window_days` is required with `window_epsilon` or a window filter")
        if self.window_days is not None and not windowed:
            raise ValueError("`window_days` needs `window_epsilon` or `window_filter_epsilon`")
        if self.quotas and not self.enabled:
            raise ValueError("`quotas` need at least one device-wide limit")
        return self

    @property
    def enabled(self) -> bool:
        """Whether any device-wide limit is set."""
        return any(getattr(self, name) is not None for name in _LIMITS)


class DeviceBudgetPublic(DeviceBudgetCreate):
    """One version of the device-wide budget as the API publishes it (devices plan by it)."""

    version: int = Field(description="The version (a new one at each change).")
    created_at: datetime = Field(description="When this version was made (UTC).")
    actor: str = Field(description="Who made it (`cli`, `admin`...).")


def _now() -> datetime:
    return datetime.now(UTC)


class DeviceBudgetVersion(SQLModel, table=True):
    """One immutable version of the device-wide budget; the highest version is in force."""

    __tablename__ = "device_budgets"

    version: int = Field(primary_key=True, ge=1)
    epsilon_per_day: float | None = None
    window_days: int | None = None
    window_epsilon: float | None = None
    lifetime_epsilon: float | None = None
    window_filter_epsilon: float | None = None
    window_filter_delta: float | None = None
    lifetime_filter_epsilon: float | None = None
    lifetime_filter_delta: float | None = None
    quotas: str = Field(default="{}", sa_column=Column(Text, nullable=False))
    created_at: datetime = Field(default_factory=_now)
    actor: str = Field(default="system", max_length=100)

    def body(self) -> DeviceBudgetCreate:
        """The submitted form of this version."""
        fields = self.model_dump(include={"window_days", *_LIMITS})
        return DeviceBudgetCreate(**fields, quotas=orjson.loads(self.quotas))

    @classmethod
    def of(cls, body: DeviceBudgetCreate, version: int, actor: str) -> DeviceBudgetVersion:
        """The row storing ``body`` as ``version`` (quotas as sorted JSON)."""
        quotas = orjson.dumps(dict(sorted(body.quotas.items()))).decode()
        return cls(
            **body.model_dump(exclude={"quotas"}), quotas=quotas, version=version, actor=actor
        )

    def public(self) -> DeviceBudgetPublic:
        """This version as the API publishes it."""
        return DeviceBudgetPublic(
            **self.body().model_dump(),
            version=self.version,
            created_at=self.created_at,
            actor=self.actor,
        )


@dataclass(frozen=True, slots=True)
class DeviceLimits:
    """The device-wide budget in force as integers, for the rule (``None``: no such limit).

    Quotas are in millionths (``share x 10^6``); a quota's cap on a limit ``L`` is
    ``L x quota // 10^6`` micro-epsilon (rounded down: a quota never exceeds its share).
    """

    version: int
    day_micro: int | None
    window_days: int | None
    window_micro: int | None
    lifetime_micro: int | None
    quotas: dict[str, int]
    window_filter_micro: int | None = None
    window_filter_delta: float | None = None
    lifetime_filter_micro: int | None = None
    lifetime_filter_delta: float | None = None

    @property
    def longest_window(self) -> int:
        """Days of history the device window needs held (0: no window limit)."""
        return self.window_days or 0

    def quota_cap(self, use_case: str, limit: int | None) -> int | None:
        """The use case's share of ``limit`` in micro-epsilon (``None``: no quota or no limit)."""
        share = self.quotas.get(use_case)
        if share is None or limit is None:
            return None
        return limit * share // MICRO


def limits_of(version: DeviceBudgetVersion | None) -> DeviceLimits | None:
    """The limits of a stored version (``None``: none stored, or every limit empty)."""
    if version is None:
        return None
    body = version.body()
    if not body.enabled:
        return None

    def micro(value: float | None) -> int | None:
        return None if value is None else to_micro(value)

    return DeviceLimits(
        version=version.version,
        day_micro=micro(body.epsilon_per_day),
        window_days=body.window_days,
        window_micro=micro(body.window_epsilon),
        lifetime_micro=micro(body.lifetime_epsilon),
        quotas={k: to_micro(v, f"quotas.{k}") for k, v in body.quotas.items()},
        window_filter_micro=micro(body.window_filter_epsilon),
        window_filter_delta=body.window_filter_delta,
        lifetime_filter_micro=micro(body.lifetime_filter_epsilon),
        lifetime_filter_delta=body.lifetime_filter_delta,
    )


_TABLE = DeviceBudgetVersion.__table__  # type: ignore[attr-defined]


def device_budget_versions(conn: Connection) -> list[DeviceBudgetVersion]:
    """Every stored version of the device-wide budget, oldest first."""
    rows = conn.execute(select(_TABLE).order_by(_TABLE.c.version)).all()
    return [DeviceBudgetVersion.model_validate(r._asdict()) for r in rows]


def write_device_budget(
    engine: Engine,
    body: DeviceBudgetCreate,
    *,
    actor: str = "admin",
    on_change: Callable[[Connection, DeviceBudgetVersion | None, DeviceBudgetVersion], None]
    | None = None,
) -> DeviceBudgetVersion:
    """Store ``body`` as the next version (nothing written if it equals the version in force).

    ``on_change(conn, old, new)`` runs in the write's transaction (the ledger's audit entry).
    """
    with engine.execution_options(dpgov_write=True).begin() as conn:
        if conn.dialect.name == "postgresql":
            lock_book(conn)  # no charge decides on the budget this replaces after it commits
            conn.execute(text("LOCK TABLE device_budgets IN EXCLUSIVE MODE"))
        versions = device_budget_versions(conn)
        if versions and versions[-1].body() == body:
            return versions[-1]
        row = DeviceBudgetVersion.of(body, (versions[-1].version + 1) if versions else 1, actor)
        conn.execute(_TABLE.insert().values(**row.model_dump()))
        if on_change is not None:
            on_change(conn, versions[-1] if versions else None, row)
        return row


def loosening(old: DeviceBudgetCreate | None, new: DeviceBudgetCreate) -> list[str]:
    """What in ``new`` loosens ``old``: a limit or quota raised or removed, a window shortened."""
    if old is None or not old.enabled:
        return []
    out = []
    for name in _LIMITS:
        before, after = getattr(old, name), getattr(new, name)
        if before is not None and (after is None or after > before):
            out.append(f"device_budget.{name} {before} -> {after}")
    if old.window_days is not None and (new.window_days or 0) < old.window_days:
        out.append(f"device_budget.window_days {old.window_days} -> {new.window_days}")
    for name, share in old.quotas.items():
        after_share = new.quotas.get(name)
        if after_share is None or after_share > share:
            out.append(f"device_budget.quotas.{name} {share} -> {after_share}")
    return out

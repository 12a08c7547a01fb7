"""The policy book: every use case's terms, budget membership and retention, as the ledger sees it.

A device's spend is a fact about the device and the use cases it reported to, never about
today's grouping. The accounts therefore hold one row per device with a slot per (use case,
epsilon, group size) (:mod:`dp_governor.budget.rule.state`), and the book says, under the policies
now in force, which use cases each budget's caps count:

- **What a budget counts.** Every charge records the budget it was charged under (its slot's
  budget, :mod:`dp_governor.budget.rule.state`). A budget's caps and filters count
  (:meth:`AccountState.counted`) the whole history of its *members*, the use cases whose latest
  version (active or retired) draws from it now, and every charge made under it, whatever its use
  case did since (left the group, moved to another, was retired and re-created elsewhere). So spend
  charged under a budget counts against that budget for as long as its terms count it, and against
  the budget its use case is in now: a charge may count twice, never nowhere. Charges made before
  budgets were recorded count under every budget their use case ever drew from (``ever_members``).
- **Retention.** The ledger keeps a use case's days for the longest retention of any use case
  that ever shared a budget with it (so no budget's window loses a day it counts, whoever
  decides on it), and at least the longest device-wide window. The purge records, per use
  case, the last day it deleted (``retention_horizons``): nothing on or before that day is
  held anywhere again. A window that reaches back past a horizon (retention raised beyond what
  was kept, or a budget whose window is longer than a joining member's history) counts the
  spend it can no longer date as if it all fell inside, an upper bound
  (:meth:`dp_governor.budget.rule.state.AccountState.unheld`). The reports themselves go sooner, at
  the latest version's retention (:class:`Retention`, one rule for both purges).

Pure code: built from the ``policies`` rows and the horizons, cached by the gate per revision.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from dp_governor.budget.rule.filter import Filters, filters_of
from dp_governor.policies.device import DeviceLimits
from dp_governor.policies.model import Policy, budget_key, to_micro

__all__ = ["NO_HORIZON", "PolicyBook", "Retention", "Terms"]

NO_HORIZON = -(1 << 62)  # "nothing deleted": below every day


@dataclass(frozen=True, slots=True, eq=False)
class Terms:
    """The figures of one policy version the gate decides on, as plain integers.

    ``members`` are the use cases whose whole history the budget's caps and filters count (this
    one included); ``ever_members`` every use case that ever drew from the budget (whose charges
    under it, or before budgets were recorded, it also counts); ``filters`` the budget's window
    and lifetime ``(epsilon, delta)`` filters (``None``: neither); ``horizons`` every use case's
    last deleted day (absent: none), shared by all terms; ``device`` the device-wide budget in
    force (``None``: none), shared by all terms. A policy is a database model whose every
    attribute read goes through SQLAlchemy's instrumentation; the hot paths read these.
    """

    name: str
    version: int
    budget: str
    epsilon: float
    eps_micro: int
    max_reports_per_day: int
    retention_days: int
    window_cap_micro: int | None
    lifetime_cap_micro: int | None
    group_size: int = 1
    filters: Filters | None = None
    members: frozenset[str] = frozenset()
    horizons: Mapping[str, int] = field(default_factory=dict)
    device: DeviceLimits | None = None
    ever_members: frozenset[str] = frozenset()
    latest_horizon: int = field(init=False, default=NO_HORIZON)  # the latest of ``horizons``

    def __post_init__(self) -> None:
        # the gate's quick date check (decide_on): no horizon reaches the report's day
        object.__setattr__(self, "latest_horizon", max(self.horizons.values(), default=NO_HORIZON))

    @classmethod
    def of(
        cls,
        policy: Policy,
        members: Iterable[str] = (),
        horizons: Mapping[str, int] | None = None,
        device: DeviceLimits | None = None,
        ever_members: Iterable[str] = (),
    ) -> Terms:
        """The snapshot of ``policy``; ``members`` default to the use case alone."""
        window, lifetime = policy.window_epsilon_cap, policy.lifetime_epsilon_cap
        names = frozenset(members) | {policy.name}
        p = policy
        filters = filters_of(
            (_micro(p.window_filter_epsilon), p.window_filter_delta),
            (_micro(p.lifetime_filter_epsilon), p.lifetime_filter_delta),
            p.retention_days,
        )
        return cls(
            name=policy.name,
            version=policy.version,
            budget=budget_key(policy),
            epsilon=policy.epsilon_per_report,
            eps_micro=to_micro(policy.epsilon_per_report),
            max_reports_per_day=policy.max_reports_per_day,
            retention_days=policy.retention_days,
            window_cap_micro=_micro(window),
            lifetime_cap_micro=_micro(lifetime),
            group_size=policy.group_size,
            filters=filters,
            members=names,
            horizons={} if horizons is None else horizons,
            device=device,
            ever_members=frozenset(ever_members) | names,
        )


def _micro(value: float | None) -> int | None:
    return None if value is None else to_micro(value)


@dataclass(frozen=True, slots=True)
class Retention:
    """The last day of each kind of record the purge deletes for one use case, and why.

    - ``spend_through``: spend records (the charges and the accounts' days). Kept for the
      longest ``retention_days`` any use case that ever shared a budget with this one had
      (every window that counts these days), and at least the longest device-wide window ever
      set (which counts every use case's days); never below the horizon already reached.
      Privacy accounting: a window lowered then raised (90 -> 30 -> 90) reads the device's
      true spend again, and no cap is ever checked against a window missing days.
    - ``data_through``: what the devices sent (the inbox, the report store, the sketches).
      Deleted at the retention of the use case's latest version, retired or not. Data
      minimisation: a policy's retention is the promise of how long reports are kept, and
      lowering it deletes the older ones at the next purge. No cap or epsilon figure reads them.
      Never below ``spend_through``: a report never outlives the record of its spend.

    Why the two differ: docs/decisions/retention.md.
    """

    spend_through: int
    data_through: int


@dataclass(frozen=True, slots=True)
class PolicyBook:
    """Every use case's versions, budget members, longest retention and horizon.

    ``versions`` holds every version of every use case (retired ones included), by name and
    version; ``latest`` each use case's newest. ``device`` is the device-wide budget in force
    (``None``: none); ``device_window`` the longest device-wide window any of its versions ever
    had, which the purge keeps (days the device window counts must still be held).
    """

    latest: dict[str, Policy]
    members: dict[str, frozenset[str]]
    longest_retention: dict[str, int]
    horizons: dict[str, int]
    terms: dict[str, Terms]
    group_sizes: dict[tuple[str, int], int]
    versions: tuple[Policy, ...] = ()
    device: DeviceLimits | None = None
    device_window: int = 0
    ever_members: dict[str, frozenset[str]] = field(default_factory=dict)
    spend_keep: dict[str, int] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        versions: Iterable[Policy],
        horizons: Mapping[str, int],
        device: DeviceLimits | None = None,
        device_window: int = 0,
    ) -> PolicyBook:
        """The book of all policy ``versions`` (any order) and the purge's ``horizons``.

        ``device`` is the device-wide budget in force, ``device_window`` the longest window
        any of its versions ever had.
        """
        every = tuple(sorted(versions, key=lambda p: (p.name, p.version)))
        latest: dict[str, Policy] = {}
        longest: dict[str, int] = {}
        group_sizes: dict[tuple[str, int], int] = {}
        for p in every:
            if p.name not in latest or p.version > latest[p.name].version:
                latest[p.name] = p
            longest[p.name] = max(longest.get(p.name, 0), p.retention_days)
            group_sizes[(p.name, p.version)] = p.group_size
        grouped: dict[str, set[str]] = defaultdict(set)
        for name, p in latest.items():
            grouped[budget_key(p)].add(name)
        members = {b: frozenset(names) for b, names in grouped.items()}
        ever: dict[str, set[str]] = defaultdict(set)
        for p in every:
            ever[budget_key(p)].add(p.name)
        ever_members = {b: frozenset(names) for b, names in ever.items()}
        held = {n: int(d) for n, d in horizons.items()}
        terms = {
            name: Terms.of(p, members[budget_key(p)], held, device, ever_members[budget_key(p)])
            for name, p in latest.items()
            if p.active
        }
        window = max(device_window, device.longest_window if device else 0)
        keep = {
            name: max(
                longest[other]
                for b in ever_members
                if name in ever_members[b]
                for other in ever_members[b]
            )
            for name in latest
        }
        return cls(
            latest, members, longest, held, terms, group_sizes, every, device, window,
            ever_members, keep,
        )  # fmt: skip

    def terms_of(self, name: str) -> Terms:
        """The terms of ``name``'s latest version, retired or not (a retired one as it was)."""
        found = self.terms.get(name)
        if found is not None:
            return found
        p = self.latest[name]
        budget = budget_key(p)
        return Terms.of(
            p, self.members[budget], self.horizons, self.device, self.ever_members[budget]
        )

    def with_policy(self, proposed: Policy) -> PolicyBook:
        """The book as it would be with ``proposed`` as its use case's next version."""
        return PolicyBook.build(
            [*self.versions, proposed], self.horizons, self.device, self.device_window
        )

    @property
    def active(self) -> list[Policy]:
        """The active use cases' latest versions, by name."""
        return [p for _, p in sorted(self.latest.items()) if p.active]

    def retention(self) -> dict[str, int]:
        """Each use case's window length (its latest version's ``retention_days``)."""
        return {name: p.retention_days for name, p in self.latest.items()}

    def horizon(self, use_case: str) -> int:
        """The last day deleted for ``use_case`` (:data:`NO_HORIZON`: none)."""
        return self.horizons.get(use_case, NO_HORIZON)

    def purge_through(self, day: int) -> dict[str, Retention]:
        """What the purge on ``day`` deletes, per use case ever defined (retired ones included).

        The one retention rule, applied by both purges: the ledger's to the spend records
        (:meth:`dp_governor.budget.ledger.Ledger.purge`), the pipeline's to the reports and sketches
        (``dp_governor.pipeline.purge``). See :class:`Retention` for why the two
        differ.
        """
        out = {}
        for name, policy in sorted(self.latest.items()):
            keep = max(self.spend_keep.get(name, 0), self.device_window)
            spend = max(day - keep, self.horizon(name))
            out[name] = Retention(spend, max(day - policy.retention_days, spend))
        return out

"""The policy book: every use case's terms, budget membership and retention, as the ledger sees it.

A device's spend is a fact about the device and the use cases it reported to, never about
today's grouping. The accounts therefore hold one row per device with a slot per (use case,
epsilon, group size) (:mod:`budget.state`), and the book says, under the policies now in force,
which use cases each budget's caps count:

- **Members.** A budget's members are the use cases whose *latest* version (active or retired)
  draws from it. A group's caps count all its members' history; a use case that leaves a group
  takes its own history along; retiring a use case keeps its spend in the budget it last drew
  from, and re-creating it brings that history back. No group move, merge, split, rename,
  retirement or re-creation frees budget.
- **Retention.** The ledger keeps a use case's days for the *longest* retention any of its
  versions ever had (lowering then raising ``retention_days`` gets the true window back), and
  the purge records, per use case, the last day it deleted (``retention_horizons``): nothing on
  or before that day is counted anywhere again, whatever the accounts still physically hold.
  Raising retention beyond the longest it ever was cannot recall days already deleted.

Pure code: built from the ``policies`` rows and the horizons, cached by the gate per revision.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from budget.filter_rule import Filters, filters_of
from policies.device import DeviceLimits
from policies.model import Policy, budget_key, to_micro

__all__ = ["NO_HORIZON", "PolicyBook", "Terms"]

NO_HORIZON = -(1 << 62)  # "nothing deleted": below every day


@dataclass(frozen=True, slots=True, eq=False)
class Terms:
    """The figures of one policy version the gate decides on, as plain integers.

    ``members`` are the use cases whose history the budget's caps and filters count (this one
    included); ``filters`` the budget's window and lifetime ``(epsilon, delta)`` filters
    (``None``: neither); ``horizons`` every use case's last deleted day (absent: none), shared
    by all terms; ``device`` the device-wide budget in force (``None``: none), shared by all
    terms. A policy is a database model whose every attribute read goes through SQLAlchemy's
    instrumentation; the hot paths read these.
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

    @classmethod
    def of(
        cls,
        policy: Policy,
        members: Iterable[str] = (),
        horizons: Mapping[str, int] | None = None,
        device: DeviceLimits | None = None,
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
        )


def _micro(value: float | None) -> int | None:
    return None if value is None else to_micro(value)


@dataclass(frozen=True, slots=True)
class PolicyBook:
    """Every use case's latest version, budget members, longest retention and horizon.

    ``device`` is the device-wide budget in force (``None``: none); ``device_window`` the
    longest device-wide window any of its versions ever had, which the purge keeps (days the
    device window counts must still be held).
    """

    latest: dict[str, Policy]
    members: dict[str, frozenset[str]]
    longest_retention: dict[str, int]
    horizons: dict[str, int]
    terms: dict[str, Terms]
    group_sizes: dict[tuple[str, int], int]
    device: DeviceLimits | None = None
    device_window: int = 0

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
        latest: dict[str, Policy] = {}
        longest: dict[str, int] = {}
        group_sizes: dict[tuple[str, int], int] = {}
        for p in versions:
            if p.name not in latest or p.version > latest[p.name].version:
                latest[p.name] = p
            longest[p.name] = max(longest.get(p.name, 0), p.retention_days)
            group_sizes[(p.name, p.version)] = p.group_size
        grouped: dict[str, set[str]] = defaultdict(set)
        for name, p in latest.items():
            grouped[budget_key(p)].add(name)
        members = {b: frozenset(names) for b, names in grouped.items()}
        held = {n: int(d) for n, d in horizons.items()}
        terms = {
            name: Terms.of(p, members[budget_key(p)], held, device)
            for name, p in latest.items()
            if p.active
        }
        window = max(device_window, device.longest_window if device else 0)
        return cls(latest, members, longest, held, terms, group_sizes, device, window)

    def with_policy(self, proposed: Policy) -> PolicyBook:
        """The book as it would be with ``proposed`` as its use case's latest version."""
        versions = [*self.latest.values()]
        versions = [p for p in versions if p.name != proposed.name] + [proposed]
        book = PolicyBook.build(versions, self.horizons, self.device, self.device_window)
        longest = dict(self.longest_retention)
        longest[proposed.name] = max(
            self.longest_retention.get(proposed.name, 0), proposed.retention_days
        )
        sizes = {**self.group_sizes, **book.group_sizes}
        return PolicyBook(
            book.latest,
            book.members,
            longest,
            book.horizons,
            book.terms,
            sizes,
            self.device,
            self.device_window,
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

    def deletable_through(self, use_case: str, day: int) -> int:
        """The last day the purge on ``day`` deletes for ``use_case`` (never below its horizon).

        Days are held for the longest retention the use case ever had, and at least as long
        as the longest device-wide window ever set, which counts every use case's days.
        """
        keep = max(self.longest_retention.get(use_case, 0), self.device_window)
        return max(day - keep, self.horizon(use_case))

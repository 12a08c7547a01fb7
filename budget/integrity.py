"""The state the gate decides on, checked against the audit chain that recorded it.

The chain proves what was decided; this module proves the tables still say so. Replaying the
verified entries (charges accepted, policy versions written, horizons the purge raised) gives
what ``policies``, ``retention_horizons``, ``charges`` and ``accounts`` must hold; the tables
are then read and compared. Policies and horizons are compared row by row. Charges and accounts
are compared as multiset digests, so the check streams in constant memory: each side sums a
keyed hash (under a key derived from the audit key, which the database never holds) of every
element, modulo 2^256 (an additive multiset hash: Clarke et al., "Incremental multiset hash
functions and their application to memory integrity checking", ASIACRYPT 2003). Someone who can
edit the database but not read the audit key cannot make an edited table match.

What is compared, per use case and day after its retention horizon (what is on or before it is
deleted by definition, as for every reader, and may wait for the purge's later transactions):
every charge (id, device, use case, version, epsilon, day); every account day count per slot
(device, use case, epsilon, group size, budget, day); and, for all time, every account's
lifetime count per slot. A charge's budget is its entry's; charges recorded before slots held
their budget (entries up to ``slot_budgets.since_seq``) are replayed into slots of
:data:`budget.state.ANY_BUDGET`, which count under every budget their use case ever had (moving
that mark can only make slots count under more budgets, never fewer). An edited epsilon, a
deleted or added charge, an account reset, a policy row edited in place, a horizon moved: each
makes the check fail and says which table disagrees.

The tables are read here as raw rows, not through the policy book (:mod:`budget.book`) that
every other reader uses: the book is built from these rows, so it is what is being verified.
"""

from __future__ import annotations

import hmac
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import Engine, inspect, select, text

from budget.book import NO_HORIZON
from budget.keyed import KeyedHash
from budget.state import ANY_BUDGET, decode
from budget.storage.tables import Account, Charge, RetentionHorizon
from policies.model import Policy

__all__ = ["StateCheck", "StateReplay", "budgets_since"]

_MOD = 1 << 256
_POLICY_ACTIONS = ("policy.create", "policy.update", "policy.delete")


@dataclass(frozen=True, slots=True)
class StateCheck:
    """The outcome: ``problem`` names the first table that disagrees (``None``: all agree)."""

    checked: bool
    problem: str | None = None
    note: str | None = None
    accepted: dict[tuple[str, int], int] = field(default_factory=dict)


class StateReplay:
    """Replays verified audit entries into the digests the tables must match."""

    def __init__(self, audit_key: bytes, *, budgets_since: int = 0) -> None:
        self._keyed = KeyedHash(hmac.digest(audit_key, b"dp-governor/state-digest/v1", "sha256"))
        self.budgets_since = budgets_since
        self.policies: dict[tuple[str, int], dict[str, Any]] = {}
        self.horizons: dict[str, int] = {}
        self.legacy: str | None = None
        self.charges: dict[tuple[str, int], int] = defaultdict(int)
        self.days: dict[tuple[str, int], int] = defaultdict(int)
        self.accepted: dict[tuple[str, int], int] = defaultdict(int)
        self.lifetime = 0

    def h(self, *parts: object) -> int:
        """The keyed hash of a tuple, as an integer."""
        text = "\0".join(str(p) for p in parts).encode()
        return int.from_bytes(self._keyed.digest(text), "big")

    def __call__(self, seq: int, actor: str, action: str, body: str) -> None:
        """Take one verified entry (the :meth:`budget.audit_log.AuditLog.verify` observer)."""
        if action == "charge":
            data = orjson.loads(body)["data"]
            if data["accepted"]:
                budget = ANY_BUDGET if seq <= self.budgets_since else str(data["budget"])
                self._charge(actor.removeprefix("device:"), data, budget)
        elif action in _POLICY_ACTIONS:
            new = orjson.loads(body)["data"]["new"]
            self.policies[(str(new["name"]), int(new["version"]))] = new
        elif action == "purge.ledger":
            data = orjson.loads(body)["data"]
            if "daily_spend" in data and "horizons" not in data:
                self.legacy = f"entry {seq} is a purge by an earlier release"
            for name, day in data.get("horizons", {}).items():
                self.horizons[name] = max(self.horizons.get(name, NO_HORIZON), int(day))

    def _charge(self, dk: str, data: dict[str, Any], budget: str) -> None:
        uc, version = data["use_case"], data["policy_version"]
        eps, day = data["epsilon_micro"], data["day"]
        policy = self.policies.get((uc, int(version)))
        group = int(policy["group_size"]) if policy is not None else 1
        key = (str(uc), int(day))
        charge = self.h("c", data["charge_id"], dk, uc, version, eps, day)
        self.charges[key] = (self.charges[key] + charge) % _MOD
        self.days[key] = (self.days[key] + self.h("d", dk, uc, eps, group, budget, day)) % _MOD
        self.accepted[key] += 1
        self.lifetime = (self.lifetime + self.h("l", dk, uc, eps, group, budget)) % _MOD

    def compare(self, engine: Engine) -> StateCheck:
        """Read the tables and compare them with the replay."""
        if inspect(engine).has_table("ledger_upgrades"):
            return StateCheck(
                False, note="the ledger was upgraded from an earlier release, whose audit"
                " entries do not describe the upgraded rows: the state was not checked",
            )  # fmt: skip
        if self.legacy is not None:
            return StateCheck(False, note=f"{self.legacy}: the state was not checked")
        with engine.connect() as conn:
            stored = {
                str(r.use_case): int(r.through_day)
                for r in conn.execute(select(RetentionHorizon.__table__))  # type: ignore[attr-defined]
            }
            if stored != self.horizons:
                return StateCheck(True, "retention_horizons disagrees with the purges recorded")
            problem = self._compare_policies(
                Policy.model_validate(r._asdict())
                for r in conn.execute(select(Policy.__table__))  # type: ignore[attr-defined]
            )
            if problem is not None:
                return StateCheck(True, problem)
            t = Charge.__table__.c  # type: ignore[attr-defined]
            problem = self._compare_charges(
                conn.execute(
                    select(t.id, t.device_key, t.use_case, t.policy_version, t.epsilon_micro, t.day)
                )
            )
            if problem is not None:
                return StateCheck(True, problem)
            c = Account.__table__.c  # type: ignore[attr-defined]
            rows = conn.execute(select(c.device_key, c.count, c.epsilon_micro, c.days, c.lifetime))
            problem = self._compare_accounts(rows)
        return StateCheck(True, problem, accepted=self._held(self.accepted))

    def _held(self, per_day: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """The per-(use case, day) values after each use case's horizon, zeros left out."""
        return {
            k: v for k, v in per_day.items() if v and k[1] > self.horizons.get(k[0], NO_HORIZON)
        }

    def _compare_policies(self, rows: Iterable[Policy]) -> str | None:
        seen = set()
        for row in rows:
            key = (row.name, row.version)
            seen.add(key)
            recorded = self.policies.get(key)
            if recorded is None:
                return f"policies holds {row.name!r} version {row.version}, which no entry records"
            actual = row.model_dump(mode="json")
            for name, value in recorded.items():
                if name == "created_at":
                    if _instant(actual[name]) != _instant(value):
                        return f"policy {row.name!r} version {row.version}: created_at was edited"
                elif actual.get(name) != value:
                    return f"policy {row.name!r} version {row.version}: `{name}` was edited"
        missing = sorted(set(self.policies) - seen)
        if missing:
            return f"policy {missing[0][0]!r} version {missing[0][1]} was deleted"
        return None

    def _compare_charges(self, rows: Iterable[tuple[Any, ...]]) -> str | None:
        digests: dict[tuple[str, int], int] = defaultdict(int)
        for charge_id, dk, uc, version, eps, day in rows:
            key = (str(uc), int(day))
            if key[1] <= self.horizons.get(key[0], NO_HORIZON):
                continue  # deleted by definition (the purge deletes it after raising the horizon)
            digests[key] = (digests[key] + self.h("c", charge_id, dk, uc, version, eps, day)) % _MOD
        return _first_difference("charges", self._held(self.charges), self._held(digests))

    def _compare_accounts(self, rows: Iterable[tuple[Any, ...]]) -> str | None:
        days: dict[tuple[str, int], int] = defaultdict(int)
        lifetime = 0
        for dk, count, eps_total, days_text, lifetime_text in rows:
            state = decode(count, eps_total, days_text, lifetime_text)
            if sum(int(s[3]) for s in state.slots) != state.count:
                return f"the account of device {dk} does not add up (count edited)"
            for uc, eps, group, n, b in state.slots:
                lifetime = (lifetime + int(n) * self.h("l", dk, uc, eps, group, b)) % _MOD
            for entry in state.days:
                d = entry[0]
                for i, n in enumerate(entry[1:]):
                    if n:
                        uc, eps, group, _, b = state.slots[i]
                        if d > self.horizons.get(str(uc), NO_HORIZON):
                            k = (str(uc), d)
                            digest = self.h("d", dk, uc, eps, group, b, d)
                            days[k] = (days[k] + n * digest) % _MOD
        if lifetime != self.lifetime:
            return "accounts' lifetime counts disagree with the charges recorded"
        return _first_difference("accounts' days", self._held(self.days), self._held(days))


def budgets_since(engine: Engine) -> int:
    """The audit sequence number after which charges' slots hold their budget (0: all do)."""
    with engine.connect() as conn:
        if not inspect(conn).has_table("slot_budgets"):
            return 0
        found = conn.execute(text("SELECT max(since_seq) FROM slot_budgets")).scalar()
    return int(found or 0)


def _first_difference(
    table: str, expected: dict[tuple[str, int], int], actual: dict[tuple[str, int], int]
) -> str | None:
    for key in sorted(set(expected) | set(actual)):
        if expected.get(key, 0) != actual.get(key, 0):
            return f"{table} disagree with the charges recorded for {key[0]!r} on day {key[1]}"
    return None


def _instant(value: Any) -> datetime:
    """A recorded or stored timestamp as an aware UTC datetime (SQLite stores naive ones)."""
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)

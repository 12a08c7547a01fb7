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
:data:`dp_governor.budget.rule.state.ANY_BUDGET`, which count under every budget their use case ever
had (moving that mark can only make slots count under more budgets, never fewer). Also every version
of the device-wide budget (row by row), every idempotency record the retry window still holds (the
chain's charge entries name their record by a keyed digest; compared per day after the last
purge's ``idempotency_through``), and every published shuffled batch's figures (each published
with an entry; compared per use case and day). An edited epsilon, a deleted or added charge, an
account reset, a slot moved to another budget, a policy or device-wide budget row edited in
place, a horizon moved, a deleted idempotency record (a retry then charged twice), an edited
batch figure: each makes the check fail, and the problem starts with the table's name.

Entries written by a release before these digests (charge entries without ``idempotency``)
describe no idempotency record, no batch and no row tag: the days up to the last such charge
(``legacy_through``) are not checked for those three; every later day is.

The tables are read here as raw rows, not through the policy book
(:mod:`dp_governor.budget.rule.book`) that every other reader uses: the book is built from these
rows, so it is what is being verified.
"""

from __future__ import annotations

import hmac
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import ColumnElement, Engine, Select, inspect, select, text

from dp_governor.budget.audit.log import idempotency_hash, record_digest
from dp_governor.budget.audit.verdicts import Resume
from dp_governor.budget.keyed import KeyedHash
from dp_governor.budget.rule.book import NO_HORIZON
from dp_governor.budget.rule.state import ANY_BUDGET, decode
from dp_governor.budget.storage.tables import (
    Account,
    Charge,
    IdempotencyRecord,
    RetentionHorizon,
    ShuffledBatch,
)
from dp_governor.policies.device import DeviceBudgetVersion
from dp_governor.policies.model import Policy

__all__ = ["StateCheck", "StateReplay", "budgets_since"]

_MOD = 1 << 256
_PER_DAY = ("charges", "days", "accepted", "batches")  # digests and counts by (use case, day)
NO_LIMIT = (1 << 31) - 1  # a restored replay's first touched day until it touches one (int4)
_POLICY_ACTIONS = ("policy.create", "policy.update", "policy.delete")


@dataclass(frozen=True, slots=True)
class StateCheck:
    """The outcome: ``problem`` names the first table that disagrees (``None``: all agree).

    ``accepted`` counts the accepted charges per (use case, day) after the horizons;
    ``legacy_through`` is the last day an earlier release charged (``None``: none did), up to
    which rows it wrote carry no tags (:mod:`dp_governor.budget.audit.row_tags`); ``resume``,
    where the next incremental verification may start if every later check accepts too.
    """

    checked: bool
    problem: str | None = None
    note: str | None = None
    accepted: dict[tuple[str, int], int] = field(default_factory=dict)
    legacy_through: int | None = None
    resume: Resume | None = None


class StateReplay:
    """Replays verified audit entries into the digests the tables must match."""

    def __init__(self, audit_key: bytes, *, budgets_since: int = 0) -> None:
        self._keyed = KeyedHash(hmac.digest(audit_key, b"dp-governor/state-digest/v1", "sha256"))
        self.budgets_since = budgets_since
        self._records = idempotency_hash(audit_key)  # the charge entries' record digests
        self.policies: dict[tuple[str, int], dict[str, Any]] = {}
        self.device_budgets: dict[int, tuple[str, str, dict[str, Any]]] = {}
        self.horizons: dict[str, int] = {}
        self.legacy: str | None = None
        self.charges: dict[tuple[str, int], int] = defaultdict(int)
        self.days: dict[tuple[str, int], int] = defaultdict(int)
        self.accepted: dict[tuple[str, int], int] = defaultdict(int)
        self.lifetime = 0
        self.legacy_through: int | None = None  # the last day an earlier release charged
        self.idempotency: dict[int, int] = defaultdict(int)  # final records, digest by day
        self.refusals: dict[tuple[str, str], tuple[int, int]] = {}  # may be decided again
        self.idempotency_through = NO_HORIZON  # records on or before may have been purged
        self.batches: dict[tuple[str, int], int] = defaultdict(int)
        self.since_day: int | None = None  # restored: the first day the new entries touch

    def snapshot(self) -> str:
        """Everything replayed so far, as JSON (where an incremental verification resumes)."""
        return json.dumps(
            {
                "budgets_since": self.budgets_since,
                "policies": [[k[0], k[1], v] for k, v in self.policies.items()],
                "device_budgets": [[k, *v] for k, v in self.device_budgets.items()],
                "horizons": self.horizons,
                "legacy": self.legacy,
                "legacy_through": self.legacy_through,
                "idempotency_through": self.idempotency_through,
                "lifetime": self.lifetime,
                "idempotency": [[k, v] for k, v in self.idempotency.items()],
                "refusals": [[*k, *v] for k, v in self.refusals.items()],
                **{
                    name: [[k[0], k[1], v] for k, v in getattr(self, name).items()]
                    for name in _PER_DAY
                },
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def restore(cls, audit_key: bytes, snapshot: str, *, new_days_only: bool = True) -> StateReplay:
        """A replay resumed from :meth:`snapshot`; its comparison is limited to new days.

        :meth:`compare` then reads ``charges`` and ``idempotency`` only from the first day
        the entries replayed since touch (``since_day``): the days before were compared when
        the snapshot was taken, and a full verification compares them again.
        ``new_days_only=False`` compares every day, as a replay from the first entry does
        (the snapshot holds every day's digests): a full verification starting at an archive.
        """
        data = json.loads(snapshot)
        replay = cls(audit_key, budgets_since=int(data["budgets_since"]))
        replay.policies = {(str(n), int(v)): new for n, v, new in data["policies"]}
        replay.device_budgets = {
            int(v): (str(actor), str(at), new) for v, actor, at, new in data["device_budgets"]
        }
        replay.horizons = {str(k): int(v) for k, v in data["horizons"].items()}
        replay.legacy = data["legacy"]
        replay.legacy_through = data["legacy_through"]
        replay.idempotency_through = int(data["idempotency_through"])
        replay.lifetime = int(data["lifetime"])
        replay.idempotency.update({int(k): int(v) for k, v in data["idempotency"]})
        replay.refusals = {(str(a), str(b)): (int(d), int(e)) for a, b, d, e in data["refusals"]}
        for name in _PER_DAY:
            getattr(replay, name).update({(str(u), int(d)): int(v) for u, d, v in data[name]})
        replay.since_day = NO_LIMIT if new_days_only else None
        return replay

    def _touch(self, day: int) -> None:
        """Note a day the entries replayed since a snapshot touch."""
        if self.since_day is not None and day < self.since_day:
            self.since_day = day

    def h(self, *parts: object) -> int:
        """The keyed hash of a tuple, as an integer."""
        text = "\0".join(str(p) for p in parts).encode()
        return int.from_bytes(self._keyed.digest(text), "big")

    def __call__(self, seq: int, actor: str, action: str, body: str) -> None:
        """Take one verified entry (the :meth:`budget.audit.log.AuditLog.verify` observer)."""
        if action == "charge":
            data = orjson.loads(body)["data"]
            dk = actor.removeprefix("device:")
            if data["accepted"]:
                budget = ANY_BUDGET if seq <= self.budgets_since else str(data["budget"])
                self._charge(dk, data, budget)
            if "idempotency" not in data:  # written by an earlier release
                day = int(data["day"])
                self.legacy_through = max(self.legacy_through or NO_HORIZON, day)
            elif data["idempotency"] is not None:
                self._record(dk, data)
        elif action in _POLICY_ACTIONS:
            new = orjson.loads(body)["data"]["new"]
            self.policies[(str(new["name"]), int(new["version"]))] = new
        elif action == "device_budget.update":
            entry = orjson.loads(body)
            data = entry["data"]
            self.device_budgets[int(data["version"])] = (actor, str(entry["at"]), data["new"])
        elif action == "batch.publish":
            data = orjson.loads(body)["data"]
            key = (str(data["use_case"]), int(data["day"]))
            self.batches[key] = (self.batches[key] + self._batch(data)) % _MOD
        elif action == "purge.ledger":
            data = orjson.loads(body)["data"]
            if "daily_spend" in data and "horizons" not in data:
                self.legacy = f"entry {seq} is a purge by an earlier release"
            for name, day in data.get("horizons", {}).items():
                self.horizons[name] = max(self.horizons.get(name, NO_HORIZON), int(day))
            # an earlier release's purge kept at least the purge's day before (the retry window
            # is at least a day)
            through = int(data.get("idempotency_through", int(data["day"]) - 1))
            if through > self.idempotency_through:
                self.idempotency_through = through
                self.refusals = {k: v for k, v in self.refusals.items() if v[0] > through}

    def _record(self, dk: str, data: dict[str, Any]) -> None:
        """The idempotency record a keyed decision stored (the latest decision of its key)."""
        day = int(data["day"])
        self._touch(day)
        element = self.h(
            "i", dk, data["idempotency"], day, data["use_case"], data["accepted"],
            data["charge_id"], data["reason"], data["policy_version"],
        )  # fmt: skip
        key = (dk, str(data["idempotency"]))
        self.refusals.pop(key, None)  # a refusal decided again: this decision replaced it
        if data["accepted"]:  # final: an accepted answer is never decided again
            self.idempotency[day] = (self.idempotency[day] + element) % _MOD
        else:
            self.refusals[key] = (day, element)

    def _batch(self, data: dict[str, Any]) -> int:
        """The keyed hash of a published batch's figures (a ``shuffled_batches`` row but its id)."""
        return self.h(
            "b", data["use_case"], data["day"], data["first_day"], data["last_day"],
            data["devices"], data["reports"], data["max_per_device"],
            orjson.dumps(data["layers"]).decode(), data["untagged"], data["epsilon_micro"],
            data["min_batch_devices"],
        )  # fmt: skip

    def _charge(self, dk: str, data: dict[str, Any], budget: str) -> None:
        uc, version = data["use_case"], data["policy_version"]
        eps, day = data["epsilon_micro"], data["day"]
        policy = self.policies.get((uc, int(version)))
        group = int(policy["group_size"]) if policy is not None else 1
        key = (str(uc), int(day))
        self._touch(key[1])
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
        legacy = self.legacy_through
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
                return StateCheck(True, f"policies: {problem}")
            problem = self._compare_device_budgets(
                DeviceBudgetVersion.model_validate(r._asdict())
                for r in conn.execute(select(DeviceBudgetVersion.__table__))  # type: ignore[attr-defined]
            )
            if problem is not None:
                return StateCheck(True, f"device_budgets: {problem}")
            t = Charge.__table__.c  # type: ignore[attr-defined]
            query = select(t.id, t.device_key, t.use_case, t.policy_version, t.epsilon_micro, t.day)
            problem = self._compare_charges(conn.execute(self._from_since(query, t.day)))
            if problem is not None:
                return StateCheck(True, problem)
            c = Account.__table__.c  # type: ignore[attr-defined]
            rows = conn.execute(select(c.device_key, c.count, c.epsilon_micro, c.days, c.lifetime))
            problem = self._compare_accounts(rows)
            if problem is None:
                i = IdempotencyRecord.__table__.c  # type: ignore[attr-defined]
                records = select(i.device_key, i.key, i.request_hash, i.day, i.decision)
                problem = self._compare_idempotency(conn.execute(self._from_since(records, i.day)))
            if problem is None:
                problem = self._compare_batches(
                    conn.execute(select(ShuffledBatch.__table__))  # type: ignore[attr-defined]
                )
        return StateCheck(True, problem, accepted=self._held(self.accepted), legacy_through=legacy)

    def _from_since(self, query: Select[Any], day: ColumnElement[int]) -> Select[Any]:
        """``query`` limited to the days a restored replay compares (all days otherwise)."""
        return query if self.since_day is None else query.where(day >= self.since_day)

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

    def _compare_device_budgets(self, rows: Iterable[DeviceBudgetVersion]) -> str | None:
        seen = set()
        for row in rows:
            seen.add(row.version)
            recorded = self.device_budgets.get(row.version)
            if recorded is None:
                return f"version {row.version} is a device-wide budget no entry records"
            actor, at, body = recorded
            if row.body().model_dump() != body:
                return f"version {row.version}: its limits or quotas were edited"
            if row.actor != actor or _instant(row.created_at) != _instant(at):
                return f"version {row.version}: its author or time was edited"
        missing = sorted(set(self.device_budgets) - seen)
        if missing:
            return f"version {missing[0]} of the device-wide budget was deleted"
        return None

    def _compare_idempotency(self, rows: Iterable[tuple[Any, ...]]) -> str | None:
        """The records after the retry window's purge and the earlier release's days."""
        low = max(self.idempotency_through, self.legacy_through or NO_HORIZON)
        if self.since_day is not None:
            low = max(low, self.since_day - 1)
        expected: dict[int, int] = defaultdict(int)
        for day, total in self.idempotency.items():
            expected[day] = total
        for day, element in self.refusals.values():
            expected[day] = (expected[day] + element) % _MOD
        digests: dict[int, int] = defaultdict(int)
        for dk, key, fingerprint, day, decision in rows:
            if int(day) <= low:
                continue  # the purge may have deleted it, or an earlier release wrote it
            try:
                made = orjson.loads(decision)
                element = self.h(
                    "i", dk, record_digest(self._records, str(dk), str(key), str(fingerprint)),
                    int(day), made["use_case"], made["accepted"], made["charge_id"],
                    made["reason"], made["policy_version"],
                )  # fmt: skip
            except (orjson.JSONDecodeError, KeyError, TypeError):
                return f"idempotency: a record of day {int(day)} holds no decision"
            digests[int(day)] = (digests[int(day)] + element) % _MOD
        for day in sorted(set(expected) | set(digests)):
            if day > low and expected.get(day, 0) != digests.get(day, 0):
                return (
                    f"idempotency: the records of day {day} disagree with the decisions"
                    " recorded (a record deleted, added or edited: a retry would be decided"
                    " again)"
                )
        return None

    def _compare_batches(self, rows: Iterable[Any]) -> str | None:
        """The published batches' figures, per use case and day after the earlier release's."""
        low = self.legacy_through if self.legacy_through is not None else NO_HORIZON
        digests: dict[tuple[str, int], int] = defaultdict(int)
        for r in rows:
            key = (str(r.use_case), int(r.day))
            element = self.h(
                "b", r.use_case, r.day, r.first_day, r.last_day, r.devices, r.reports,
                r.max_per_device, r.layers, r.untagged, r.epsilon_micro, r.min_batch_devices,
            )  # fmt: skip
            digests[key] = (digests[key] + element) % _MOD
        for key in sorted(set(self.batches) | set(digests)):
            if key[1] > low and self.batches.get(key, 0) != digests.get(key, 0):
                return (
                    f"shuffled_batches: the batches of {key[0]!r} published on day {key[1]}"
                    " disagree with the batches recorded (a figure edited, a batch deleted or"
                    " added)"
                )
        return None

    def _compare_charges(self, rows: Iterable[tuple[Any, ...]]) -> str | None:
        digests: dict[tuple[str, int], int] = defaultdict(int)
        for charge_id, dk, uc, version, eps, day in rows:
            key = (str(uc), int(day))
            if key[1] <= self.horizons.get(key[0], NO_HORIZON):
                continue  # deleted by definition (the purge deletes it after raising the horizon)
            digests[key] = (digests[key] + self.h("c", charge_id, dk, uc, version, eps, day)) % _MOD
        since = NO_HORIZON if self.since_day is None else self.since_day
        expected = {k: v for k, v in self._held(self.charges).items() if k[1] >= since}
        return _first_difference("charges", expected, self._held(digests))

    def _compare_accounts(self, rows: Iterable[tuple[Any, ...]]) -> str | None:
        days: dict[tuple[str, int], int] = defaultdict(int)
        lifetime = 0
        for dk, count, eps_total, days_text, lifetime_text in rows:
            state = decode(count, eps_total, days_text, lifetime_text)
            if sum(int(s[3]) for s in state.slots) != state.count:
                return f"accounts: the account of device {dk} does not add up (count edited)"
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

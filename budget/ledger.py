"""The ledger: the gate plus the questions asked of it (budgets, accounting, retention).

The ledger owns the database: the service layer calls these methods and never writes SQL.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, Table, and_, func, select

from budget.accountant import Accountant, PrivacyLoss
from budget.audit_log import AuditLog, Checkpoint, Entry, Verification, derive_audit_key
from budget.book import NO_HORIZON, PolicyBook
from budget.central import central_figures
from budget.clock import day_start, utc_day
from budget.errors import InvalidRequest, UnknownUseCase
from budget.gate import Gate, OnAccept, load_book
from budget.integrity import StateCheck, StateReplay
from budget.reporting.device import DeviceOdometer, DeviceWide, device_odometer, device_wide
from budget.reporting.report import (
    EffectiveEpsilonReport,
    ReportBasis,
    Row,
    finish_report,
    prepare_report,
)
from budget.rule import Decision
from budget.state import AccountState, Slot, decode, lifetime_counts, window_counts
from budget.storage.db import delete_keys, placeholder, write_step
from budget.storage.partitions import (
    DAYS_AHEAD,
    DroppedDays,
    drop_days_through,
    ensure_partitions,
    is_partitioned,
)
from budget.storage.tables import Account, Charge, IdempotencyRecord, RetentionHorizon
from policies.device import DeviceBudgetCreate, DeviceBudgetVersion, write_device_budget
from policies.model import Policy, from_micro
from policies.repository import PolicyStore

__all__ = ["BudgetStatus", "DeviceLoss", "Ledger", "PurgeResult"]

_ACCOUNTS = Account.__table__  # type: ignore[attr-defined]
_CHARGES = Charge.__table__  # type: ignore[attr-defined]
_IDEM = IdempotencyRecord.__table__  # type: ignore[attr-defined]
_HORIZONS = RetentionHorizon.__table__  # type: ignore[attr-defined]
# A retry must come within this many UTC days (counted from its first day) to be recognised;
# the purge deletes older idempotency records, so nothing a retry no longer needs is kept.
IDEMPOTENCY_DAYS = 2


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    """A device's standing against one use case's policy.

    Budget-level figures are shared by every use case of a budget group; ``None`` caps are not
    set.
    """

    use_case: str
    budget: str
    policy_version: int
    epsilon_per_report: float
    max_reports_per_day: int
    reports_today: int
    reports_left_today: int
    epsilon_today: float
    epsilon_window: float
    epsilon_lifetime: float
    window_cap: float | None
    window_remaining: float | None
    lifetime_cap: float | None
    lifetime_remaining: float | None
    next_reset: datetime


@dataclass(frozen=True, slots=True)
class PurgeResult:
    """What one retention purge deleted: charge rows, account day counts, idempotency rows.

    ``daily_spend`` keeps the name it had when days were rows of their own table (the job's
    JSON answer carries it): now the (day, use case) counts cleared from accounts.
    """

    charges: int
    daily_spend: int
    idempotency: int


@dataclass(frozen=True, slots=True)
class DeviceLoss:
    """One device's cumulative loss per use case and in total, over the window and lifetime.

    Every figure is a running total (``kind``) of what the device actually sent: its basic sum
    is a guarantee (and what the gate enforces); its (epsilon, delta) bound is not, against an
    adaptively chosen sequence (see docs/accounting.md).
    """

    window: dict[str, PrivacyLoss] = field(default_factory=dict)
    lifetime: dict[str, PrivacyLoss] = field(default_factory=dict)
    window_total: PrivacyLoss | None = None
    lifetime_total: PrivacyLoss | None = None


def _raises(book: PolicyBook, day: int) -> dict[str, tuple[int, int]]:
    """The horizons a purge on ``day`` raises: ``(current, new)`` by use case."""
    spans = {n: (book.horizon(n), book.deletable_through(n, day)) for n in book.latest}
    return {n: span for n, span in spans.items() if span[1] > span[0]}


def _passed(conn: Connection, use_case: str, old: int, new: int) -> int:
    """The charges of a use case on the days a horizon raised from ``old`` to ``new`` passes."""
    span = [_CHARGES.c.use_case == use_case, _CHARGES.c.day <= new]
    if old != NO_HORIZON:
        span.append(_CHARGES.c.day > old)
    return int(conn.execute(select(func.count()).where(and_(*span))).scalar_one())


def _policy_json(policy: Policy) -> dict[str, Any]:
    """A policy version as audit data."""
    data: dict[str, Any] = policy.model_dump(mode="json")
    return data


def _scaled(rows: Iterable[tuple[int, int, int]]) -> tuple[tuple[float, int], ...]:
    """``(micro-epsilon, group size, count)`` rows as pure events at their group's epsilon.

    A pure epsilon-DP report is (g x epsilon)-DP for groups of g (group privacy); each charge
    is scaled by the group size in force when it was made.
    """
    merged: dict[int, int] = defaultdict(int)
    for eps, group, count in rows:
        merged[int(eps) * int(group)] += int(count)
    return tuple((from_micro(e), n) for e, n in sorted(merged.items()))


class Ledger:
    """Per-device privacy accounts over a database engine."""

    def __init__(
        self,
        engine: Engine,
        secret: bytes,
        accountant: Accountant | None = None,
        *,
        audit_key: bytes | None = None,
        idempotency_days: int = IDEMPOTENCY_DAYS,
    ) -> None:
        if isinstance(idempotency_days, bool) or not 1 <= idempotency_days <= 90:
            raise ValueError(f"`idempotency_days` must be 1 to 90, got {idempotency_days!r}")
        self.idempotency_days = idempotency_days
        self.engine = engine
        self._audit_key = audit_key or derive_audit_key(secret)
        self.audit = AuditLog(engine, self._audit_key)
        self.gate = Gate(engine, secret, self.audit)
        self.policies = PolicyStore(engine, on_change=self._policy_changed)
        self.accountant = accountant or Accountant()

    def _policy_changed(self, conn: Connection, old: Policy | None, new: Policy) -> None:
        """Audit a policy write in its transaction: the old and the new version."""
        action = "policy.create" if old is None or not old.active else "policy.update"
        if not new.active:
            action = "policy.delete"
        data = {
            "name": new.name,
            "old": None if old is None else _policy_json(old),
            "new": _policy_json(new),
        }
        self.audit.append(conn, [Entry(new.actor, action, data)], now=new.created_at)

    def set_device_budget(
        self, body: DeviceBudgetCreate, *, actor: str = "admin"
    ) -> DeviceBudgetVersion:
        """Store the device-wide budget as its next version, audited in the same transaction."""

        def audited(
            conn: Connection, old: DeviceBudgetVersion | None, new: DeviceBudgetVersion
        ) -> None:
            data = {
                "old": None if old is None else old.body().model_dump(),
                "new": new.body().model_dump(),
                "version": new.version,
            }
            self.audit.append(
                conn, [Entry(actor, "device_budget.update", data)], now=new.created_at
            )

        return write_device_budget(self.engine, body, actor=actor, on_change=audited)

    # -- tamper evidence ---------------------------------------------------------------------------

    def verify(self, *, kept: Sequence[Checkpoint] = ()) -> tuple[Verification, StateCheck]:
        """The audit chain, and the tables the gate decides on against it.

        ``kept`` are checkpoints kept outside the database (truncation back to any of them is
        caught). The state check (:mod:`budget.integrity`) runs only on a chain that verifies;
        its problem, if any, becomes the verification's.
        """
        replay = StateReplay(self._audit_key)
        chain = self.audit.verify(external=kept, observe=replay)
        if not chain.ok:
            return chain, StateCheck(False, note="the chain failed: the state was not checked")
        state = replay.compare(self.engine)
        verdict = replace(
            chain,
            ok=state.problem is None,
            problem=state.problem,
            state_checked=state.checked,
            note=state.note,
        )
        return verdict, state

    # -- the gate --------------------------------------------------------------------------------

    def charge(
        self,
        device_id: str,
        use_case: str,
        *,
        now: datetime,
        idempotency_key: str | None = None,
        request_hash: str | None = None,
        on_accept: OnAccept | None = None,
    ) -> Decision:
        """Check and charge one report atomically (:meth:`budget.gate.Gate.charge`)."""
        return self.gate.charge(
            device_id,
            use_case,
            now=now,
            idempotency_key=idempotency_key,
            request_hash=request_hash,
            on_accept=on_accept,
        )

    def device_key(self, device_id: str) -> str:
        """The stored pseudonym of a device id."""
        return self.gate.device_key(device_id)

    # -- budgets ---------------------------------------------------------------------------------

    def book(self) -> PolicyBook:
        """The policy book now: every version's terms, budget members, retention, horizons."""
        with self.engine.connect() as conn:
            return load_book(conn)

    def device_wide(self, device_id: str, *, now: datetime) -> DeviceWide | None:
        """The device's standing against the device-wide budget (``None``: none in force)."""
        with self.engine.connect() as conn:
            book = load_book(conn)
            state = self.state_of(conn, self.device_key(device_id)) or AccountState()
        return device_wide(book, state, utc_day(now))

    def device_odometer(self, device_id: str) -> DeviceOdometer:
        """The device's lifetime basic sum and odometer reading (valid under adaptivity)."""
        with self.engine.connect() as conn:
            state = self.state_of(conn, self.device_key(device_id)) or AccountState()
        return device_odometer(state)

    def status(self, device_id: str, *, now: datetime) -> list[BudgetStatus]:
        """The device's standing against every active use case, at ``now``.

        Each figure counts the device's history in every use case the budget's caps count now
        (its members), whatever budget that history was charged under.
        """
        dk = self.device_key(device_id)
        day = utc_day(now)
        out: list[BudgetStatus] = []
        with self.engine.connect() as conn:
            book = load_book(conn)
            state = self.state_of(conn, dk) or AccountState()
        for policy in book.active:
            terms = book.terms[policy.name]
            idx = state.members(terms.members)
            count, eps_today = state.today(day, idx)
            window = state.window_spend(day, terms.retention_days, idx, book.horizons)
            life = state.lifetime_spend(idx)
            wcap, lcap = terms.window_cap_micro, terms.lifetime_cap_micro
            out.append(
                BudgetStatus(
                    use_case=policy.name,
                    budget=terms.budget,
                    policy_version=policy.version,
                    epsilon_per_report=policy.epsilon_per_report,
                    max_reports_per_day=policy.max_reports_per_day,
                    reports_today=count,
                    reports_left_today=max(0, policy.max_reports_per_day - count),
                    epsilon_today=from_micro(eps_today),
                    epsilon_window=from_micro(window),
                    epsilon_lifetime=from_micro(life),
                    window_cap=policy.window_epsilon_cap,
                    window_remaining=None if wcap is None else from_micro(max(0, wcap - window)),
                    lifetime_cap=policy.lifetime_epsilon_cap,
                    lifetime_remaining=None if lcap is None else from_micro(max(0, lcap - life)),
                    next_reset=day_start(day + 1),
                )
            )
        return out

    @staticmethod
    def state_of(conn: Connection, dk: str) -> AccountState | None:
        """The device's state (``None``: it never spent anything)."""
        c = _ACCOUNTS.c
        query = select(c.count, c.epsilon_micro, c.days, c.lifetime).where(c.device_key == dk)
        row = conn.execute(query).first()
        return None if row is None else decode(*row)

    def accounts(
        self, *, expired_by: int | None = None, chunk: int = 20_000
    ) -> Iterator[tuple[str, AccountState]]:
        """Every ``(device key, state)`` in key order; ``expired_by`` filters.

        ``expired_by`` keeps the accounts that hold that day or an earlier one. Each chunk is
        its own short read (keyset pagination), so a scan of a large ledger never holds a
        snapshot, or on SQLite a reader, for its whole length.
        """
        after = ""
        c = _ACCOUNTS.c
        while True:
            query = (
                select(c.device_key, c.count, c.epsilon_micro, c.days, c.lifetime)
                .where(c.device_key > after)
                .order_by(c.device_key)
                .limit(chunk)
            )
            if expired_by is not None:
                query = query.where(c.oldest_day <= expired_by)
            with self.engine.connect() as conn:  # the driver's tuples: no Row objects per row
                rows = conn.execute(query).cursor.fetchall()
            for dk, count, eps, days, lifetime in rows:
                yield str(dk), decode(count, eps, days, lifetime)
            if len(rows) < chunk:
                return
            after = str(rows[-1][0])

    # -- retention -------------------------------------------------------------------------------

    def _all_policies(self) -> dict[str, Policy]:
        """The latest version (active or not) of every use case ever defined."""
        return self.book().latest

    def all_policy_versions(self) -> list[Policy]:
        """Every version of every use case, by name and version."""
        with self.engine.connect() as conn:
            table = Policy.__table__  # type: ignore[attr-defined]
            rows = conn.execute(select(table).order_by(table.c.name, table.c.version)).all()
        return [Policy.model_validate(r._asdict()) for r in rows]

    def retention_horizons(self) -> dict[str, int]:
        """Per use case, the last day the purge deleted (nothing on or before it counts)."""
        return dict(self.book().horizons)

    def charge_rows(self) -> Iterator[tuple[str, str, str, int, int, int]]:
        """Every charge held: ``(device key, use case, budget, version, micro-epsilon, day)``.

        Charges on or before their use case's horizon are deleted by definition, even before
        the purge's rows are gone (the same rule as every other reader).
        """
        horizons = self.retention_horizons()
        with self.engine.connect() as conn:
            query = select(
                _CHARGES.c.device_key,
                _CHARGES.c.use_case,
                _CHARGES.c.budget,
                _CHARGES.c.policy_version,
                _CHARGES.c.epsilon_micro,
                _CHARGES.c.day,
            ).order_by(_CHARGES.c.id)
            with conn.execution_options(yield_per=20_000).execute(query) as result:
                for r in result:
                    if int(r[5]) > horizons.get(str(r[1]), NO_HORIZON):
                        yield str(r[0]), str(r[1]), str(r[2]), int(r[3]), int(r[4]), int(r[5])

    def lifetime_rows(self, use_case: str | None = None) -> Iterator[Row]:
        """The lifetime multiset: ``(device key, use case, micro-epsilon, group size, count)``."""
        for dk, state in self.accounts():
            for (uc, e, g), n in sorted(lifetime_counts(state).items()):
                if use_case is None or uc == use_case:
                    yield dk, uc, e, g, n

    def _window_counts(
        self, day: int, book: PolicyBook, names: Iterable[str] | None = None
    ) -> Iterator[tuple[str, dict[Slot, int]]]:
        """Per device, ``{(use case, micro-epsilon, group): reports}`` in each use case's window.

        Every use case ever defined counts (retired ones in their last version's window), or
        only ``names``.
        """
        retention = book.retention()
        if names is not None:
            wanted = set(names)
            retention = {n: r for n, r in retention.items() if n in wanted}
        for dk, state in self.accounts():
            counts = window_counts(state, day, retention, book.horizons)
            if counts:
                yield dk, counts

    def window_spend_rows(self, *, now: datetime, use_case: str | None = None) -> Iterator[Row]:
        """Each use case's charges in its own window: ``(device, use case, eps, group, n)``."""
        book = self.book()
        names = None if use_case is None else [use_case]
        for dk, counts in self._window_counts(utc_day(now), book, names):
            for (uc, e, g), n in sorted(counts.items()):
                yield dk, uc, e, g, n

    def effective_epsilon_basis(self, *, now: datetime) -> ReportBasis:
        """The delta-free part of the effective-epsilon report: one scan of the ledger.

        With the central figures of the shuffled batches published (:mod:`budget.central`,
        each at its policy's delta).
        """
        basis = prepare_report(
            list(self.book().latest.values()),
            utc_day(now),
            self.window_spend_rows(now=now),
            self.lifetime_rows(),
        )
        central = central_figures(self.engine, self.all_policy_versions(), utc_day(now))
        return replace(basis, central=central)

    def effective_epsilon(
        self, *, now: datetime, delta: float | None = None
    ) -> EffectiveEpsilonReport:
        """The effective-epsilon report (:mod:`budget.reporting.report`) on the live ledger."""
        basis = self.effective_epsilon_basis(now=now)
        return finish_report(basis, accountant=self.accountant, delta=delta)

    def purge(self, *, now: datetime, rows: int = 5_000) -> PurgeResult:
        """Apply retention at ``now``: raise each use case's horizon, delete what it passed.

        A use case's horizon rises to the day before its longest retention ever began (its
        retired versions included: one rule for every version), so that lowering then raising
        ``retention_days`` loses nothing, and days once deleted never count again. The
        horizons rise in one short transaction with the audit entry that records them and
        counts the charges they passed (read before: those days are over, so no charge joins
        them) and the idempotency records deleted before it (older than the retry window,
        ``idempotency_days``). From then on every reader ignores what the horizons passed, so
        the charges and the account days go afterwards, ``rows`` a transaction; a purge that
        stops midway leaves nothing anyone counts, and the next one deletes the rest. On a
        partitioned PostgreSQL ledger, days past every horizon are dropped as partitions in
        the first transaction, and the partitions of the coming days are created.
        """
        day = utc_day(now)
        idem = self._delete_all(
            _IDEM,
            (_IDEM.c.device_key, _IDEM.c.key),
            _IDEM.c.day <= day - self.idempotency_days,
            rows,
        )
        with self.engine.connect() as conn:
            planned = _raises(load_book(conn), day)
            passed = {n: _passed(conn, n, old, new) for n, (old, new) in planned.items()}
        dropped = DroppedDays([], 0)
        with write_step(self.engine) as conn:
            book = load_book(conn)
            raises = _raises(book, day)
            raised = {n: new for n, (_, new) in raises.items()}
            horizons = {**book.horizons, **raised}
            if raised:
                conn.execute(_HORIZONS.delete().where(_HORIZONS.c.use_case.in_(list(raised))))
                conn.execute(
                    _HORIZONS.insert(),
                    [{"use_case": n, "through_day": d} for n, d in sorted(raised.items())],
                )
            through = {name: book.deletable_through(name, day) for name in book.latest}
            if through and is_partitioned(conn):
                # whole days past every horizon go as partitions; rows only where they differ
                dropped = drop_days_through(conn, min(through.values()))
            charges = sum(  # a purge that ran meanwhile raised differently: counted again here
                passed[n] if planned.get(n) == span else _passed(conn, n, *span)
                for n, span in raises.items()
            )
            data: dict[str, Any] = {"day": day, "charges": charges, "idempotency": idem}
            if raised:
                data["horizons"] = dict(sorted(raised.items()))
            if dropped.days:
                data["partitions_dropped"] = dropped.days
            self.audit.append(conn, [Entry("job:purge", "purge.ledger", data)], now=now)
        deleted = dropped.charges
        for name, cutoff in sorted(horizons.items()):
            past = and_(_CHARGES.c.use_case == name, _CHARGES.c.day <= cutoff)
            deleted += self._delete_all(_CHARGES, (_CHARGES.c.id,), past, rows)
        days = self._prune_days(horizons, rows)
        ensure_partitions(self.engine, day, day + DAYS_AHEAD)  # the days ahead, daily
        return PurgeResult(deleted, days, idem)

    def _delete_all(
        self,
        table: Table,
        key: tuple[ColumnElement[Any], ...],
        where: ColumnElement[bool],
        rows: int,
    ) -> int:
        """Delete the rows ``where`` selects, ``rows`` a transaction; how many went.

        The keys are read first, outside any write transaction, so each write is a delete by
        primary key, however many other rows the condition's index range holds.
        """
        with self.engine.connect() as conn:
            found = conn.execute(select(*key).where(where))
            keys = [tuple(r) for r in found] if len(key) > 1 else list(found.scalars())
        deleted = 0
        for start in range(0, len(keys), rows):
            with write_step(self.engine) as conn:
                deleted += delete_keys(conn, table, key, keys[start : start + rows])
        return deleted

    def _prune_days(self, horizons: dict[str, int], chunk: int) -> int:
        """Clear the account days on or before their use case's horizon; the counts cleared.

        Each write is a compare-and-set on the count read: a row charged meanwhile was pruned
        by that charge, and is left as it is.
        """
        if not horizons:
            return 0
        ph = placeholder(self.engine)
        sql = (
            f"UPDATE accounts SET days = {ph}, oldest_day = {ph}"
            f" WHERE device_key = {ph} AND count = {ph}"
        )
        pending: list[tuple[tuple[str, int | None, str, int], int]] = []
        pruned = 0

        def flush() -> int:
            done = 0
            with write_step(self.engine) as conn:
                cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
                cursor.executemany(sql, [params for params, _ in pending])  # one round trip
                if cursor.rowcount == len(pending):
                    done = sum(n for _, n in pending)
                else:  # some were charged meanwhile: again row by row (idempotent) to count
                    for params, n in pending:
                        cursor.execute(sql, params)
                        done += n if cursor.rowcount == 1 else 0
            pending.clear()
            return done

        for dk, state in self.accounts(expired_by=max(horizons.values())):
            n = state.prune(horizons)
            if n:
                pending.append(((state.encode_days(), state.oldest_day, dk, state.count), n))
                if len(pending) >= chunk:
                    pruned += flush()
        if pending:
            pruned += flush()
        return pruned

    # -- accounting ---------------------------------------------------------------------------

    def device_loss(
        self, device_id: str, *, now: datetime, delta: float | None = None
    ) -> DeviceLoss:
        """Window and lifetime loss per use case and in total (basic sum and bound, group-scaled).

        Each charge counts at the group size in force when it was made. The total composes
        every use case's events at ``delta``, by default the smallest delta among the device's
        use cases. All are running totals (labelled ``kind="running total"``).
        """
        if not isinstance(device_id, str) or not device_id:
            raise InvalidRequest("device_id", "must be a non-empty string")
        dk = self.device_key(device_id)
        day = utc_day(now)
        with self.engine.connect() as conn:
            book = load_book(conn)
            state = self.state_of(conn, dk) or AccountState()
        policies = book.latest
        window_rows: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
        lifetime_rows: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
        for (uc, e, g), n in window_counts(state, day, book.retention(), book.horizons).items():
            window_rows[uc].append((e, g, n))
        for (uc, e, g), n in lifetime_counts(state).items():
            lifetime_rows[uc].append((e, g, n))
        used = [policies[u] for u in set(window_rows) | set(lifetime_rows) if u in policies]
        total_delta = delta if delta is not None else min((p.delta for p in used), default=1e-9)
        window, window_total = self._compose(window_rows, policies, delta, total_delta)
        lifetime, lifetime_total = self._compose(lifetime_rows, policies, delta, total_delta)
        return DeviceLoss(window, lifetime, window_total, lifetime_total)

    def _compose(
        self,
        rows: dict[str, list[tuple[int, int, int]]],
        policies: dict[str, Policy],
        delta: float | None,
        total_delta: float,
    ) -> tuple[dict[str, PrivacyLoss], PrivacyLoss]:
        """Per-use-case losses and the total over use cases (each event at its group size)."""
        per_use_case: dict[str, PrivacyLoss] = {}
        merged: dict[float, int] = defaultdict(int)
        for use_case, events in rows.items():
            p = policies[use_case]
            scaled = _scaled(events)
            per_use_case[use_case] = self.accountant.loss(
                scaled, delta=delta if delta is not None else p.delta, kind="running total"
            )
            for eps, count in scaled:
                merged[eps] += count
        return per_use_case, self.accountant.loss(merged, delta=total_delta, kind="running total")

    def window_totals(self, *, now: datetime, use_case: str | None = None) -> dict[str, float]:
        """Basic window epsilon per device key (one scan of the accounts), for a use case or all.

        With ``use_case=None`` each use case's own retention window applies.
        """
        book = self.book()
        if use_case is not None and use_case not in book.latest:
            raise UnknownUseCase(use_case)
        names = None if use_case is None else [use_case]
        totals: dict[str, int] = {}
        for dk, counts in self._window_counts(utc_day(now), book, names):
            totals[dk] = sum(e * n for (_, e, _), n in counts.items())
        return {dk: from_micro(v) for dk, v in totals.items()}

    def window_ledgers(
        self, *, now: datetime, use_case: str
    ) -> Iterator[tuple[str, tuple[tuple[float, int], ...]]]:
        """Each device's window multiset ``((group-scaled epsilon, count), ...)`` for a use case."""
        book = self.book()
        if use_case not in book.latest:
            raise UnknownUseCase(use_case)
        for dk, counts in self._window_counts(utc_day(now), book, [use_case]):
            yield dk, _scaled(sorted((e, g, n) for (_, e, g), n in counts.items()))

    def lifetime_ledgers(
        self, *, use_case: str
    ) -> Iterator[tuple[str, tuple[tuple[float, int], ...]]]:
        """Each device's lifetime multiset for one use case (from the purge-proof totals)."""
        if use_case not in self._all_policies():
            raise UnknownUseCase(use_case)
        for dk, state in self.accounts():
            mine = [
                (e, g, n)
                for (uc, e, g), n in sorted(lifetime_counts(state).items())
                if uc == use_case
            ]
            if mine:
                yield dk, _scaled(mine)

    def population_lifetime_loss(self, *, use_case: str) -> dict[str, PrivacyLoss]:
        """Tight lifetime loss of every device of a use case (memoized by ledger multiset).

        Running totals (labelled so): see :class:`DeviceLoss`.
        """
        policy = self._all_policies()[use_case]
        return {
            dk: self.accountant.loss(ev, delta=policy.delta, kind="running total")
            for dk, ev in self.lifetime_ledgers(use_case=use_case)
        }

    def devices_loss(
        self, device_ids: list[str], *, now: datetime, delta: float | None = None
    ) -> dict[str, DeviceLoss]:
        """:meth:`device_loss` for a set of devices, keyed by the ids given."""
        return {d: self.device_loss(d, now=now, delta=delta) for d in device_ids}

    def population_window_loss(self, *, now: datetime, use_case: str) -> dict[str, PrivacyLoss]:
        """Tight window loss of every device of a use case (memoized by ledger multiset).

        Running totals (labelled so): see :class:`DeviceLoss`.
        """
        policy = self._all_policies()[use_case]
        return {
            dk: self.accountant.loss(ev, delta=policy.delta, kind="running total")
            for dk, ev in self.window_ledgers(now=now, use_case=use_case)
        }

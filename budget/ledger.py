"""The ledger: the gate, the device's standing, retention, tamper evidence.

The ledger owns the database: the service layer calls these methods and never writes SQL. The
read side's figures (losses, the effective-epsilon report, views, export) are computed from
its accounts and policy book in :mod:`dp_governor.budget.reporting`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, and_, func, select

from dp_governor.budget.audit.archive import ArchiveRecord, Archives
from dp_governor.budget.audit.incremental import verify_ledger
from dp_governor.budget.audit.log import AuditLog, Checkpoint, Entry, Verification, derive_audit_key
from dp_governor.budget.audit.row_tags import RowTags
from dp_governor.budget.audit.tlog import DEFAULT_ORIGIN, TransparencyLog
from dp_governor.budget.audit.verdicts import Verdicts
from dp_governor.budget.audit.verify import StateCheck
from dp_governor.budget.clock import day_start, utc_day
from dp_governor.budget.gate.charge import BatchItem, OnAccept, charge_batch
from dp_governor.budget.gate.prepared import Gate, load_book
from dp_governor.budget.privacy.accountant import Accountant
from dp_governor.budget.rule.book import NO_HORIZON, PolicyBook
from dp_governor.budget.rule.decide import Decision
from dp_governor.budget.rule.loosening import loosenings
from dp_governor.budget.rule.standing import (
    DeviceOdometer,
    DeviceWide,
    device_odometer,
    device_wide,
)
from dp_governor.budget.rule.state import AccountState, decode
from dp_governor.budget.storage.db import delete_pages, placeholder, raw_cursor, write_step
from dp_governor.budget.storage.partitions import (
    DAYS_AHEAD,
    DroppedDays,
    drop_days_through,
    ensure_partitions,
    is_partitioned,
)
from dp_governor.budget.storage.tables import Account, Charge, IdempotencyRecord, RetentionHorizon
from dp_governor.policies.device import DeviceBudgetCreate, DeviceBudgetVersion, write_device_budget
from dp_governor.policies.device import loosening as device_loosening
from dp_governor.policies.errors import PolicyConflict, PolicyLoosens
from dp_governor.policies.model import Policy, from_micro
from dp_governor.policies.repository import PolicyStore

__all__ = ["BudgetStatus", "Ledger", "PurgeResult"]

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


def _raises(book: PolicyBook, day: int) -> dict[str, tuple[int, int]]:
    """The horizons a purge on ``day`` raises: ``(current, new)`` by use case."""
    spans = {
        n: (book.horizon(n), kept.spend_through) for n, kept in book.purge_through(day).items()
    }
    return {n: span for n, span in spans.items() if span[1] > span[0]}


def _passed(conn: Connection, use_case: str, old: int, new: int) -> int:
    """The charges of a use case on the days a horizon raised from ``old`` to ``new`` passes."""
    span = [_CHARGES.c.use_case == use_case, _CHARGES.c.day <= new]
    if old != NO_HORIZON:
        span.append(_CHARGES.c.day > old)
    return int(conn.execute(select(func.count()).where(and_(*span))).scalar_one())


def _loosenings(before: PolicyBook, new: Sequence[Policy]) -> list[str]:
    """What adding the versions ``new`` to the book ``before`` loosens."""
    after = PolicyBook.build(
        [*before.versions, *new], before.horizons, before.device, before.device_window
    )
    return loosenings(before, after)


def _policy_json(policy: Policy) -> dict[str, Any]:
    """A policy version as audit data."""
    data: dict[str, Any] = policy.model_dump(mode="json")
    return data


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
        tlog_origin: str = DEFAULT_ORIGIN,
    ) -> None:
        if isinstance(idempotency_days, bool) or not 1 <= idempotency_days <= 90:
            raise ValueError(f"`idempotency_days` must be 1 to 90, got {idempotency_days!r}")
        self.idempotency_days = idempotency_days
        self.engine = engine
        self._audit_key = audit_key or derive_audit_key(secret)
        self.audit = AuditLog(engine, self._audit_key)
        self.row_tags = RowTags(self._audit_key)  # the reports' rows: inbox and store
        self.tlog = TransparencyLog(engine, self._audit_key, origin=tlog_origin)
        self.verdicts = Verdicts(engine, self._audit_key)  # where the next verification starts
        self.archives = Archives(self.audit, self._audit_key)  # entries moved out to files
        self.gate = Gate(engine, secret, self.audit)
        self.policies = PolicyStore(
            engine, on_change=self._policy_changed, review=self._review_policies
        )
        self.accountant = accountant or Accountant()
        # told (accounts read so far, accounts to read) by each pass, a chunk at a time (a
        # command's bar): a full scan's total is the accounts' count, read once beside it
        self.scan_progress: Callable[[int, int], None] | None = None

    def account_count(self) -> int:
        """How many devices hold an account (the length of a full :meth:`accounts` scan)."""
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(_ACCOUNTS)).scalar_one())

    def full_scan_progress(self) -> Callable[[int], None] | None:
        """:attr:`scan_progress` for a pass that reads every account, told 0 now; None: unwatched.

        Its total is the accounts' count (one ``COUNT(*)``, no more than the pass itself reads).
        """
        watch = self.scan_progress
        if watch is None:
            return None
        total = self.account_count()
        watch(0, total)
        return lambda read: watch(read, max(read, total))

    def connect(self) -> Connection:
        """A read connection to the ledger's database; use it as a context manager."""
        return self.engine.connect()

    def close(self) -> None:
        """Release the database connections (a command's last step; the service's shutdown)."""
        self.engine.dispose()

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

    @staticmethod
    def _review_policies(
        conn: Connection, stored: list[Policy], new: list[Policy], allow_loosen: bool
    ) -> None:
        """Refuse a loosening policy write (:func:`~.rule.loosening.loosenings`) unless allowed."""
        if allow_loosen:
            return
        found = _loosenings(load_book(conn), new)
        if found:
            raise PolicyLoosens(found)

    def loosenings(self, proposed: Sequence[Policy]) -> list[str]:
        """What writing ``proposed`` (next versions, :meth:`PolicyStore.proposed`) would loosen."""
        with self.engine.connect() as conn:
            return _loosenings(load_book(conn), proposed)

    def set_device_budget(
        self, body: DeviceBudgetCreate, *, actor: str = "admin", allow_loosen: bool = False
    ) -> DeviceBudgetVersion:
        """Store the device-wide budget as its next version, audited in the same transaction.

        Refused (nothing written) when a quota names no active use case, or when the version
        loosens the one in force (:func:`dp_governor.policies.device.loosening`) and
        ``allow_loosen`` is not set.
        """

        def audited(
            conn: Connection, old: DeviceBudgetVersion | None, new: DeviceBudgetVersion
        ) -> None:
            active = load_book(conn).terms
            unknown = sorted(set(body.quotas) - set(active))
            if unknown:
                raise PolicyConflict(
                    "quotas", f"must name active use cases, got {', '.join(map(repr, unknown))}"
                )
            found = device_loosening(None if old is None else old.body(), body)
            if found and not allow_loosen:
                raise PolicyLoosens(found)
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

    def verify(
        self,
        *,
        kept: Iterable[Checkpoint] = (),
        progress: Callable[[int, int], None] | None = None,
        full: bool = True,
        archive_files: Sequence[Path] = (),
    ) -> tuple[Verification, StateCheck]:
        """The audit chain, the tables the gate decides on against it, the transparency log.

        ``kept`` are checkpoints kept outside the database, oldest first and re-iterable (a
        sequence or a :class:`~dp_governor.budget.audit.log.CheckpointFile`; truncation back
        to any of them is caught). ``full=False`` starts at the last accepted verdict's signed
        checkpoint (:func:`dp_governor.budget.audit.incremental.verify_ledger`).
        ``progress`` is told ``(entries verified, entries in the log)`` every
        :data:`~dp_governor.budget.audit.incremental.PROGRESS_EVERY` entries and at the end.
        The state check's ``resume`` is where the next run may start
        (:meth:`~dp_governor.budget.audit.verdicts.Verdicts.record` keeps it).
        ``archive_files`` (with ``full``) replays the archived entries from their files; files
        that are not this log's archives raise ``NotTheArchives`` before anything is checked.
        """
        return verify_ledger(
            self.audit,
            self.tlog,
            self.verdicts,
            self._audit_key,
            kept=kept,
            progress=progress,
            full=full,
            archives=self.archives,
            archive_files=archive_files,
        )

    def archive(self, *, through: int | None, out: Path, now: datetime) -> ArchiveRecord:
        """Move the entries before a verified signed checkpoint to ``out`` (``None``: the last).

        :meth:`dp_governor.budget.audit.archive.Archives.archive`; raises ``ArchiveRefused``.
        """
        return self.archives.archive(self.verdicts, through=through, out=out, now=now)

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
        """Check and charge one report atomically: a batch of one (:func:`charge_batch`).

        ``on_accept`` runs in the transaction when the report is accepted (an inbox row, say).

        Raises:
            InvalidRequest: a field is invalid (nothing written).
            UnknownUseCase: no active policy of that name (nothing written).
            IdempotencyConflict: the key was used before for a different request.
        """

        def accepted(conn: Connection, decisions: list[tuple[int, Decision]]) -> None:
            if on_accept is not None:
                on_accept(conn, decisions[0][1])

        item = BatchItem(device_id, use_case, idempotency_key, request_hash)
        (result,) = charge_batch(self.gate, [item], now=now, on_accept=accepted)
        if isinstance(result, Exception):
            raise result
        return result

    def device_key(self, device_id: str) -> str:
        """The stored pseudonym of a device id."""
        return self.gate.device_key(device_id)

    # -- budgets ---------------------------------------------------------------------------------

    def book(self) -> PolicyBook:
        """The policy book now: every version, the terms, budget members, retention, horizons.

        The gate's book (:meth:`dp_governor.budget.gate.prepared.Gate.book`): the one policy lookup,
        read again only when a policy version or a horizon was added.
        """
        with self.engine.connect() as conn:
            return self.gate.book(conn)

    def book_revision(self) -> tuple[int, int]:
        """The policy book's revision (:meth:`~.prepared.Gate.revision`): what caches key on."""
        with self.engine.connect() as conn:
            return self.gate.revision(conn)

    def device_wide(self, device_id: str, *, now: datetime) -> DeviceWide | None:
        """The device's standing against the device-wide budget (``None``: none in force)."""
        with self.engine.connect() as conn:
            book = self.gate.book(conn)
            state = self.state_of(conn, self.device_key(device_id)) or AccountState()
        return device_wide(book, state, utc_day(now))

    def device_odometer(self, device_id: str) -> DeviceOdometer:
        """The device's lifetime basic sum and odometer reading (valid under adaptivity)."""
        with self.engine.connect() as conn:
            state = self.state_of(conn, self.device_key(device_id)) or AccountState()
        return device_odometer(state)

    def status(self, device_id: str, *, now: datetime) -> list[BudgetStatus]:
        """The device's standing against every active use case, at ``now``.

        Each figure counts what the budget's caps count (:meth:`AccountState.counted`): its
        members' whole history and every charge made under it.
        """
        dk = self.device_key(device_id)
        day = utc_day(now)
        out: list[BudgetStatus] = []
        with self.engine.connect() as conn:
            book = self.gate.book(conn)
            state = self.state_of(conn, dk) or AccountState()
        for policy in book.active:
            terms = book.terms[policy.name]
            idx = state.counted(terms)
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
        self,
        *,
        expired_by: int | None = None,
        chunk: int = 20_000,
        after: str = "",
        through: str | None = None,
    ) -> Iterator[tuple[str, AccountState]]:
        """Every ``(device key, state)`` in key order; ``expired_by`` and the key range filter.

        ``expired_by`` keeps the accounts that hold that day or an earlier one; ``after`` and
        ``through`` keep the keys in ``(after, through]`` (a partition of
        :meth:`account_splits`). Each chunk is its own short read (keyset pagination), so a scan
        of a large ledger never holds a snapshot, or on SQLite a reader, for its whole length.
        """
        c = _ACCOUNTS.c
        read = 0
        tell = self.full_scan_progress() if expired_by is None else None
        while True:
            query = (
                select(c.device_key, c.count, c.epsilon_micro, c.days, c.lifetime)
                .where(c.device_key > after)
                .order_by(c.device_key)
                .limit(chunk)
            )
            if through is not None:
                query = query.where(c.device_key <= through)
            if expired_by is not None:
                query = query.where(c.oldest_day <= expired_by)
            with self.engine.connect() as conn:  # the driver's tuples: no Row objects per row
                rows = conn.execute(query).cursor.fetchall()
            for dk, count, eps, days, lifetime in rows:
                yield str(dk), decode(count, eps, days, lifetime)
            read += len(rows)
            if tell is not None:
                tell(read)
            if len(rows) < chunk:
                return
            after = str(rows[-1][0])

    def account_splits(self, parts: int) -> list[str]:
        """Device keys that split the accounts into ``parts`` ranges of nearly equal size.

        The ``k``-th of the ``parts - 1`` keys is the last of the first ``k/parts`` of the
        accounts in key order; fewer when there are fewer accounts than parts. With ``""``
        before and ``None`` after, consecutive keys bound :meth:`accounts`'s ``(after, through]``.
        """
        total = self.account_count()
        c = _ACCOUNTS.c
        offsets = sorted({total * k // parts - 1 for k in range(1, parts)} - {-1})
        splits: list[str] = []
        with self.engine.connect() as conn:
            for offset in offsets:  # each one reads the key index up to it
                query = select(c.device_key).order_by(c.device_key).offset(offset).limit(1)
                key = conn.execute(query).scalar_one_or_none()
                if key is not None:
                    splits.append(str(key))
        return splits

    # -- retention -------------------------------------------------------------------------------

    def charge_rows(self) -> Iterator[tuple[str, str, str, int, int, int]]:
        """Every charge held: ``(device key, use case, budget, version, micro-epsilon, day)``.

        Charges on or before their use case's horizon are deleted by definition, even before
        the purge's rows are gone (the same rule as every other reader).
        """
        horizons = self.book().horizons
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

    def purge(self, *, now: datetime, rows: int = 5_000) -> PurgeResult:
        """Apply retention at ``now``: raise each use case's horizon, delete what it passed.

        Each use case's horizon (retired ones included) rises to its ``spend_through``
        (:meth:`dp_governor.budget.rule.book.PolicyBook.purge_through`: the longest retention it
        ever had, at least the longest device-wide window), so that lowering then raising
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
        idem = delete_pages(
            self.engine,
            _IDEM,
            (_IDEM.c.day, _IDEM.c.device_key, _IDEM.c.key),
            _IDEM.c.day <= day - self.idempotency_days,
            rows,
            key=2,
        )
        with self.engine.connect() as conn:
            planned = _raises(self.gate.book(conn), day)
            passed = {n: _passed(conn, n, old, new) for n, (old, new) in planned.items()}
        dropped = DroppedDays([], 0)
        with write_step(self.engine) as conn:
            book = self.gate.book(conn)
            raises = _raises(book, day)
            raised = {n: new for n, (_, new) in raises.items()}
            horizons = {**book.horizons, **raised}
            if raised:
                conn.execute(_HORIZONS.delete().where(_HORIZONS.c.use_case.in_(list(raised))))
                conn.execute(
                    _HORIZONS.insert(),
                    [{"use_case": n, "through_day": d} for n, d in sorted(raised.items())],
                )
            through = {n: kept.spend_through for n, kept in book.purge_through(day).items()}
            if through and is_partitioned(conn):
                # whole days past every horizon go as partitions; rows only where they differ
                dropped = drop_days_through(conn, min(through.values()))
            charges = sum(  # a purge that ran meanwhile raised differently: counted again here
                passed[n] if planned.get(n) == span else _passed(conn, n, *span)
                for n, span in raises.items()
            )
            data: dict[str, Any] = {
                "day": day,
                "charges": charges,
                "idempotency": idem,
                # records of this day and before may be gone (verify checks the later ones)
                "idempotency_through": day - self.idempotency_days,
            }
            if raised:
                data["horizons"] = dict(sorted(raised.items()))
            if dropped.days:
                data["partitions_dropped"] = dropped.days
            self.audit.append(conn, [Entry("job:purge", "purge.ledger", data)], now=now)
        deleted = dropped.charges
        for name, cutoff in sorted(horizons.items()):
            past = and_(_CHARGES.c.use_case == name, _CHARGES.c.day <= cutoff)
            order = (_CHARGES.c.use_case, _CHARGES.c.day, _CHARGES.c.id)
            # PostgreSQL by (day, id): a partitioned table looks in the row's day's partition
            # only; SQLite by id, its primary key (a (day, id) list scans the whole table there)
            key = 2 if self.engine.dialect.name == "postgresql" else 1
            deleted += delete_pages(self.engine, _CHARGES, order, past, rows, key=key)
        days = self._prune_days(horizons, rows)
        ensure_partitions(self.engine, day, day + DAYS_AHEAD, job=True)  # the days ahead, daily
        return PurgeResult(deleted, days, idem)

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
                cursor = raw_cursor(conn)
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

"""The charge transaction: every report, a relay's batch or a single one, goes through here.

Same caps and the same decisions for one report or many, applied in order, in one transaction:

1. validate every item (an invalid item gets its error; the rest go on);
2. claim the items' idempotency keys (``INSERT ... ON CONFLICT DO NOTHING RETURNING``, in key
   order): a key another transaction holds waits for it to commit and is then replayed, so a
   retry storm across workers never fails a batch; a key whose first answer was a refusal that
   has since expired (its ``retry_at`` passed) is decided again;
3. lock and read the state of every device the batch touches: SQLite's ``BEGIN IMMEDIATE``
   holds the write lock; on PostgreSQL the accounts rows are created if missing and locked
   with ``SELECT ... FOR UPDATE`` in key order (no deadlocks between batches), after the
   policy book's advisory lock is taken shared (before the book's revision is read): a policy
   write takes it exclusively, so no batch decides on a book that changes before it commits;
4. decide the items in order, in memory, by the rule
   (:func:`dp_governor.budget.rule.decide.decide_on`), on the book read under the lock;
5. write everything with ``executemany`` (charge ids are drawn before deciding, so each
   decision is built once, complete): one ``accounts`` row per touched device, written with a
   compare-and-set on the count read in step 3 (the batch fails whole if any row disagrees),
   one ``charges`` row per acceptance, and each claimed key's decision;
6. the caller's ``on_accept`` (the inbox rows), then one audit entry per decision, in order.

On PostgreSQL the statements travel in three round trips (psycopg's pipeline mode,
:meth:`~dp_governor.budget.gate.prepared.Gate.trip`): ``BEGIN``, the lock, the revision, the
claims, the rows locked and read and the charge ids; then the writes, the inbox rows and the
audit head locked; then the audit entries, the head and ``COMMIT``. Which items to claim and
lock is guessed from the cached book (the use cases it knows); the revision read under the lock
checks the guess, and a book that disagrees on which use cases exist rolls the attempt back
and runs it again on the book just read. The lock and the revision are separate statements,
each with its own snapshot, so the revision sees any policy write the lock waited for.

Idempotency keys and request fingerprints are stored only in keyed form
(:meth:`dp_governor.budget.gate.prepared.Gate.idempotency_key`,
:meth:`~budget.gate.prepared.Gate.fingerprint`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import orjson
from sqlalchemy import Connection

from dp_governor.budget.audit.log import Entry
from dp_governor.budget.clock import utc_day
from dp_governor.budget.errors import IdempotencyConflict, InvalidRequest, UnknownUseCase
from dp_governor.budget.gate.prepared import Gate, InternalError
from dp_governor.budget.rule.book import Terms
from dp_governor.budget.rule.decide import Decision, decide_on
from dp_governor.budget.rule.state import AccountState, decode, state_columns
from dp_governor.budget.storage.db import placeholder, raw_cursor

__all__ = [
    "MAX_DEVICE_ID",
    "MAX_IDEMPOTENCY_KEY",
    "BatchItem",
    "OnAccept",
    "OnAcceptMany",
    "charge_batch",
    "charge_entry",
]

OnAcceptMany = Callable[[Connection, list[tuple[int, Decision]]], None]
"""Called in the transaction with the accepted ``(item index, decision)`` pairs, in order."""
OnAccept = Callable[[Connection, Decision], None]
"""A single report's form of :data:`OnAcceptMany`
(:meth:`dp_governor.budget.ledger.Ledger.charge`)."""
MAX_DEVICE_ID = 256
MAX_IDEMPOTENCY_KEY = 255
_CHUNK = 400
_UNCOUNTED = ("null", "null")  # a refusal's ``n`` and ``spent``


class BatchItem(NamedTuple):
    """One charge request of a batch (a named tuple: a relay's batch builds one per report)."""

    device_id: str
    use_case: str
    idempotency_key: str | None = None
    request_hash: str | None = None


def charge_entry(
    dk: str,
    decision: Decision,
    terms: Terms,
    idempotency: str | None = None,
    tally: tuple[int, int] | None = None,
) -> Entry:
    """The audit entry of one charge decision (accepted or refused; no report payload).

    ``tally`` is an acceptance's ``(n, spent)``: its ordinal among the device's charges of the
    use case that day and the device's micro-epsilon on it after this charge
    (:meth:`~dp_governor.budget.rule.state.AccountState.use_case_today`); the transparency
    log's leaf is labelled and counted by them (``null`` for a refusal).

    ``idempotency`` is the digest of the idempotency record the decision was stored in
    (:meth:`dp_governor.budget.audit.log.AuditLog.idempotency_digest`; ``null`` without a key), so
    ``verify`` checks that table too. Its data is formatted as canonical JSON directly (keys in
    sorted order; the strings encoded by ``orjson``): the same text as encoding the dict, a few
    times cheaper.
    """
    d = decision
    idem = "null" if idempotency is None else f'"{idempotency}"'
    n, spent = tally or _UNCOUNTED
    return Entry(
        f"device:{dk}",
        "charge",
        f'{{"accepted":{"true" if d.accepted else "false"},"budget":{_json_text(d.budget)},'
        f'"charge_id":{"null" if d.charge_id is None else int(d.charge_id)},"day":{int(d.day)},'
        f'"epsilon_micro":{int(terms.eps_micro)},"idempotency":{idem},"n":{n},'
        f'"policy_version":{int(d.policy_version)},'
        f'"reason":{_json_text(d.reason)},"spent":{spent},"use_case":{_json_text(d.use_case)}}}',
    )


@functools.lru_cache(maxsize=4096)
def _json_text(value: str) -> str:
    """A JSON string literal (use-case, budget and reason names: a few, over and over)."""
    return orjson.dumps(value).decode()


def _validate_text(field: str, value: object, limit: int) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(field, f"must be a string, got {type(value).__name__}")
    if not 1 <= len(value) <= limit:
        raise InvalidRequest(field, f"must be 1 to {limit} characters, got {len(value)}")
    if not value.isprintable():
        raise InvalidRequest(field, "must contain printable characters only")
    return value


def _placeholders(n: int, style: str) -> str:
    return ", ".join([style] * n)


def _rows(n: int, width: int, style: str) -> str:
    """``VALUES (?, ...), (?, ...)``: a row-value list both SQLite and PostgreSQL accept."""
    row = "(" + ", ".join([style] * width) + ")"
    return "VALUES " + ", ".join([row] * n)


def _day(now: object) -> int:
    if not isinstance(now, datetime):
        raise InvalidRequest("now", f"must be a datetime, got {type(now).__name__}")
    try:
        return utc_day(now)
    except ValueError:
        raise InvalidRequest("now", "must be timezone-aware") from None


def charge_batch(
    gate: Gate,
    items: Sequence[BatchItem],
    *,
    now: datetime,
    on_accept: OnAcceptMany | None = None,
) -> list[Decision | Exception]:
    """Charge ``items`` in order in one transaction; see the module docstring."""
    day = _day(now)
    results: list[Decision | Exception | None] = [None] * len(items)
    valid: list[int] = []
    names: set[str] = set()  # use cases already checked (a relay's batch repeats one)
    for i, item in enumerate(items):
        try:
            _validate_text("device_id", item.device_id, MAX_DEVICE_ID)
            if not (type(item.use_case) is str and item.use_case in names):
                names.add(_validate_text("use_case", item.use_case, 63))
            if item.idempotency_key is not None:
                _validate_text("idempotency_key", item.idempotency_key, MAX_IDEMPOTENCY_KEY)
        except InvalidRequest as exc:
            results[i] = exc
        else:
            valid.append(i)
    # outside the write lock: another worker's batch commits meanwhile
    keys = {i: gate.device_key(items[i].device_id) for i in valid}
    stored_keys: dict[int, tuple[str, str, str]] = {}  # item: (device key, key, fingerprint)
    for i in valid:
        item = items[i]
        if item.idempotency_key is not None:
            stored_keys[i] = (
                keys[i],
                gate.idempotency_key(keys[i], item.idempotency_key),
                gate.fingerprint(item.use_case, item.request_hash),
            )
    while True:  # again only when the policy book moved under a guess (see _BookMoved)
        try:
            return _charge(gate, items, day, now, keys, stored_keys, valid, results, on_accept)
        except _BookMoved:
            continue


class _BookMoved(Exception):
    """The book read under the lock disagrees with the cached one on which use cases exist."""


def _charge(
    gate: Gate,
    items: Sequence[BatchItem],
    day: int,
    now: datetime,
    keys: dict[int, str],
    stored_keys: dict[int, tuple[str, str, str]],
    valid: list[int],
    results: list[Decision | Exception | None],
    on_accept: OnAcceptMany | None,
) -> list[Decision | Exception]:
    """One attempt at the transaction, in three trips to the database (see the module docstring)."""
    results = list(results)
    ph = placeholder(gate.engine)
    postgres = gate.postgres
    with gate.write_lock, gate.engine.connect() as conn, gate.transaction(conn):
        guess = gate.cached_book() or (None, gate.book(conn))
        known = [i for i in valid if items[i].use_case in guess[1].terms]
        with gate.trip(conn):  # the lock and every read a decision waits for: one round trip
            if postgres:  # the book read below stays the book in force until this commits
                raw_cursor(conn).execute(gate.sql("begin"))
                raw_cursor(conn).execute(gate.sql("book_lock"))
            revision = raw_cursor(conn)
            revision.execute(gate.sql("revision"))
            claims = _send_claims(conn, ph, items, known, stored_keys)
            devices = sorted({keys[i] for i in known})
            reads = _send_reads(gate, conn, ph, devices)
            ids = _send_ids(conn, len(known), postgres)
        row = revision.fetchone()
        book = gate.book_at(conn, (int(row[0]), int(row[1])))
        terms: dict[str, Terms | UnknownUseCase] = {}
        for i in valid:
            name = items[i].use_case
            if name not in terms:
                found = book.terms.get(name)
                terms[name] = UnknownUseCase(name) if found is None else found
            unknown = terms[name]
            if isinstance(unknown, UnknownUseCase):
                results[i] = unknown
        if [i for i in valid if results[i] is None] != known:
            raise _BookMoved  # rolls back what was claimed and locked on the guess
        of: dict[int, Terms] = {i: terms[items[i].use_case] for i in known}  # type: ignore[misc]
        to_decide, claimed, replay_of = _claim(
            conn, ph, items, known, stored_keys, results, now, claims
        )
        states: dict[str, AccountState] = {}
        for cur in reads:
            for dk, count, eps, days_text, lifetime_text in cur.fetchall():
                states[dk] = decode(count, eps, days_text, lifetime_text)
        before = {dk: state.count for dk, state in states.items()}

        # Decide in order; acceptances take consecutive pre-allocated charge ids.
        next_ids = iter(_read_ids(conn, ids, len(known), postgres))
        next_id = next(next_ids, 0)
        accepted: list[tuple[int, Decision]] = []
        tallies: dict[int, tuple[int, int]] = {}  # an acceptance's (n, spent) for its leaf
        for i in to_decide:
            state = states.get(keys[i])
            if state is None:
                state = states[keys[i]] = AccountState()
            decision = decide_on(of[i], day, state, next_id)
            results[i] = decision
            if decision.accepted:
                accepted.append((i, decision))
                tallies[i] = state.use_case_today(day, decision.use_case)
                next_id = next(next_ids, 0)
        for i, j in replay_of.items():
            first_result = results[j]
            results[i] = (
                first_result._replace(replayed=True)
                if isinstance(first_result, Decision)
                else first_result
            )

        # Write: the rows, then the audit head read (the second trip), then the entries and
        # COMMIT (the third).
        with gate.trip(conn):
            written = None
            if accepted:
                touched = {keys[i] for i, _ in accepted}
                written = _write(
                    gate,
                    conn,
                    ph,
                    day,
                    [(keys[i], of[i], stored_keys.get(i), d) for i, d in accepted],
                    [(dk, states[dk], before.get(dk, 0)) for dk in sorted(touched)],
                )
            decided_keys = []
            for i in claimed:
                made = results[i]
                assert isinstance(made, Decision)
                dk, key, _ = stored_keys[i]
                decided_keys.append((made.to_json(), day, dk, key))
            if decided_keys:
                raw_cursor(conn).executemany(gate.sql("decide_key"), decided_keys)
            if on_accept is not None and accepted:
                on_accept(conn, accepted)
            entries = []
            for i in to_decide:
                made = results[i]
                assert isinstance(made, Decision)
                stored = stored_keys.get(i)  # every keyed item decided here stored its record
                idem = None if stored is None else gate.audit.idempotency_digest(*stored)
                entries.append(charge_entry(keys[i], made, of[i], idem, tallies.get(i)))
            gate.audit.append(conn, entries, now=now)  # last: it holds the chain's head
            # an acceptance has an entry, so the head's read brought the accounts' answer in
            if written is not None and written[0].rowcount not in (-1, written[1]):
                raise InternalError("an account changed under the batch's lock")
            if postgres:  # in the same trip as the entries
                raw_cursor(conn).execute("COMMIT")
    out: list[Decision | Exception] = []
    for r in results:
        assert r is not None
        out.append(r)
    return out


def _send_claims(
    conn: Connection,
    ph: str,
    items: Sequence[BatchItem],
    valid: list[int],
    stored_keys: dict[int, tuple[str, str, str]],
) -> tuple[list[Any], dict[int, int], list[tuple[tuple[str, str], int]]]:
    """Send the claims of the batch's idempotency keys (first item of each key, in key order).

    Returns the cursors whose rows are the claimed keys, the repeats (item: first item of its
    key) and the claimed keys in order.
    """
    first_of: dict[tuple[str, str], int] = {}
    repeats: dict[int, int] = {}
    for i in valid:
        if i not in stored_keys:
            continue
        dk, key, _ = stored_keys[i]
        first = first_of.get((dk, key))
        if first is None:
            first_of[(dk, key)] = i
        else:
            repeats[i] = first
    ordered = sorted(first_of.items())  # key order: no deadlock between concurrent batches
    cursors = []
    for s in range(0, len(ordered), _CHUNK):
        part = ordered[s : s + _CHUNK]
        cur = raw_cursor(conn)
        cur.execute(
            "INSERT INTO idempotency (device_key, key, request_hash, day, decision, use_case)"
            f" {_rows(len(part), 6, ph)} ON CONFLICT (device_key, key) DO NOTHING"
            " RETURNING device_key, key",
            [
                v
                for (dk, key), i in part
                for v in (dk, key, stored_keys[i][2], 0, "", items[i].use_case)
            ],
        )
        cursors.append(cur)
    return cursors, repeats, ordered


def _send_reads(gate: Gate, conn: Connection, ph: str, devices: list[str]) -> list[Any]:
    """Send the reads of the devices' rows (on PostgreSQL made if missing, and locked)."""
    postgres = gate.postgres
    if postgres and devices:
        raw_cursor(conn).executemany(gate.sql("insert_state"), [(dk,) for dk in devices])
    cursors = []
    for s in range(0, len(devices), _CHUNK):
        chunk = devices[s : s + _CHUNK]
        lock_of = " FOR UPDATE OF a" if postgres else ""
        cur = raw_cursor(conn)
        cur.execute(
            "SELECT a.device_key, a.count, a.epsilon_micro, a.days, a.lifetime"
            f" FROM ({_rows(len(chunk), 1, ph)}) AS k JOIN accounts a"
            " ON a.device_key = k.column1"
            f" ORDER BY a.device_key{lock_of}",
            chunk,
        )
        cursors.append(cur)
    return cursors


def _claim(
    conn: Connection,
    ph: str,
    items: Sequence[BatchItem],
    valid: list[int],
    stored_keys: dict[int, tuple[str, str, str]],
    results: list[Decision | Exception | None],
    now: datetime,
    claims: tuple[list[Any], dict[int, int], list[tuple[tuple[str, str], int]]],
) -> tuple[list[int], list[int], dict[int, int]]:
    """Which items to decide, whose keys to record, and the replays, from the sent claims.

    The first item of each key in the batch claims it; a repeat replays the first's answer.
    A key already recorded replays its answer, unless that was a refusal whose ``retry_at``
    has passed (decided again). A key recorded for another request is a conflict.
    """
    cursors, repeats, ordered = claims
    replay_of: dict[int, int] = {}
    for i, first in repeats.items():
        if stored_keys[first][2] != stored_keys[i][2]:
            results[i] = IdempotencyConflict(str(items[i].idempotency_key))
        else:
            replay_of[i] = first
    claimed_keys: set[tuple[str, str]] = set()
    for cur in cursors:
        claimed_keys.update((str(dk), str(key)) for dk, key in cur.fetchall())
    held = [(k, i) for k, i in ordered if k not in claimed_keys]
    stored: dict[tuple[str, str], tuple[str, str, str]] = {}
    for s in range(0, len(held), _CHUNK):  # a replay: one more trip
        part = held[s : s + _CHUNK]
        cur = raw_cursor(conn)
        cur.execute(
            "SELECT device_key, key, request_hash, use_case, decision FROM idempotency"
            f" WHERE (device_key, key) IN ({_rows(len(part), 2, ph)})",
            [v for (dk, key), _ in part for v in (dk, key)],
        )
        for dk, key, fingerprint, use_case, decision in cur.fetchall():
            stored[(str(dk), str(key))] = (str(fingerprint), str(use_case), str(decision))
    again: set[int] = set()
    for k, i in held:
        fingerprint, use_case, decision = stored[k]
        if fingerprint != stored_keys[i][2] or use_case != items[i].use_case or not decision:
            results[i] = IdempotencyConflict(str(items[i].idempotency_key))
            continue
        answer = Decision.from_json(decision)
        if not answer.accepted and answer.retry_at is not None and answer.retry_at <= now:
            again.add(i)  # its refusal has expired: a retry now is a new attempt
        else:
            results[i] = answer
    for i, j in list(replay_of.items()):
        if isinstance(results[j], IdempotencyConflict):
            results[i] = results[j]
            del replay_of[i]
    to_decide = [
        i
        for i in valid
        if results[i] is None
        and i not in replay_of
        and (i not in stored_keys or i in again or stored_keys[i][:2] in claimed_keys)
    ]
    claimed = [i for i in to_decide if i in stored_keys]
    return to_decide, claimed, replay_of


def _send_ids(conn: Connection, n: int, postgres: bool) -> Any:
    """PostgreSQL: send the draw of ``n`` charge ids from the column's sequence (None on SQLite)."""
    if not (postgres and n):
        return None
    cur = raw_cursor(conn)
    cur.execute(
        "SELECT nextval(pg_get_serial_sequence('charges', 'id')) FROM generate_series(1, %s)",
        (n,),
    )
    return cur


def _read_ids(conn: Connection, sent: Any, n: int, postgres: bool) -> list[int]:
    """``n`` fresh charge ids, in order (unused ones are left as gaps).

    SQLite: the batch holds the write lock, so the ids after the largest ever used (the table's
    AUTOINCREMENT counter, or its maximum in databases made before it) are free; inserting them
    advances the counter. PostgreSQL: drawn from the column's sequence (:func:`_send_ids`).
    """
    if n == 0:
        return []
    if postgres:
        return sorted(int(r[0]) for r in sent.fetchall())
    cur = raw_cursor(conn)
    cur.execute("SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_sequence'")
    if int(cur.fetchone()[0]):
        cur.execute(
            "SELECT max(coalesce((SELECT max(id) FROM charges), 0),"
            " coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'charges'), 0))"
        )
    else:
        cur.execute("SELECT coalesce(max(id), 0) FROM charges")
    last = int(cur.fetchone()[0])
    return list(range(last + 1, last + n + 1))


def _write(
    gate: Gate,
    conn: Connection,
    ph: str,
    day: int,
    accepted: list[tuple[str, Terms, tuple[str, str, str] | None, Decision]],
    states: list[tuple[str, AccountState, int]],
) -> tuple[Any, int]:
    """The touched accounts (compare-and-set on their counts) and the charges' rows.

    Returns the accounts' cursor and the rows it must have changed: checked before commit,
    once its answer is in (on PostgreSQL with the audit head's, not in a trip of its own).
    """
    rows = [(dk, *state_columns(state), count) for dk, state, count in states]
    cur = raw_cursor(conn)
    cur.executemany(gate.sql("write_state"), rows)
    raw_cursor(conn).executemany(
        "INSERT INTO charges (id, device_key, use_case, budget, policy_version, epsilon_micro,"
        f" day, idempotency_key) VALUES ({_placeholders(8, ph)})",
        [
            (d.charge_id, dk, t.name, t.budget, t.version, t.eps_micro, day, k and k[1])
            for dk, t, k, d in accepted
        ],
    )
    return cur, len(rows)

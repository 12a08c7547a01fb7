"""The inbox flush: shuffle a use case's waiting reports into published batches in the store.

``flush_inbox`` reads a use case's inbox, opens its sealed rows' device pseudonyms, checks the
minimums of each parameter set's pending reports and shuffles a batch outside any write
transaction, then claims it in one small transaction (``inbox_moves``: its inbox ids in shuffled
order and its figures), which succeeds only if no other batch and no purge moved the inbox since
it was read. It then moves the batch a step per transaction with ``DELETE ... RETURNING``,
opening and storing exactly the rows each delete returned, all under the batch's one parameter
set and day; the transaction that moves its last report publishes it (its record in
``shuffled_batches``, its part in ``batch_parts``) and clears the claim. A flush that finds a
batch being moved carries on with it, whoever started it.
"""

from __future__ import annotations

import logging
import secrets
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson
from sqlalchemy import Connection, Engine, and_, bindparam, delete, func, select, update
from sqlalchemy.exc import IntegrityError

from dp_governor.budget import Ledger, utc_day
from dp_governor.budget.audit.log import AuditLog, Entry
from dp_governor.budget.audit.row_tags import RowTags
from dp_governor.budget.gate.prepared import InternalError, load_book
from dp_governor.budget.privacy.sub_batches import batch_layers
from dp_governor.budget.rule.book import PolicyBook
from dp_governor.budget.storage.db import placeholder, raw_cursor, write_step
from dp_governor.pipeline.seal import InboxSeal, SealError
from dp_governor.pipeline.tables import BATCHES as _BATCHES
from dp_governor.pipeline.tables import INBOX as _INBOX
from dp_governor.pipeline.tables import MOVES as _MOVES
from dp_governor.pipeline.tables import ORDERS as _ORDERS
from dp_governor.pipeline.tables import PARTS as _PARTS
from dp_governor.pipeline.tables import (
    STEP_ROWS,
)
from dp_governor.policies import mechanism_for
from dp_governor.policies.model import to_micro

__all__ = ["DEFAULT_MIN_BATCH", "flush_inbox", "waiting_reports"]

DEFAULT_MIN_BATCH = 100
log = logging.getLogger("dpgov.pipeline")


@dataclass(frozen=True, slots=True)
class _Terms:
    """What the flush needs of a use case's policies: its minimum and each version's epsilon.

    ``tagged``: whether the flush opens the sealed rows to count their pseudonyms: always, as
    every report is queued with one (rows an earlier release queued without one count as
    untagged).
    """

    min_devices: int
    epsilon_micro: dict[str, int]  # by parameter hash
    max_epsilon_micro: int
    tagged: bool


def _terms(book: PolicyBook, use_cases: set[str]) -> dict[str, _Terms]:
    """Each use case's latest ``min_batch_devices`` and every version's epsilon per report."""
    out: dict[str, _Terms] = {}
    for version in book.versions:  # by name, then version: each use case's latest last
        if version.name not in use_cases:
            continue
        found = (mechanism_for(version).fingerprint.params, to_micro(version.epsilon_per_report))
        known = out.get(version.name)
        eps = {**known.epsilon_micro, found[0]: found[1]} if known else {found[0]: found[1]}
        top = max(found[1], known.max_epsilon_micro if known else 0)
        tagged = True
        out[version.name] = _Terms(version.min_batch_devices, eps, top, tagged)
    return out


@dataclass(frozen=True, slots=True)
class _Move:
    """A claimed batch: its number, its inbox ids in shuffled order, its figures (JSON-ready).

    ``opened``: the reports the claim opened already (to count pseudonyms), by inbox id, so
    that the move does not open them again; empty for a batch carried on from the database.
    """

    batch: int
    ids: np.ndarray  # int64
    record: dict[str, Any]
    opened: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Evidence:
    """What the flush leaves for ``verify``: the reports' tags and each batch's audit entry."""

    tags: RowTags
    audit: AuditLog
    at: datetime


def flush_inbox(
    engine: Engine,
    *,
    seal: InboxSeal,
    batch: int = STEP_ROWS,
    min_batch: int = DEFAULT_MIN_BATCH,
    now: datetime | None = None,
    progress: Callable[[int, int], None] | None = None,
    ledger: Ledger | None = None,
) -> int:
    """Publish each use case's pending reports as shuffled batches, once large enough.

    A batch is every report pending in a use case's inbox under one parameter set; it is
    published once it holds at least ``min_batch`` reports from at least the policy's
    ``min_batch_devices`` distinct devices (counted by the inbox's per-use-case pseudonyms,
    which ``seal`` opens), and otherwise waits for the next flush: a day's tail joins the next
    day's reports, and reports of parameters since changed wait for more of theirs. All of a
    batch's reports are stored under one day, its first charge day, so no part of a published
    batch is smaller than the batch. The batch is claimed, then moved about ``batch`` reports a
    transaction (equal steps) in the order of the reports' random inbox ids (a CSPRNG
    permutation drawn when they were queued), each step's reports opened and stored in a fresh
    CSPRNG shuffle, under new random ids and without their pseudonyms; the transaction that
    moves its last report records it in ``shuffled_batches``
    (:mod:`dp_governor.budget.reporting.central`) and publishes it to the fold. A batch left half
    moved (a crash, a stopped job) is carried on first. Rows queued before sealing are sealed first.
    Returns how many reports this call moved. ``progress`` is called with the pending reports
    checked so far and those found pending, after each use case (checked: moved, or left
    waiting for the minimums; :func:`waiting_reports` counts those).

    ``ledger`` (the jobs always give it) is what leaves the evidence ``verify`` checks: each
    stored report is tagged (:class:`dp_governor.budget.audit.row_tags.RowTags`) if its inbox row's
    tag was right, and stored untagged otherwise (a forged inbox row is never laundered into a
    tagged report), and each published batch's figures are an audit entry (``batch.publish``).
    Without it (tests and benchmarks that never verify), reports are stored untagged and
    batches unrecorded, which ``verify`` reports.
    """
    if batch < 1 or min_batch < 1:
        raise ValueError(f"`batch` and `min_batch` must be at least 1, got {batch}, {min_batch}")
    at = now if now is not None else datetime.now(UTC)
    today = utc_day(at)
    proof = None if ledger is None else _Evidence(ledger.row_tags, ledger.audit, at)
    _seal_waiting(engine, seal, batch, proof)
    with engine.connect() as conn:
        pending = conn.execute(
            select(_INBOX.c.use_case, func.count()).group_by(_INBOX.c.use_case)
        ).all()
        moving = conn.execute(
            select(_MOVES.c.use_case, _MOVES.c.batch, _ORDERS.c.manifest, _ORDERS.c.record)
            .join(_ORDERS, _ORDERS.c.batch == _MOVES.c.batch)
            .where(_MOVES.c.batch.is_not(None))
        ).all()
    carried = {str(row.use_case) for row in moving}
    counts = {str(u): int(n) for u, n in pending if n >= min_batch or str(u) in carried}
    moved = handled = 0

    def done(use_case: str) -> None:
        nonlocal handled
        handled += counts.get(use_case, 0)
        if progress is not None:
            progress(handled, sum(counts.values()))

    for row in moving:
        claim = _Move(
            int(row.batch), np.frombuffer(row.manifest, np.int64), orjson.loads(row.record)
        )
        moved += _carry(engine, seal, str(row.use_case), claim, batch, today, proof)
        done(str(row.use_case))
    ready = set(counts) - carried
    if not ready:
        return moved
    with engine.connect() as conn:
        # read afresh each flush (milliseconds for the default policies): a process may flush
        # several databases whose use cases share names and versions
        terms = _terms(load_book(conn), ready)
    for use_case in sorted(ready):
        found = terms.get(use_case)  # none: no policy of that name, left for inspection
        published: set[str] = set()  # one batch per parameter set and flush
        more = found is not None
        while more and found is not None:
            claimed, more = _claim(engine, seal, use_case, found, min_batch, published)
            if claimed is not None:
                published.add(str(claimed.record["params"]))
                moved += _carry(engine, seal, use_case, claimed, batch, today, proof)
        done(use_case)
    return moved


def waiting_reports(engine: Engine) -> int:
    """How many reports the inbox holds: those a flush left waiting for a batch's minimums."""
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(_INBOX)).scalar_one())


def _seal_waiting(engine: Engine, seal: InboxSeal, rows: int, proof: _Evidence | None) -> int:
    """Seal the inbox rows queued before sealing (an upgraded database), ``rows`` a transaction.

    The row keeps its id, use case, parameters and day; its report and pseudonym go into
    ``sealed`` and the clear columns are emptied (SQLite's ``secure_delete`` overwrites the old
    bytes in the page). The seal authenticates the row from then on, so only a row whose tag
    was right, or that an earlier release queued untagged, is sealed (with ``proof``); a row
    with a wrong tag stays as it is, and ``verify`` names it. Without a shuffler key nothing is
    sealed and such rows flush as they are. Returns how many rows were sealed.
    """
    if not seal.can_seal:
        return 0
    i = _INBOX.c
    with engine.connect() as conn:
        found = conn.execute(
            select(i.id, i.use_case, i.params, i.day, i.payload, i.device_tag, i.tag).where(
                i.payload.is_not(None)
            )
        ).all()
    sealed = 0
    statement = (
        update(_INBOX)
        .where(and_(i.id == bindparam("row_id"), i.payload.is_not(None)))
        .values(sealed=bindparam("blob"), payload=None, device_tag=None, tag=None)
    )
    for start in range(0, len(found), rows):
        chunk = [
            (int(r.id), str(r.use_case), str(r.params), int(r.day), str(r.payload), r.device_tag)
            for r in found[start : start + rows]
            if proof is None or r.tag is None or proof.tags.check_inbox(*_clear(r), r.tag)
        ]
        blobs = [seal.seal(*row) for row in chunk]
        with write_step(engine) as conn:
            sealed += conn.execute(
                statement,
                [{"row_id": r[0], "blob": b} for r, b in zip(chunk, blobs, strict=True)],
            ).rowcount
    return sealed


def _clear(row: Any) -> tuple[int, str, str, int, str, int | None]:
    """A clear inbox row's tagged fields."""
    return (
        int(row.id),
        str(row.use_case),
        str(row.params),
        int(row.day),
        row.payload,
        row.device_tag,
    )


def _claim(
    engine: Engine,
    seal: InboxSeal,
    use_case: str,
    terms: _Terms,
    min_batch: int,
    published: set[str],
) -> tuple[_Move | None, bool]:
    """Plan a use case's next batch from its inbox and claim it; and whether more are ready.

    The batch is the pending reports of one parameter set (not in ``published``: each set
    once a flush) that reach both minimums, the one with the earliest charge day first;
    ``None`` when none does, or when another flush claimed first. The inbox is read after the
    claim's generation, so a batch or purge that removed inbox rows in between has raised it
    and the claim fails (the next flush plans again). Sealed rows are opened only when the use
    case's rows may hold pseudonyms to count (their reports are then kept for the move); rows
    this process cannot open (sealed under a key it does not hold) wait, with a warning.
    """
    with engine.connect() as conn:
        seen = conn.execute(
            select(_MOVES.c.generation, _MOVES.c.batch).where(_MOVES.c.use_case == use_case)
        ).first()
        if seen is not None and seen.batch is not None:
            return None, False  # claimed since the flush looked: its claimer moves it
        rows = conn.execute(
            select(
                _INBOX.c.id, _INBOX.c.params, _INBOX.c.day, _INBOX.c.device_tag, _INBOX.c.sealed
            ).where(_INBOX.c.use_case == use_case)
        ).all()
    groups: dict[str, list[tuple[int, int, int | None]]] = {}
    opened: dict[int, str] = {}
    closed: list[str] = []
    for r in rows:
        params = str(r.params)
        if params in published:
            continue
        tag = r.device_tag
        try:
            if r.sealed is not None and terms.tagged:  # open it to count its pseudonym
                opened[int(r.id)], tag = seal.open(
                    int(r.id), use_case, params, int(r.day), r.sealed
                )
            elif r.sealed is not None:  # no pseudonym in it: only check that it will open
                seal.check_key(int(r.id), r.sealed)
        except SealError as exc:
            closed.append(str(exc))
            continue
        groups.setdefault(params, []).append((int(r.id), int(r.day), tag))
    if closed:
        log.warning(
            "flush of %s: %d inbox rows cannot be opened and wait (%s)",
            use_case,
            len(closed),
            closed[0],
        )
    need_devices = terms.min_devices if terms.min_devices > 1 else 0
    ready = []
    for params, members in groups.items():
        per_device = Counter(tag for _, _, tag in members if tag is not None)
        if len(members) >= min_batch and len(per_device) >= need_devices:
            ready.append((min(day for _, day, _ in members), params, members, per_device))
    if not ready:
        return None, False
    ready.sort(key=lambda found: found[:2])
    _, params, members, per_device = ready[0]
    # The order of the random inbox ids is a CSPRNG permutation of the batch, drawn when each
    # report was queued and independent of arrival: the steps follow it, so each step's
    # reports sit together in the inbox's B-tree (a step writes a few pages, not one a report),
    # and each step is shuffled again as it is stored (_move_chunk).
    ids = sorted(row_id for row_id, _, _ in members)
    move = _Move(
        secrets.randbits(63),
        np.asarray(ids, dtype=np.int64),
        _figures(params, [day for _, day, _ in members], per_device, terms),
        {i: opened[i] for i in ids if i in opened},
    )
    order = {
        "batch": move.batch,
        "manifest": move.ids.tobytes(),
        "record": orjson.dumps(move.record).decode(),
    }
    with write_step(engine) as conn:
        if seen is None:  # the use case's first batch: whoever inserts first claims
            try:
                with conn.begin_nested():
                    conn.execute(
                        _MOVES.insert().values(
                            use_case=use_case, generation=1, batch=move.batch, moved=0
                        )
                    )
            except IntegrityError:
                return None, False
        elif not conn.execute(
            update(_MOVES)
            .where(
                and_(
                    _MOVES.c.use_case == use_case,
                    _MOVES.c.generation == seen.generation,
                    _MOVES.c.batch.is_(None),
                )
            )
            .values(generation=_MOVES.c.generation + 1, batch=move.batch, moved=0)
        ).rowcount:
            return None, False
        conn.execute(_ORDERS.insert().values(**order))
    return move, len(ready) > 1


def _figures(
    params: str, days: Sequence[int], per_device: Counter[int], terms: _Terms
) -> dict[str, Any]:
    """A planned batch's record (``shuffled_batches`` but the day published) and its one part.

    Its reports are stored under its first charge day (``day``); ``charge_days`` counts them
    per charge day, for the service's verification.
    """
    charge_days = Counter(days)
    return {
        "first_day": min(charge_days),
        "last_day": max(charge_days),
        "devices": len(per_device),
        "reports": len(days),
        "max_per_device": max(per_device.values(), default=0),  # 0: not counted
        "layers": batch_layers(per_device.values()),
        "untagged": len(days) - sum(per_device.values()),
        "epsilon_micro": terms.epsilon_micro.get(params, terms.max_epsilon_micro),
        "min_batch_devices": terms.min_devices,
        "params": params,
        "day": min(charge_days),
        "charge_days": {str(day): n for day, n in sorted(charge_days.items())},
    }


def _carry(
    engine: Engine,
    seal: InboxSeal,
    use_case: str,
    move: _Move,
    rows: int,
    today: int,
    proof: _Evidence | None,
) -> int:
    """Move a claimed batch in steps of at most ``rows`` reports; the last one publishes it.

    The steps are of equal size (within one report): a step's reports are stored together, so
    a copy of the database taken between two steps narrows the reports still waiting to the
    steps not yet moved, and none of those is ever a small remainder. Every step of the
    manifest is tried, also those another flush may have moved already (its delete then
    returns nothing), so after one pass every report of the batch has been moved by some
    committed transaction, and the batch is published, unless reports of it were deleted from
    the inbox by something other than the pipeline.
    """
    moved = 0
    n = len(move.ids)
    steps = -(-n // rows)
    for i in range(steps):
        chunk = move.ids[n * i // steps : n * (i + 1) // steps]
        with write_step(engine) as conn:
            moved += _move_chunk(conn, seal, use_case, move, chunk, today, proof)
    with engine.connect() as conn:
        left = conn.execute(
            select(_MOVES.c.moved).where(
                and_(_MOVES.c.use_case == use_case, _MOVES.c.batch == move.batch)
            )
        ).scalar_one_or_none()
    if left is not None:
        log.error(
            "flush of %s: %d of the batch's %d reports are missing from the inbox (deleted"
            " outside the service?); the batch stays unpublished and the use case's next"
            " batches wait: restore the database from its backup",
            use_case,
            n - int(left),
            n,
        )
    return moved


def _move_chunk(
    conn: Connection,
    seal: InboxSeal,
    use_case: str,
    move: _Move,
    chunk: np.ndarray,
    today: int,
    proof: _Evidence | None,
) -> int:
    """Move one step of a batch in ``conn``'s transaction; publish the batch if it was the last.

    Each report is opened (sealed rows) and stored under the batch's parameter set and day. A
    batch claimed by a release before 0009 (its record lists ``parts``) keeps each report's
    own charge day, as that release planned it. With ``proof``, a stored report is tagged if
    its inbox row's tag was right (over the bytes as stored, sealed or not).
    """
    ids = chunk.tolist()
    ph = placeholder(conn.engine)
    matches = f"IN ({', '.join([ph] * len(ids))})" if ph == "?" else f"= ANY({ph})"
    taken = conn.exec_driver_sql(  # no SQL compiled per step: the statement is the driver's
        f"DELETE FROM inbox WHERE id {matches}"
        " RETURNING id, params, day, payload, sealed, device_tag, tag",
        tuple(ids) if ph == "?" else (ids,),
    ).all()
    if not taken:
        return 0
    legacy = "parts" in move.record
    params, day = move.record.get("params"), move.record.get("day")
    right = [False] * len(taken) if proof is None else _tagged(proof, use_case, taken)
    values = []
    for row_id, row_params, row_day, payload, sealed, _, _ in taken:
        if sealed is not None:
            payload = (
                move.opened.get(int(row_id))
                or seal.open(int(row_id), use_case, str(row_params), int(row_day), sealed)[0]
            )
        if legacy:
            values.append((row_params, row_day, payload))
        elif row_params != params:
            raise InternalError(f"a batch of {use_case!r} holds reports of two parameter sets")
        else:
            values.append((params, day, payload))
    cursor = raw_cursor(conn)
    # 128-bit ids: a random 64-bit prefix for the step, then the report's place in the step's
    # CSPRNG order. They say no more than the store's own order (which step, which place), and
    # consecutive ids keep the step's inserts together in the id index (a few pages, not one a
    # report), as in the inbox.
    prefix = secrets.token_hex(8)
    stored = [
        (f"{prefix}{i:016x}", use_case, *values[k], move.batch, right[k])
        for i, k in enumerate(_csprng_order(len(values)).tolist())
    ]  # stored in a CSPRNG order, not the table's
    cursor.executemany(
        "INSERT INTO reports (id, use_case, params, day, payload, batch, tag)"
        f" VALUES ({ph}, {ph}, {ph}, {ph}, {ph}, {ph}, {ph})",
        [
            (*row[:6], proof.tags.report(*row[:6]) if proof is not None and row[6] else None)
            for row in stored
        ],
    )
    count = conn.execute(
        update(_MOVES)
        .where(and_(_MOVES.c.use_case == use_case, _MOVES.c.batch == move.batch))
        .values(moved=_MOVES.c.moved + len(taken))
        .returning(_MOVES.c.moved)
    ).scalar_one_or_none()
    if count is None:
        raise InternalError(f"a batch of {use_case!r} was published with reports still to move")
    if count == len(move.ids):
        _publish(conn, use_case, move, today, proof)
    return len(taken)


def _tagged(proof: _Evidence, use_case: str, rows: Sequence[Any]) -> list[bool]:
    """Which moved inbox rows are authentic; the others are logged (and stored untagged).

    ``rows`` are ``(id, params, day, payload, sealed, device tag, tag)``. A sealed row is
    authenticated by its seal (opening it in the move fails for one altered or moved); a clear
    row (queued before sealing) by its tag, over its payload and pseudonym.
    """
    check = proof.tags.check_inbox
    right = [r[4] is not None or check(r[0], use_case, r[1], r[2], r[3], r[5], r[6]) for r in rows]
    forged = sum(1 for r, ok in zip(rows, right, strict=True) if not ok and r[6] is not None)
    if forged:
        log.error(
            "flush of %s: %d inbox rows carry a tag that is not theirs (edited outside the"
            " service); they are stored untagged, and verify names them",
            use_case,
            forged,
        )
    return right


def _csprng_order(n: int) -> np.ndarray:
    """A uniformly random permutation of ``range(n)`` from the OS CSPRNG.

    The order of ``n`` independent 64-bit CSPRNG keys (a tie, probability below ``n^2 / 2^65``,
    keeps index order).

    >>> sorted(_csprng_order(5).tolist())
    [0, 1, 2, 3, 4]
    """
    keys = np.frombuffer(secrets.token_bytes(8 * n), dtype=np.uint64)
    return np.argsort(keys, kind="stable")


def _publish(
    conn: Connection, use_case: str, move: _Move, today: int, proof: _Evidence | None
) -> None:
    """Record the batch, hand its part to the fold and clear the claim (and its order).

    A batch claimed by a release before 0009 publishes its parts by charge day, as planned,
    and its record is marked ``split`` when it has several (what hid each report is unknown).
    With ``proof``, the batch's figures are also an audit entry, appended last.
    """
    record = move.record
    if "parts" in record:
        parts = [(p, d, n, {str(d): n}) for p, d, n in record["parts"]]
    else:
        parts = [(record["params"], record["day"], record["reports"], record["charge_days"])]
    figures = {
        k: v for k, v in record.items() if k not in ("parts", "params", "day", "charge_days")
    }
    conn.execute(
        _BATCHES.insert().values(
            use_case=use_case,
            day=today,
            split=len(parts) > 1,
            **{**figures, "layers": orjson.dumps(figures["layers"]).decode()},
        )
    )
    conn.execute(
        _PARTS.insert(),
        [
            {
                "batch": move.batch,
                "params": p,
                "day": d,
                "use_case": use_case,
                "reports": n,
                "folded": False,
                "charge_days": orjson.dumps(days).decode(),
            }
            for p, d, n, days in parts
        ],
    )
    conn.execute(
        update(_MOVES)
        .where(and_(_MOVES.c.use_case == use_case, _MOVES.c.batch == move.batch))
        .values(batch=None, moved=0)
    )
    conn.execute(delete(_ORDERS).where(_ORDERS.c.batch == move.batch))
    if proof is not None:  # what verify compares shuffled_batches with
        data = {"use_case": use_case, "day": today, **figures}
        proof.audit.append(conn, [Entry("job:flush-inbox", "batch.publish", data)], now=proof.at)

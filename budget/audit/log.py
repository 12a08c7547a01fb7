"""The tamper-evident audit log: every charge decision, policy change and purge, hash-chained.

Each entry is one row: sequence number, UTC time, actor (``device:<key>``, ``admin``,
``system`` or ``job:<name>``), action, and ``body``, the canonical JSON (sorted keys, no spaces)
of all of those plus the action's data (never a report payload). ``hash`` is
``SHA-256(previous hash || body)``, so anyone holding an export can check the chain; ``tag`` is
``HMAC-SHA256(audit key, hash)`` with a key kept outside the database, so a chain recomputed by
someone who can write the database but not read the key fails too. Entries are appended in the
transaction of what they record, under the single ``audit_head`` row (``FOR UPDATE`` on
PostgreSQL; SQLite's write lock is already held), so concurrent appends get consecutive numbers
and one chain. The database refuses UPDATE, DELETE and TRUNCATE on the log (triggers).

A scheduled checkpoint stores ``(seq, hash, time)`` signed with the audit key and chained to the
previous checkpoint's signature, so a truncated tail (entries deleted after a checkpoint) is
detected as well. :meth:`AuditLog.verify` checks all of it and names the first bad entry.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import itertools
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

import orjson
from sqlalchemy import Connection, Engine, func, select, text

from dp_governor.budget.audit.checkpoints import (
    Checkpoint,
    CheckpointFile,
    CheckpointFileError,
    last_kept_seq,
    read_checkpoints,
    write_checkpoints,
)
from dp_governor.budget.keyed import KeyedHash
from dp_governor.budget.storage.db import placeholder, raw_cursor, write_step, writer
from dp_governor.budget.storage.tables import GENESIS, AuditCheckpoint, AuditEntry, AuditHead

__all__ = [
    "AuditLog",
    "Checkpoint",
    "CheckpointFile",
    "CheckpointFileError",
    "Entry",
    "Verification",
    "chain_hash",
    "derive_audit_key",
    "idempotency_hash",
    "last_kept_seq",
    "read_checkpoints",
    "record_digest",
    "write_checkpoints",
]

_LOG = AuditEntry.__table__  # type: ignore[attr-defined]
_HEAD = AuditHead.__table__  # type: ignore[attr-defined]
_CHECKPOINTS = AuditCheckpoint.__table__  # type: ignore[attr-defined]
_CHECKPOINT_PAGE = 5_000  # checkpoints read at a time: memory is a page, not the history


class Entry(NamedTuple):
    """What to append: who did what, with the action's data.

    ``data`` is a JSON-serialisable dict, or a str holding that dict's canonical JSON already
    (sorted keys, no spaces; :func:`dp_governor.budget.gate.charge.charge_entry` formats a charge's
    from a template, since a relay's batch appends one entry per report).
    """

    actor: str
    action: str
    data: dict[str, Any] | str


@dataclass(frozen=True, slots=True)
class Verification:
    """The result of checking the chain, its tags and its checkpoints.

    ``first_bad`` is the first entry that fails (for a chain recomputed up to a checkpoint:
    the checkpoint's entry; the change lies after the previous good checkpoint). ``from_seq``
    is the signed checkpoint the check started after (0: none); ``entries`` counts the entries
    it accepted after it: entries ``from_seq + 1`` to ``from_seq + entries``, 1-based.
    """

    ok: bool
    entries: int
    head_seq: int
    head_hash: str
    checkpoints: int
    latest_checkpoint_seq: int | None
    latest_checkpoint_at: str | None
    first_bad: int | None = None
    problem: str | None = None
    state_checked: bool = False
    note: str | None = None
    kept_checkpoints: int = 0
    from_seq: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return asdict(self)


def idempotency_hash(audit_key: bytes) -> KeyedHash:
    """The keyed hash of idempotency records' digests (a key derived from the audit key)."""
    return KeyedHash(hmac.digest(audit_key, _IDEMPOTENCY_LABEL, "sha256"))


def record_digest(keyed: KeyedHash, dk: str, key: str, fingerprint: str) -> str:
    """An idempotency record's digest (:meth:`AuditLog.idempotency_digest`), 128 bits, hex."""
    return keyed.digest(f"{dk}\0{key}\0{fingerprint}".encode()).hex()[:32]


def derive_audit_key(secret: bytes) -> bytes:
    """An audit key derived from the device-key secret (when no separate key is configured)."""
    return hmac.digest(secret, b"dp-governor/audit-key/v1", "sha256")


_SORTED = orjson.OPT_SORT_KEYS
_IDEMPOTENCY_LABEL = b"dp-governor/idempotency-record/v1"


def chain_hash(prev_hash: str, body: str) -> str:
    """``SHA-256(bytes of the previous hash || UTF-8 body)``, hex."""
    return hashlib.sha256(bytes.fromhex(prev_hash) + body.encode("utf-8")).hexdigest()


def canonical_body(seq: int, at: str, actor: str, action: str, data: dict[str, Any] | str) -> str:
    """The hashed text of an entry: canonical JSON of every field (sorted keys, no spaces).

    Formatted around the encoded parts rather than encoding a wrapper dict (the same text, as a
    test checks against ``orjson``); ``data`` may be canonical JSON already (see :class:`Entry`).
    """
    encoded = data if isinstance(data, str) else orjson.dumps(data, option=_SORTED).decode()
    return (
        f'{{"action":{_text(action)},"actor":{_text(actor)},"at":{_text(at)},'
        f'"data":{encoded},"seq":{int(seq)}}}'
    )


def _text(value: str) -> str:
    """A JSON string literal, as ``orjson`` writes it."""
    return orjson.dumps(value).decode()


def timestamp(now: datetime) -> str:
    """The entry time format: UTC, ISO 8601, microseconds."""
    return now.astimezone(UTC).isoformat(timespec="microseconds")


def _columns_match(seq: int, at: str, actor: str, action: str, body: str) -> bool:
    """Whether the unhashed columns say what the hashed body says.

    The service writes canonical bodies, so plain text needs only a prefix and suffix check;
    anything with characters JSON escapes (or any mismatch) is decided by parsing the body.
    """
    if '"' not in actor + action + at and "\\" not in actor + action + at:
        prefix = f'{{"action":"{action}","actor":"{actor}","at":"{at}","data":'
        if body.startswith(prefix) and body.endswith(f',"seq":{seq}}}'):
            return True
    try:
        content = orjson.loads(body)
        return bool(
            (content["seq"], content["at"], content["actor"], content["action"])
            == (seq, at, actor, action)
        )
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return False


class AuditLog:
    """Appends to, checkpoints and verifies the log of one database."""

    def __init__(self, engine: Engine, key: bytes) -> None:
        if len(key) < 32:
            raise ValueError("the audit key must be at least 32 bytes")
        self.engine = engine
        self._mac = hmac.new(key, digestmod="sha256")
        self._keyed = KeyedHash(key)  # a tag per entry: what lets verify check 1e6 in seconds
        self._idem = idempotency_hash(key)
        self._postgres = engine.dialect.name == "postgresql"
        ph = placeholder(engine)
        self._insert = (
            "INSERT INTO audit_log (seq, at, actor, action, body, prev_hash, hash, tag)"
            f" VALUES ({', '.join([ph] * 8)})"
        )
        self._head = "SELECT seq, hash FROM audit_head WHERE id = 1" + (
            " FOR UPDATE" if self._postgres else ""
        )
        self._move = f"UPDATE audit_head SET seq = {ph}, hash = {ph} WHERE id = 1"

    def tag(self, entry_hash: str) -> str:
        """``HMAC-SHA256(audit key, hash)``, hex."""
        return self._keyed.digest(entry_hash.encode("ascii")).hex()

    def idempotency_digest(self, dk: str, key: str, fingerprint: str) -> str:
        """What a charge entry records of its idempotency record (128 bits, hex).

        A keyed hash of the record's device, stored key and request fingerprint (themselves
        keyed by the device secret), under a key derived from the audit key: ``verify`` can
        tell the table's records from the ones the chain recorded, and the log reveals no key.
        """
        return record_digest(self._idem, dk, key, fingerprint)

    def append(self, conn: Connection, entries: Sequence[Entry], *, now: datetime) -> int:
        """Append ``entries`` in the caller's transaction, in order; returns the last seq.

        Call it last in the transaction: the head row stays locked until commit.
        """
        if not entries:
            return -1
        at = timestamp(now)
        cur = raw_cursor(conn)
        cur.execute(self._head)
        seq, head = cur.fetchone()
        seq = int(seq)
        rows = []
        running = bytes.fromhex(head)
        sha256, tag = hashlib.sha256, self.tag
        at_text = _text(at)  # one time and a few actions: each encoded once a batch
        actions: dict[str, str] = {}
        for actor, action, data in entries:
            seq += 1
            act = actions.get(action)
            if act is None:
                act = actions[action] = _text(action)
            encoded = data if isinstance(data, str) else orjson.dumps(data, option=_SORTED).decode()
            body = (  # canonical_body's text, its constant parts encoded once
                f'{{"action":{act},"actor":{_text(actor)},"at":{at_text},'
                f'"data":{encoded},"seq":{seq}}}'
            )
            running = sha256(running + body.encode("utf-8")).digest()  # chain_hash, bytes kept
            new = running.hex()
            rows.append((seq, at, actor, action, body, head, new, tag(new)))
            head = new
        cur.executemany(self._insert, rows)
        cur.execute(self._move, (seq, head))
        return seq

    def record(self, actor: str, action: str, data: dict[str, Any], *, now: datetime) -> int:
        """Append one entry in a transaction of its own."""
        with writer(self.engine).begin() as conn:
            return self.append(conn, [Entry(actor, action, data)], now=now)

    # -- checkpoints -----------------------------------------------------------------------------

    def _signature(self, seq: int, entry_hash: str, at: str, previous: str) -> str:
        mac = self._mac.copy()
        mac.update(f"checkpoint:{seq}:{entry_hash}:{at}:{previous}".encode("ascii"))
        return mac.hexdigest()

    def checkpoint(self, *, now: datetime) -> Checkpoint | None:
        """Sign the current head (``None`` when nothing was appended since the last one).

        With nothing new, two indexed reads and no write transaction: an idle run is cheap.
        """
        latest = self.latest_checkpoint()
        if self.head()[0] == (0 if latest is None else latest.seq):
            return None
        at = timestamp(now)
        with write_step(self.engine) as conn:  # a job's transaction: bounded wait, fenced
            seq, head = conn.execute(text(self._head)).one()
            last = conn.execute(
                select(_CHECKPOINTS).order_by(_CHECKPOINTS.c.seq.desc()).limit(1)
            ).first()
            if seq == 0 or (last is not None and last.seq == seq):
                return None
            previous = last.signature if last is not None else GENESIS
            point = Checkpoint(int(seq), head, at, self._signature(int(seq), head, at, previous))
            conn.execute(
                _CHECKPOINTS.insert().values(
                    seq=point.seq, hash=point.hash, at=point.at, signature=point.signature
                )
            )
            return point

    def _chain_problem(
        self, points: Iterable[Checkpoint], previous: str, what: str, *, since: int = 0
    ) -> tuple[int, int, tuple[int, str] | None]:
        """Stream ``points``, each signed chained to the one before: ``(count, last seq, problem)``.

        ``previous`` is the signature the first chains to; ``what`` words a bad one (``{seq}``).
        Points before ``since`` (an incremental check's start) are counted, not checked.
        """
        n = last = 0
        for point in points:
            if point.seq <= last:
                return n, last, (point.seq, f"{what.format(seq=point.seq)} is out of order")
            if point.seq < since:
                previous, last, n = point.signature, point.seq, n + 1
                continue
            signature = self._signature(point.seq, point.hash, point.at, previous)
            if not hmac.compare_digest(point.signature, signature):
                return n, last, (point.seq, f"{what.format(seq=point.seq)} has a bad signature")
            previous, last, n = point.signature, point.seq, n + 1
        return n, last, None

    def checkpoints(self) -> list[Checkpoint]:
        """All checkpoints, oldest first (for tools and tests: the service streams them)."""
        return list(self.iter_checkpoints())

    def iter_checkpoints(
        self, *, after: int = 0, through: int | None = None
    ) -> Iterator[Checkpoint]:
        """The checkpoints of entries in ``(after, through]``, oldest first, a page at a time.

        Keyset pages of :data:`_CHECKPOINT_PAGE` rows, so memory stays one page however many
        checkpoints the log holds (tens of thousands a day at a checkpoint every few seconds).
        """
        c = _CHECKPOINTS.c
        last = after
        while True:
            query = select(_CHECKPOINTS).where(c.seq > last).order_by(c.seq)
            if through is not None:
                query = query.where(c.seq <= through)
            with self.engine.connect() as conn:
                rows = conn.execute(query.limit(_CHECKPOINT_PAGE)).all()
            for r in rows:
                yield Checkpoint(int(r.seq), r.hash, r.at, r.signature)
            if len(rows) < _CHECKPOINT_PAGE:
                return
            last = int(rows[-1].seq)

    def _checkpoint_before(self, seq: int) -> Checkpoint | None:
        """The newest checkpoint of an entry before ``seq`` (``None``: none), one indexed row."""
        c = _CHECKPOINTS.c
        with self.engine.connect() as conn:
            r = conn.execute(
                select(_CHECKPOINTS).where(c.seq < seq).order_by(c.seq.desc()).limit(1)
            ).first()
        return None if r is None else Checkpoint(int(r.seq), r.hash, r.at, r.signature)

    def latest_checkpoint(self) -> Checkpoint | None:
        """The newest checkpoint (``None``: none signed yet), one indexed row."""
        with self.engine.connect() as conn:
            r = conn.execute(
                select(_CHECKPOINTS).order_by(_CHECKPOINTS.c.seq.desc()).limit(1)
            ).first()
        return None if r is None else Checkpoint(int(r.seq), r.hash, r.at, r.signature)

    def checkpoint_count(self) -> int:
        """How many checkpoints the database holds (counted by the database, none read)."""
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(_CHECKPOINTS)).scalar_one())

    # -- reading and verifying -------------------------------------------------------------------

    def head(self) -> tuple[int, str]:
        """``(seq, hash)`` of the last entry as the head row says."""
        with self.engine.connect() as conn:
            seq, head = conn.execute(select(_HEAD.c.seq, _HEAD.c.hash)).one()
        return int(seq), str(head)

    def rows(self, *, after: int = 0, limit: int | None = None) -> Generator[tuple[Any, ...]]:
        """Raw rows ``(seq, at, actor, action, body, prev_hash, hash, tag)`` in order, streamed."""
        with self.engine.connect() as conn:
            query = (
                select(
                    _LOG.c.seq,
                    _LOG.c.at,
                    _LOG.c.actor,
                    _LOG.c.action,
                    _LOG.c.body,
                    _LOG.c.prev_hash,
                    _LOG.c.hash,
                    _LOG.c.tag,
                )
                .where(_LOG.c.seq > after)
                .order_by(_LOG.c.seq)
            )
            if limit is not None:
                query = query.limit(limit)
            with conn.execution_options(yield_per=10_000).execute(query) as result:
                for row in result:
                    yield tuple(row)

    def _pages(self, size: int = 20_000, *, after: int = 0) -> Generator[list[tuple[Any, ...]]]:
        """The entries after ``after`` in order, a page at a time (keyset pagination)."""
        ph = placeholder(self.engine)
        sql = (
            "SELECT seq, at, actor, action, body, prev_hash, hash, tag FROM audit_log"
            f" WHERE seq > {ph} ORDER BY seq LIMIT {int(size)}"
        )
        last = after
        with self.engine.connect() as conn:
            cur = raw_cursor(conn)
            while True:
                cur.execute(sql, (last,))
                page = cur.fetchall()
                if not page:
                    return
                yield page
                last = page[-1][0]

    def verify(
        self,
        *,
        external: Iterable[Checkpoint] = (),
        observe: Callable[[int, str, str, str], None] | None = None,
        start: Checkpoint | None = None,
        before: Iterable[Sequence[tuple[Any, ...]]] = (),
    ) -> Verification:
        """Check every entry, the head row and every checkpoint; stop at the first failure.

        ``start``, a signed checkpoint an earlier verification reached, makes the check
        incremental: ``start`` must be the database's checkpoint at its entry, its signature
        chained to the checkpoint before it, and that entry must hash (and tag) to what it
        signs; then only the entries and checkpoints after it are checked. Entries and
        checkpoints before it are left to a full check (without ``start``), as entries were.
        Checkpoints are streamed a page at a time: memory does not grow with their number.

        ``external`` are checkpoints kept outside the database, oldest first, iterated more
        than once (a sequence, or a :class:`CheckpointFile` that re-reads its file): each must
        carry the audit key's signature, chained as the database's are, and name an entry the
        log still holds with the same hash, so a log truncated back to any earlier
        checkpoint (its later checkpoints deleted with it) is caught. ``observe`` is called
        with ``(seq, actor, action, body)`` of each entry once it is verified (the state check
        replays them, :mod:`dp_governor.budget.audit.verify`). ``before``, with no ``start``:
        pages of archived entries (:mod:`dp_governor.budget.audit.archive`), replayed first as
        if the log held them, the log's own entries continuing after the last.
        """
        since = 0 if start is None else start.seq
        if since and isinstance(external, CheckpointFile):
            external = external.after(since)  # the kept copy from the start on, bisected
        kept_n, kept_last, problem = self._chain_problem(
            external, GENESIS, "the kept checkpoint at entry {seq}", since=since
        )
        if problem is not None:
            seq, message = problem
            head_seq, head_hash = self.head()
            return Verification(False, 0, head_seq, head_hash, 0, None, None, seq, message)
        latest = self.latest_checkpoint()
        count = self.checkpoint_count()
        head_seq, head_hash = self.head()
        n = 0
        expected_seq = 0
        running = GENESIS

        def result(first_bad: int | None = None, problem: str | None = None) -> Verification:
            return Verification(
                ok=problem is None,
                entries=n,
                head_seq=expected_seq,
                head_hash=running,
                checkpoints=count,
                latest_checkpoint_seq=latest.seq if latest else None,
                latest_checkpoint_at=latest.at if latest else None,
                first_bad=first_bad,
                problem=problem,
                kept_checkpoints=kept_n,
                from_seq=since,
            )

        # the database's checkpoints, streamed: from the first, or (incremental) from the one
        # before the start, whose signature the start's chains to
        prior = None if start is None else self._checkpoint_before(start.seq)
        _, _, problem = self._chain_problem(
            self.iter_checkpoints(after=0 if prior is None else prior.seq),
            GENESIS if prior is None else prior.signature,
            "checkpoint at entry {seq}",
        )
        if problem is not None:
            return result(*problem)
        for seq, known, copy in _merged(self.iter_checkpoints(after=max(since - 1, 0)), external):
            if seq >= since and known is not None and copy is not None and known != copy:
                return result(seq, f"the checkpoint at entry {seq} differs from the copy kept")
        last_signed = max(latest.seq if latest else 0, kept_last)
        tag_of = self.tag
        sha256 = hashlib.sha256
        if start is not None:
            stored = next(self.iter_checkpoints(after=start.seq - 1, through=start.seq), None)
            wrong = self._start_problem(start, stored)
            if wrong is not None:
                return result(start.seq, wrong)
            expected_seq, running = start.seq, start.hash
        signed = _merged(self.iter_checkpoints(after=since), external)
        next_signed = next(signed, None)
        running_bytes = bytes.fromhex(running)

        def pages() -> Iterator[Sequence[tuple[Any, ...]]]:
            yield from before
            yield from self._pages(after=expected_seq)  # after the archived entries, if any

        for page in pages():
            for seq, at, actor, action, body, prev_hash, entry_hash, tag in page:
                expected_seq += 1
                if seq != expected_seq:
                    return result(expected_seq, f"entry {expected_seq} is missing (next is {seq})")
                if prev_hash != running:
                    return result(seq, f"entry {seq} does not link to entry {seq - 1}")
                digest = sha256(running_bytes + body.encode("utf-8")).digest()
                if digest.hex() != entry_hash:
                    return result(seq, f"entry {seq}'s hash does not match its body")
                if not hmac.compare_digest(tag_of(entry_hash), tag):
                    return result(
                        seq, f"entry {seq}'s tag is not the audit key's (chain rewritten)"
                    )
                if not _columns_match(seq, at, actor, action, body):
                    return result(seq, f"entry {seq}'s columns disagree with its hashed body")
                while next_signed is not None and next_signed[0] < seq:
                    next_signed = next(signed, None)
                if next_signed is not None and next_signed[0] == seq:
                    _, known, copy = next_signed
                    if entry_hash != (known if known is not None else copy):
                        return result(
                            seq, f"entry {seq} differs from the signed checkpoint at {seq}"
                        )
                running = entry_hash
                running_bytes = digest
                n += 1
                if observe is not None:
                    observe(seq, actor, action, body)
        if last_signed > expected_seq:
            return result(
                expected_seq + 1,
                f"the log ends at entry {expected_seq} but a checkpoint signed entry"
                f" {last_signed}: the tail was truncated",
            )
        if (head_seq, head_hash) != (expected_seq, running):
            return result(
                min(head_seq, expected_seq) + 1,
                f"the head row says entry {head_seq} but the log ends at entry {expected_seq}",
            )
        return result()

    def _start_problem(self, start: Checkpoint, stored: Checkpoint | None) -> str | None:
        """Why an incremental check cannot start at ``start`` (``None``: it can).

        The checkpoint must be the database's (whose signatures were just checked) and its
        entry must still be the one it signs: body, hash and tag.
        """
        if stored is None or stored != start:
            return (
                f"the signed checkpoint at entry {start.seq}, where the last verification"
                " stopped, is missing or was changed"
            )
        row = next(self.rows(after=start.seq - 1, limit=1), None)
        if row is None or int(row[0]) != start.seq:
            return f"entry {start.seq}, signed by the checkpoint verification starts at, is gone"
        seq, at, actor, action, body, prev_hash, entry_hash, tag = row
        if (
            entry_hash != start.hash
            or chain_hash(prev_hash, body) != entry_hash
            or not hmac.compare_digest(self.tag(entry_hash), tag)
            or not _columns_match(seq, at, actor, action, body)
        ):
            return (
                f"entry {seq} differs from the signed checkpoint at {seq}, where the"
                " verification starts (rewritten)"
            )
        return None


def _merged(
    stored: Iterable[Checkpoint], kept: Iterable[Checkpoint]
) -> Iterator[tuple[int, str | None, str | None]]:
    """``(seq, stored hash, kept hash)`` of two ascending streams of checkpoints, merged by seq."""
    tagged = heapq.merge(((p.seq, 0, p.hash) for p in stored), ((p.seq, 1, p.hash) for p in kept))
    for seq, group in itertools.groupby(tagged, key=lambda t: t[0]):
        hashes: list[str | None] = [None, None]
        for _, side, digest in group:
            hashes[side] = digest
        yield seq, hashes[0], hashes[1]

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
import hmac
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import orjson
from sqlalchemy import Connection, Engine, select, text

from dp_governor.budget.keyed import KeyedHash
from dp_governor.budget.storage.db import placeholder, write_step, writer
from dp_governor.budget.storage.files import open_private
from dp_governor.budget.storage.tables import GENESIS, AuditCheckpoint, AuditEntry, AuditHead

__all__ = [
    "AuditLog",
    "Checkpoint",
    "CheckpointFileError",
    "Entry",
    "Verification",
    "chain_hash",
    "derive_audit_key",
    "idempotency_hash",
    "read_checkpoints",
    "record_digest",
    "write_checkpoints",
]

_LOG = AuditEntry.__table__  # type: ignore[attr-defined]
_HEAD = AuditHead.__table__  # type: ignore[attr-defined]
_CHECKPOINTS = AuditCheckpoint.__table__  # type: ignore[attr-defined]


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
class Checkpoint:
    """A signed head."""

    seq: int
    hash: str
    at: str
    signature: str


@dataclass(frozen=True, slots=True)
class Verification:
    """The result of checking the chain, its tags and its checkpoints.

    ``first_bad`` is the first entry that fails (for a chain recomputed up to a checkpoint:
    the checkpoint's entry; the change lies after the previous good checkpoint). ``from_seq``
    is the signed checkpoint the check started at (0: the first entry); ``entries`` counts
    the entries after it.
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
        cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
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
        """Sign the current head (``None`` when nothing was appended since the last one)."""
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

    def _check_signatures(self, points: Sequence[Checkpoint]) -> tuple[int, str] | None:
        """The first external checkpoint whose signature is not the audit key's, or ``None``."""
        previous = GENESIS
        for point in sorted(points, key=lambda p: p.seq):
            signature = self._signature(point.seq, point.hash, point.at, previous)
            if not hmac.compare_digest(point.signature, signature):
                return point.seq, f"the kept checkpoint at entry {point.seq} has a bad signature"
            previous = point.signature
        return None

    def checkpoints(self) -> list[Checkpoint]:
        """All checkpoints, oldest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(_CHECKPOINTS).order_by(_CHECKPOINTS.c.seq)).all()
        return [Checkpoint(int(r.seq), r.hash, r.at, r.signature) for r in rows]

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
            cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
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
        external: Sequence[Checkpoint] = (),
        observe: Callable[[int, str, str, str], None] | None = None,
        start: Checkpoint | None = None,
        before: Iterable[Sequence[tuple[Any, ...]]] = (),
    ) -> Verification:
        """Check every entry, the head row and every checkpoint; stop at the first failure.

        ``start``, a signed checkpoint an earlier verification reached, makes the check
        incremental: every checkpoint's signature is still checked, ``start`` must be the
        database's checkpoint at its entry and that entry must hash (and tag) to what it signs;
        then only the entries after it are replayed. Entries before it are not read (a full
        check, without ``start``, does).

        ``external`` are checkpoints kept outside the database (:func:`read_checkpoints`):
        each must carry the audit key's signature, chained as the database's are, and name an
        entry the log still holds with the same hash, so a log truncated back to any earlier
        checkpoint (its later checkpoints deleted with it) is caught. ``observe`` is called
        with ``(seq, actor, action, body)`` of each entry once it is verified (the state check
        replays them, :mod:`dp_governor.budget.audit.verify`). ``before``, with no ``start``:
        pages of archived entries (:mod:`dp_governor.budget.audit.archive`), replayed first as
        if the log held them, the log's own entries continuing after the last.
        """
        problem = self._check_signatures(external)
        if problem is not None:
            seq, message = problem
            head_seq, head_hash = self.head()
            return Verification(False, 0, head_seq, head_hash, 0, None, None, seq, message)
        points = self.checkpoints()
        head_seq, head_hash = self.head()
        by_seq: dict[int, Checkpoint] = {}
        previous = GENESIS
        n = 0
        expected_seq = 0
        running = GENESIS

        def result(first_bad: int | None = None, problem: str | None = None) -> Verification:
            latest = points[-1] if points else None
            return Verification(
                ok=problem is None,
                entries=n,
                head_seq=expected_seq,
                head_hash=running,
                checkpoints=len(points),
                latest_checkpoint_seq=latest.seq if latest else None,
                latest_checkpoint_at=latest.at if latest else None,
                first_bad=first_bad,
                problem=problem,
                kept_checkpoints=len(external),
                from_seq=0 if start is None else start.seq,
            )

        for point in points:
            if not hmac.compare_digest(
                point.signature, self._signature(point.seq, point.hash, point.at, previous)
            ):
                return result(point.seq, f"checkpoint at entry {point.seq} has a bad signature")
            previous = point.signature
            by_seq[point.seq] = point
        kept = {p.seq: p for p in external}
        for seq, point in kept.items():
            known = by_seq.get(seq)
            if known is not None and known.hash != point.hash:
                return result(seq, f"the checkpoint at entry {seq} differs from the copy kept")
            by_seq.setdefault(seq, point)
        last_signed = max(by_seq, default=0)
        tag_of = self.tag
        sha256 = hashlib.sha256
        if start is not None:
            stored = next((p for p in points if p.seq == start.seq), None)
            wrong = self._start_problem(start, stored)
            if wrong is not None:
                return result(start.seq, wrong)
            expected_seq, running = start.seq, start.hash
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
                signed = by_seq.get(seq)
                if signed is not None and signed.hash != entry_hash:
                    return result(seq, f"entry {seq} differs from the signed checkpoint at {seq}")
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


class CheckpointFileError(ValueError):
    """The checkpoint file kept outside the database cannot be read as checkpoints.

    Torn by a crash mid-append, not UTF-8, a folder, unreadable: ``verify`` fails naming it
    (a copy that cannot be read protects nothing) and the checkpoint job appends nothing to it.
    """

    def __init__(self, path: Path, cause: str) -> None:
        self.path = path
        self.cause = cause
        super().__init__(f"checkpoint file unreadable: {path}: {cause}")


def write_checkpoints(points: Iterable[Checkpoint], path: Path) -> int:
    """Append ``points`` to ``path`` as JSON lines (a copy kept outside the database).

    Points the file already holds are skipped; returns how many were added. The file is
    created with mode 0600 (:func:`dp_governor.budget.storage.files.open_private`). Raises
    :class:`CheckpointFileError`, appending nothing, when the file cannot be read.
    """
    held = {p.seq for p in read_checkpoints(path)} if path.exists() else set()
    added = [p for p in points if p.seq not in held]
    if added:
        try:
            with open_private(path, "a") as out:
                for p in sorted(added, key=lambda p: p.seq):
                    out.write(orjson.dumps(asdict(p)).decode() + "\n")
        except OSError as exc:
            raise CheckpointFileError(path, exc.strerror or type(exc).__name__) from None
    return len(added)


def read_checkpoints(path: Path) -> list[Checkpoint]:
    """The checkpoints of a file written by :func:`write_checkpoints`, oldest first.

    Raises :class:`CheckpointFileError` for a file that cannot be read (missing included) or
    holds a line that is not a checkpoint (naming the line).
    """
    points: list[Checkpoint] = []
    try:
        with path.open(encoding="utf-8") as handle:
            for n, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    data = orjson.loads(line)
                    points.append(
                        Checkpoint(
                            int(data["seq"]),
                            str(data["hash"]),
                            str(data["at"]),
                            str(data["signature"]),
                        )
                    )
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                    raise CheckpointFileError(
                        path, f"line {n} is not a checkpoint ({exc})"
                    ) from None
    except UnicodeDecodeError as exc:
        raise CheckpointFileError(path, f"not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise CheckpointFileError(path, exc.strerror or type(exc).__name__) from None
    return sorted(points, key=lambda p: p.seq)

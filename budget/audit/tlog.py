"""The public transparency log: the audit log as an RFC 9162 Merkle tree with signed checkpoints.

Leaf ``i`` is the public projection of audit entry ``i + 1``
(:func:`~dp_governor.budget.audit.leaves.leaf_of`), so the log is not a second record beside
the audit chain but a view of it that outsiders can check: the gate appends the audit entry in
the charge's transaction, and the checkpoint job (:meth:`TransparencyLog.sync`) projects the
new entries, stores the leaves and the tree as its C2SP tiles (``tlog_tiles``: 256 subtree
hashes a row, so any inclusion or consistency proof reads a few rows per 8 levels and hashes
up the rest), and signs a C2SP ``tlog-checkpoint`` with the log's Ed25519 key.
:meth:`TransparencyLog.verify` checks that every leaf is its entry's projection, every stored
tile the leaves' hashes and every signed checkpoint the root of the leaves.

What a leaf shows, and the labels that hide its device: :mod:`dp_governor.budget.audit.leaves`.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, inspect, text

from dp_governor.budget.audit.leaves import LabelKeys, device_label_key, project
from dp_governor.budget.storage.db import insert_rows, placeholder, raw_cursor, write_step
from dp_governor.mechanisms.merkle import (
    Frontier,
    NodeReader,
    consistency_proof,
    encode_hashes,
    inclusion_proof,
    leaf_hash,
)
from dp_governor.mechanisms.signed_note import Checkpoint, Signer, Verifier, sign_note
from dp_governor.mechanisms.tiles import (
    TILE_HEIGHT,
    TILE_WIDTH,
    TileFrontier,
    TilePath,
    partial_tiles,
    tile_reader,
)

__all__ = [
    "DEFAULT_ORIGIN",
    "Receipt",
    "SignedCheckpoint",
    "TlogVerification",
    "TransparencyLog",
]

log = logging.getLogger("dpgov.tlog")

DEFAULT_ORIGIN = "dp-governor.invalid/tlog"
_PAGE = 20_000
_CHUNK = 1_000
_POINTS = 5_000  # the checkpoints verify holds at a time
_STEP_ENTRIES = 500
"""One sync step's most entries: its store holds SQLite's write lock about 8 ms (15 us each)."""
STEP_SECONDS = 1.0
"""The longest one step of :meth:`TransparencyLog.sync` computes before it stores and signs."""


@dataclass(frozen=True, slots=True)
class SignedCheckpoint:
    """A signed checkpoint as stored: size, root and the signed note."""

    size: int
    root: bytes
    note: str


@dataclass(frozen=True, slots=True)
class _Step:
    """One step of a sync, computed outside the write lock: the rows to store and the note."""

    start: int
    leaves: list[tuple[int, str | None, str]]
    tiles: list[tuple[int, int, bytes]]
    point: SignedCheckpoint


@dataclass(frozen=True, slots=True)
class Receipt:
    """An inclusion receipt: the leaf, its index, the audit path and the signed checkpoint."""

    index: int
    leaf: bytes
    proof: list[bytes]
    checkpoint: str

    def to_dict(self) -> dict[str, Any]:
        """The receipt as the wire carries it (the leaf as text, hashes in base64)."""
        return {
            "index": self.index,
            "leaf": self.leaf.decode(),
            "proof": encode_hashes(self.proof),
            "checkpoint": self.checkpoint,
        }


@dataclass(frozen=True, slots=True)
class TlogVerification:
    """The result of checking the transparency log against the audit log."""

    ok: bool
    leaves: int
    checkpoints: int
    problem: str | None = None
    edge: tuple[bytes, ...] = ()  # the tree's right edge at ``leaves`` (where the next run starts)
    nodes: int = 0  # the subtree hashes the leaves make, all of them


class TransparencyLog:
    """Projects the audit log into the Merkle tree, signs checkpoints, serves proofs."""

    def __init__(self, engine: Engine, audit_key: bytes, *, origin: str = DEFAULT_ORIGIN) -> None:
        self.engine = engine
        self.label_secret = hmac.digest(audit_key, b"dp-governor/tlog-label/v1", "sha256")
        seed = hmac.digest(audit_key, b"dp-governor/tlog-signing-key/v1", "sha256")
        self.signer = Signer(origin, seed)
        self._ph = placeholder(engine)

    @property
    def origin(self) -> str:
        """The log's origin line, also its key's name."""
        return self.signer.name

    @property
    def verifier(self) -> Verifier:
        """The log's public key (publish its :meth:`Verifier.vkey`)."""
        return self.signer.verifier

    def label_key(self, dk: str) -> bytes:
        """The device label key of the device with pseudonym ``dk``."""
        return device_label_key(self.label_secret, dk)

    # -- appending -------------------------------------------------------------------------------

    def _size(self, conn: Connection) -> int:
        found = conn.execute(text("SELECT max(idx) FROM tlog_leaves")).scalar()
        return 0 if found is None else int(found) + 1

    def tile(self, conn: Connection, level: int, index: int) -> bytes:
        """The stored hashes of tile ``index`` at ``level`` (empty if none is stored)."""
        sql = text("SELECT hashes FROM tlog_tiles WHERE level = :level AND idx = :idx")
        found = conn.execute(sql, {"level": level, "idx": index}).scalar()
        return b"" if found is None else bytes(found)

    def _reader(self, conn: Connection, size: int) -> NodeReader:
        """The ``node`` callback of the tree of ``size`` leaves, from the stored tiles."""

        def fetch(tile: TilePath) -> bytes:
            return self.tile(conn, tile.level or 0, tile.index)[: tile.width * 32]

        return tile_reader(size, fetch)

    def sync(self, *, limit: int | None = None) -> SignedCheckpoint | None:
        """Project every new audit entry into the tree and sign the new head, step by step.

        Each step reads new entries and computes their leaves, the tiles they fill and the signed
        checkpoint outside any write lock, for at most :data:`STEP_SECONDS` or
        :data:`_STEP_ENTRIES` entries, then stores them in one short job transaction (about 8 ms on
        SQLite: reports waiting for its one writer wait about that long). A step stores its
        checkpoint when :data:`STEP_SECONDS` have passed since the run's last one, or when it
        read all there was; the run's last checkpoint is always stored. So a log catching up on
        a backlog signs about once a second, not once at the end, and not once a step.
        ``limit`` caps the entries (for tests and for a job that must yield); returns the
        newest checkpoint signed, or ``None`` when the log already covered the audit log.
        """
        signed = None
        unstored: SignedCheckpoint | None = None  # the run's newest checkpoint, if not stored
        done = 0
        last = time.monotonic()
        while limit is None or done < limit:
            page = _STEP_ENTRIES if limit is None else min(_STEP_ENTRIES, limit - done)
            began = time.monotonic()
            step = self._prepare(page)
            if step is None:
                break
            prepared = time.monotonic()
            due = step.point.size - step.start < page or prepared - last >= STEP_SECONDS
            with write_step(self.engine) as conn:
                if self._size(conn) != step.start:
                    continue  # another sync stored these entries meanwhile: prepare again
                self._store(conn, step, signed=due)
            signed = step.point
            unstored = None if due else step.point
            last = prepared if due else last
            done += step.point.size - step.start
            log.debug(
                "tlog step: %d entries to size %d, prepared in %.0f ms, stored in %.0f ms",
                step.point.size - step.start,
                step.point.size,
                (prepared - began) * 1000,
                (time.monotonic() - prepared) * 1000,
            )
        if unstored is not None:
            with write_step(self.engine) as conn:
                self._store_checkpoint(raw_cursor(conn), unstored)
        return signed

    def _prepare(self, page: int) -> _Step | None:
        """The next step's rows and checkpoint, computed from a read snapshot (no write lock)."""
        deadline = time.monotonic() + STEP_SECONDS
        with self.engine.connect() as conn:
            start = self._size(conn)
            tiles = {
                level: self.tile(conn, level, index)[: width * 32]
                for level, (index, width) in partial_tiles(start).items()
            }
            frontier = TileFrontier(start, tiles)
            ph = self._ph
            cur = raw_cursor(conn)
            leaves: list[tuple[int, str | None, str]] = []
            keys = LabelKeys(self.label_secret)
            size = start
            while size - start < page and (not leaves or time.monotonic() < deadline):
                cur.execute(
                    "SELECT seq, body FROM audit_log"
                    f" WHERE seq > {ph} ORDER BY seq LIMIT {min(_CHUNK, page - len(leaves))}",
                    (size,),
                )
                rows = cur.fetchall()
                if not rows:
                    break
                hashes = []
                for seq, body in rows:
                    if seq != size + 1:
                        raise RuntimeError(f"audit entry {size + 1} is missing (next is {seq})")
                    data, label = project(keys, seq, body)
                    leaves.append((size, label, data.decode()))
                    hashes.append(leaf_hash(data))
                    size += 1
                frontier.extend(hashes)
        if not leaves:
            return None
        point = Checkpoint(self.origin, frontier.size, frontier.root())
        note = sign_note(point.text(), [self.signer.sign(point.text())])
        signed = SignedCheckpoint(point.size, point.root, note)
        return _Step(start, leaves, frontier.tiles(), signed)

    def _store(self, conn: Connection, step: _Step, *, signed: bool = True) -> None:
        """Insert a prepared step's leaves and tiles (a partial one grown in place).

        With ``signed``, its checkpoint too.
        """
        cur = raw_cursor(conn)
        insert_rows(cur, self._ph, "tlog_leaves (idx, label, data)", step.leaves)
        marks = ", ".join([f"({self._ph}, {self._ph}, {self._ph})"] * len(step.tiles))
        cur.execute(
            f"INSERT INTO tlog_tiles (level, idx, hashes) VALUES {marks}"
            " ON CONFLICT (level, idx) DO UPDATE SET hashes = excluded.hashes",
            [value for tile in step.tiles for value in tile],
        )
        if signed:
            self._store_checkpoint(cur, step.point)

    def _store_checkpoint(self, cur: Any, point: SignedCheckpoint) -> None:
        """Insert a signed checkpoint of the stored leaves (none for a size already signed)."""
        cur.execute(f"SELECT 1 FROM tlog_checkpoints WHERE size = {self._ph}", (point.size,))
        if cur.fetchone() is None:
            insert_rows(
                cur,
                self._ph,
                "tlog_checkpoints (size, root, note)",
                [(point.size, point.root.hex(), point.note)],
            )

    # -- reading ---------------------------------------------------------------------------------

    def latest(self) -> SignedCheckpoint | None:
        """The newest signed checkpoint with its witnesses' cosignatures, or ``None``."""
        with self.engine.connect() as conn:
            row = conn.execute(
                text("SELECT size, root, note FROM tlog_checkpoints ORDER BY size DESC LIMIT 1")
            ).first()
            return None if row is None else _cosigned(conn, row)

    def signed_origin(self) -> str | None:
        """The origin the log's first checkpoint was signed under (``None``: none signed yet)."""
        with self.engine.connect() as conn:
            if not inspect(conn).has_table("tlog_checkpoints"):
                return None  # a ledger from before the transparency log: nothing signed
            note = conn.execute(
                text("SELECT note FROM tlog_checkpoints ORDER BY size LIMIT 1")
            ).scalar()
        return None if note is None else str(note).split("\n", 1)[0]

    def origin_problem(self) -> str | None:
        """Why this log may not sign under its origin: its checkpoints name another, or ``None``.

        An origin is the log's key name, so a checkpoint under another one would be another
        log's to every witness and device: the origin is fixed once a checkpoint is signed.
        """
        signed = self.signed_origin()
        if signed is None or signed == self.origin:
            return None
        return (
            f"`tlog_origin` is {self.origin!r} but this log's checkpoints are signed under"
            f" {signed!r}: set DPGOV_TLOG_ORIGIN={signed} (a log keeps the origin of its first"
            " checkpoint; a new origin needs a new log, docs/transparency.md#the-logs-origin)"
        )

    def checkpoint_at(self, size: int) -> SignedCheckpoint | None:
        """The checkpoint signed at ``size`` with its cosignatures, if one was."""
        with self.engine.connect() as conn:
            row = conn.execute(
                text("SELECT size, root, note FROM tlog_checkpoints WHERE size = :size"),
                {"size": size},
            ).first()
            return None if row is None else _cosigned(conn, row)

    def add_cosignature(self, size: int, witness: str, line: str) -> None:
        """Keep a witness's cosignature line on the checkpoint of ``size`` (once per witness)."""
        with write_step(self.engine) as conn:
            conn.execute(
                text(
                    "INSERT INTO tlog_cosignatures (size, witness, line)"
                    " VALUES (:size, :witness, :line) ON CONFLICT DO NOTHING"
                ),
                {"size": size, "witness": witness, "line": line},
            )

    def cosigned_size(self, witness: str) -> int:
        """The largest checkpoint size ``witness`` cosigned for this log (0: none)."""
        with self.engine.connect() as conn:
            found = conn.execute(
                text("SELECT max(size) FROM tlog_cosignatures WHERE witness = :w"), {"w": witness}
            ).scalar()
        return 0 if found is None else int(found)

    def receipt(self, seq: int) -> Receipt | None:
        """The inclusion receipt of audit entry ``seq`` under the newest checkpoint, if covered."""
        point = self.latest()
        if point is None or not 1 <= seq <= point.size:
            return None
        index = seq - 1
        with self.engine.connect() as conn:
            data = conn.execute(
                text("SELECT data FROM tlog_leaves WHERE idx = :idx"), {"idx": index}
            ).scalar()
            if data is None:
                return None
            proof = inclusion_proof(index, point.size, self._reader(conn, point.size))
        return Receipt(index, str(data).encode(), proof, point.note)

    def receipts(self, labels: Sequence[str]) -> tuple[SignedCheckpoint | None, list[Receipt]]:
        """The newest checkpoint and a receipt for every leaf under ``labels`` it covers, in order.

        One read transaction, so every proof is against the checkpoint returned.
        """
        with self.engine.connect() as conn:
            row = conn.execute(
                text("SELECT size, root, note FROM tlog_checkpoints ORDER BY size DESC LIMIT 1")
            ).first()
            if row is None:
                return None, []
            point = _cosigned(conn, row)
            found: list[tuple[int, str]] = []
            wanted = sorted(set(labels))
            cur = raw_cursor(conn)
            for start in range(0, len(wanted), 500):
                chunk = wanted[start : start + 500]
                marks = ", ".join([self._ph] * len(chunk))
                cur.execute(
                    f"SELECT idx, data FROM tlog_leaves WHERE label IN ({marks})"
                    f" AND idx < {self._ph}",
                    (*chunk, point.size),
                )
                found.extend((int(index), str(data)) for index, data in cur.fetchall())
            found.sort()
            node = self._reader(conn, point.size)
            receipts = [
                Receipt(index, data.encode(), inclusion_proof(index, point.size, node), point.note)
                for index, data in found
            ]
        return point, receipts

    def consistency(self, old: int, new: int) -> list[bytes]:
        """The consistency proof from size ``old`` to size ``new`` (``new`` at most the size)."""
        with self.engine.connect() as conn:
            size = self._size(conn)
            if not 0 <= old <= new <= size:
                raise ValueError(f"sizes must satisfy 0 <= old <= new <= {size}, got {old}, {new}")
            if old == 0 or old == new:
                return []  # the empty tree and a tree itself need no proof (RFC 9162, 2.1.4)
            return consistency_proof(old, new, self._reader(conn, new))

    def leaves(self, label: str) -> list[tuple[int, bytes]]:
        """Every leaf carrying ``label``, as ``(index, leaf)``, in order."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT idx, data FROM tlog_leaves WHERE label = :label ORDER BY idx"),
                {"label": label},
            ).all()
        return [(int(i), str(d).encode()) for i, d in rows]

    def entries(self, start: int, end: int) -> list[bytes]:
        """The leaves ``[start, end)`` (for monitors and the recompute from the public log)."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT data FROM tlog_leaves WHERE idx >= :a AND idx < :b ORDER BY idx"),
                {"a": start, "b": end},
            ).all()
        return [str(r[0]).encode() for r in rows]

    # -- verifying -------------------------------------------------------------------------------

    def verify(
        self,
        start: TlogVerification | None = None,
        *,
        before: Iterable[Sequence[tuple[Any, ...]]] = (),
    ) -> TlogVerification:
        """Check each leaf against its audit entry, each stored node and each signed checkpoint.

        Streams the audit log and the leaves side by side, rebuilds the tree with a
        :class:`~dp_governor.mechanisms.merkle.Frontier` and compares the stored subtree
        hashes and every checkpoint (root and the log key's signature) as it passes their size,
        the checkpoints read a page at a time beside the leaves (memory does not grow with them).
        ``start``, an earlier accepted result, resumes at its size from its edge (the leaves
        before it are not read again). ``before``, pages of archived audit entries (from the
        first), stand for the entries the log no longer holds. The audit chain itself is
        checked by :meth:`AuditLog.verify`.
        """
        frontier = Frontier() if start is None else Frontier(start.leaves, start.edge)
        made_before = 0 if start is None else start.nodes
        with self.engine.connect() as conn:
            low, high, count = conn.execute(
                text("SELECT min(size), max(size), count(*) FROM tlog_checkpoints")
            ).one()
            stored = conn.execute(
                text("SELECT coalesce(sum(length(hashes)), 0) FROM tlog_tiles")
            ).scalar()
        n_stored = int(stored or 0) // 32
        highest = int(high or 0)
        points = self._points(after=frontier.size)
        point = next(points, None)
        made = 0
        pending: list[tuple[int, int, bytes]] = []  # the made hashes a tile stores
        keys = LabelKeys(self.label_secret, cached=_PAGE)

        def fail(problem: str) -> TlogVerification:
            return TlogVerification(False, frontier.size, int(count), problem)

        if low is not None and int(low) <= 0:
            return fail("a checkpoint signs the empty tree, which this log never does")
        for (seq, body), leaf in self._paired(after=frontier.size, before=before):
            index = frontier.size
            if leaf is None:
                if index < highest:
                    return fail(f"leaf {index} is missing but a checkpoint covers it")
                break
            if seq != index + 1:
                return fail(f"leaf {index} is not audit entry {index + 1}")
            expected = project(keys, seq, body)[0]
            if leaf != expected:
                return fail(f"leaf {index} differs from the projection of audit entry {seq}")
            nodes = frontier.append(leaf_hash(leaf))
            made += len(nodes)
            pending.extend(n for n in nodes if not n[0] % TILE_HEIGHT)
            if len(pending) >= _PAGE:
                bad = self._tiles_differ(pending)
                if bad is not None:
                    return fail(f"the stored hash of subtree {bad} differs from its leaves'")
                pending = []
            while point is not None and point[0] < frontier.size:
                point = next(points, None)  # a size no leaf reaches: the last check names it
            if point is not None and point[0] == frontier.size:
                _, root, note = point
                if root != frontier.root():
                    return fail(f"the checkpoint at size {frontier.size} signs another root")
                expected_note = Checkpoint(self.origin, frontier.size, root)
                try:
                    got, _ = Checkpoint.open(note, self.verifier)
                except ValueError as exc:
                    return fail(f"the checkpoint at size {frontier.size}: {exc}")
                if got != expected_note:
                    return fail(f"the checkpoint note at size {frontier.size} says another tree")
        bad = self._tiles_differ(pending)
        if bad is not None:
            return fail(f"the stored hash of subtree {bad} differs from its leaves'")
        if highest > frontier.size:
            return fail(
                f"a checkpoint signs {highest} leaves but the audit log has {frontier.size}"
            )
        made += made_before
        tiled = sum(frontier.size >> level for level in range(0, frontier.size.bit_length(), 8))
        if n_stored != tiled:
            return fail(f"tlog_tiles hold {n_stored} subtree hashes, the leaves make {tiled}")
        return TlogVerification(True, frontier.size, int(count), None, tuple(frontier.edge), made)

    def _points(self, *, after: int) -> Iterator[tuple[int, bytes, str]]:
        """The checkpoints of sizes above ``after``, ``(size, root, note)``, a page at a time."""
        sql = "SELECT size, root, note FROM tlog_checkpoints WHERE size > :n ORDER BY size LIMIT "
        last, full = after, True
        while full:
            with self.engine.connect() as conn:
                rows = conn.execute(text(sql + str(_POINTS)), {"n": last}).all()
            yield from ((int(n), bytes.fromhex(root), str(note)) for n, root, note in rows)
            full, last = len(rows) == _POINTS, int(rows[-1][0]) if rows else last

    def _tiles_differ(self, made: list[tuple[int, int, bytes]]) -> tuple[int, int] | None:
        """The first of ``made`` (heights a tile holds) its stored tile lacks, or ``None``."""
        tiles: dict[tuple[int, int], bytes] = {}
        with self.engine.connect() as conn:
            for level, index, digest in made:
                key = (level // TILE_HEIGHT, index // TILE_WIDTH)
                if key not in tiles:
                    tiles[key] = self.tile(conn, *key)
                at = index % TILE_WIDTH * 32
                if tiles[key][at : at + 32] != digest:
                    return level, index
        return None

    def _paired(
        self, *, after: int = 0, before: Iterable[Sequence[tuple[Any, ...]]] = ()
    ) -> Iterator[tuple[tuple[int, str], bytes | None]]:
        """Audit entries ``(seq, body)`` after ``after`` beside the leaf of the same position.

        The leaf is ``None`` where none is stored. ``before``: archived entries' pages (rows
        ``(seq, at, actor, action, body, ...)``), paired first (with the leaves read by index).
        """
        ph = self._ph
        last = after
        leaves: Generator[tuple[int, bytes]] | None = None
        leaf: tuple[int, bytes] | None = None
        for page in before:
            for seq, _at, _actor, _action, body, *_ in page:
                if int(seq) <= last:
                    continue
                if leaves is None:  # the leaves are read only when there are archived entries
                    leaves = self._leaves_after(after)
                    leaf = next(leaves, None)
                data = None
                if leaf is not None and leaf[0] == int(seq) - 1:
                    data, leaf = leaf[1], next(leaves, None)
                yield (int(seq), body), data
                last = int(seq)
        if leaves is not None:
            leaves.close()
        with self.engine.connect() as conn:
            cur = raw_cursor(conn)
            while True:
                cur.execute(
                    "SELECT a.seq, a.body, l.data FROM audit_log a"
                    " LEFT JOIN tlog_leaves l ON l.idx = a.seq - 1"
                    f" WHERE a.seq > {ph} ORDER BY a.seq LIMIT {_PAGE}",
                    (last,),
                )
                page = cur.fetchall()
                if not page:
                    return
                for seq, body, data in page:
                    yield (
                        (int(seq), body),
                        None if data is None else str(data).encode(),
                    )
                last = int(page[-1][0])

    def _leaves_after(self, after: int) -> Generator[tuple[int, bytes]]:
        """The leaves from index ``after`` on, ``(index, leaf)``, read a page at a time."""
        with self.engine.connect() as conn:
            cur = raw_cursor(conn)
            start = after
            while True:
                cur.execute(
                    f"SELECT idx, data FROM tlog_leaves WHERE idx >= {self._ph}"
                    f" ORDER BY idx LIMIT {_PAGE}",
                    (start,),
                )
                page = cur.fetchall()
                if not page:
                    return
                for idx, data in page:
                    yield int(idx), str(data).encode()
                start = int(page[-1][0]) + 1


def _cosigned(conn: Connection, row: Any) -> SignedCheckpoint:
    """A stored checkpoint row, its note carrying the witnesses' stored cosignature lines."""
    size = int(row[0])
    lines = conn.execute(
        text("SELECT line FROM tlog_cosignatures WHERE size = :size ORDER BY witness"),
        {"size": size},
    ).scalars()
    return SignedCheckpoint(
        size, bytes.fromhex(row[1]), str(row[2]) + "".join(f"{x}\n" for x in lines)
    )

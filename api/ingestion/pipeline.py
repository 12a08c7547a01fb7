"""The private pipeline's jobs: shuffle the inbox into the store, fold sketches, apply retention.

Every job is idempotent and safe to run concurrently with itself: ``flush_inbox`` stores only
the rows its own ``DELETE ... RETURNING`` took, in the same transaction; ``aggregate`` marks the
reports it folds in the same transaction as the sketch it writes, under a per-sketch lock; and
``purge`` deletes by day. Running one twice, or in two processes, does no harm beyond the work.
"""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import secrets
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson
from sqlalchemy import Engine, and_, delete, func, select, update

from api.ingestion.ingest import Ingestor, Mechanism, params_hash
from api.ingestion.tables import InboxRow, SketchRow, StoredReport
from budget import Ledger, utc_day
from budget.audit_log import Entry
from budget.book import PolicyBook
from budget.central import batch_layers
from budget.gate import load_book
from budget.storage.db import writer
from budget.storage.tables import ShuffledBatch
from mechanisms import (
    CMS,
    HCMS,
    CmsReports,
    CmsSketch,
    HcmsReports,
    HcmsSketch,
    SfpReports,
    SfpSketch,
)
from policies import Policy, mechanism_for
from policies.model import to_micro
from policies.repository import lock_names

__all__ = [
    "DEFAULT_MIN_BATCH",
    "AggregateResult",
    "aggregate",
    "decode_payloads",
    "flush_inbox",
    "load_sketch",
    "purge",
    "sketch_arrays",
    "sketch_digest",
    "sketch_from_arrays",
    "sketch_from_bytes",
    "sketch_to_bytes",
]

_INBOX = InboxRow.__table__  # type: ignore[attr-defined]
_REPORTS = StoredReport.__table__  # type: ignore[attr-defined]
_SKETCHES = SketchRow.__table__  # type: ignore[attr-defined]
_BATCHES = ShuffledBatch.__table__  # type: ignore[attr-defined]
Sketch = CmsSketch | HcmsSketch | SfpSketch
_FOLD_CHUNK = 50_000
DEFAULT_MIN_BATCH = 100
log = logging.getLogger("dpgov.pipeline")


class _ShortBatch(Exception):
    """Rolls a flush's transaction back: what it took is below the batch's minimum."""


@dataclass(frozen=True, slots=True)
class _Terms:
    """What the flush needs of a use case's policies: its minimum and each version's epsilon."""

    min_devices: int
    epsilon_micro: dict[str, int]  # by parameter hash
    max_epsilon_micro: int


def _terms(book: PolicyBook, use_cases: set[str]) -> dict[str, _Terms]:
    """Each use case's latest ``min_batch_devices`` and every version's epsilon per report."""
    out: dict[str, _Terms] = {}
    for version in book.versions:  # by name, then version: each use case's latest last
        if version.name not in use_cases:
            continue
        found = (params_hash(mechanism_for(version)), to_micro(version.epsilon_per_report))
        known = out.get(version.name)
        eps = {**known.epsilon_micro, found[0]: found[1]} if known else {found[0]: found[1]}
        top = max(found[1], known.max_epsilon_micro if known else 0)
        out[version.name] = _Terms(version.min_batch_devices, eps, top)
    return out


def flush_inbox(
    engine: Engine,
    *,
    batch: int = 10_000,
    min_batch: int = DEFAULT_MIN_BATCH,
    now: datetime | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Publish each use case's pending reports as one shuffled batch, once it is large enough.

    A use case's batch is every report pending in its inbox; it is published once it holds at
    least ``min_batch`` reports from at least the policy's ``min_batch_devices`` distinct
    devices (counted by the inbox's per-use-case pseudonyms), and otherwise waits, a day's tail
    included, for the next flush. Publishing is one transaction per batch, under a lock on the
    use case: the rows are taken with ``DELETE ... RETURNING`` (``batch`` ids a statement),
    counted again (a concurrent flush or purge may have taken some; then nothing is
    published), CSPRNG-shuffled, stored under new random ids without their pseudonyms, and
    the batch's sizes recorded in ``shuffled_batches`` (:mod:`budget.central`). Returns how
    many reports moved. ``progress`` is called with the pending reports handled so far and
    those found pending, after each use case.
    """
    if batch < 1 or min_batch < 1:
        raise ValueError(f"`batch` and `min_batch` must be at least 1, got {batch}, {min_batch}")
    rng = secrets.SystemRandom()
    with engine.connect() as conn:
        pending = conn.execute(
            select(_INBOX.c.use_case, func.count()).group_by(_INBOX.c.use_case)
        ).all()
    counts = {str(use_case): int(count) for use_case, count in pending if count >= min_batch}
    ready = set(counts)
    if not ready:
        return 0
    with engine.connect() as conn:
        # read afresh each flush (milliseconds for the default policies): a process may flush
        # several databases whose use cases share names and versions
        terms = _terms(load_book(conn), ready)
    today = utc_day(now if now is not None else datetime.now(UTC))
    moved = handled = 0
    for use_case in sorted(ready):
        found = terms.get(use_case)
        try:
            if found is not None:  # else no policy of that name: left for inspection
                moved += _publish(engine, use_case, found, batch, min_batch, today, rng)
        except _ShortBatch:
            pass
        handled += counts[use_case]
        if progress is not None:
            progress(handled, sum(counts.values()))
    return moved


def _publish(
    engine: Engine,
    use_case: str,
    terms: _Terms,
    batch: int,
    min_batch: int,
    today: int,
    rng: secrets.SystemRandom,
) -> int:
    """Publish one use case's pending reports as one batch (see :func:`flush_inbox`)."""
    need_devices = terms.min_devices if terms.min_devices > 1 else 0
    with writer(engine).begin() as conn:
        lock_names(conn, [f"flush:{use_case}"])
        rows = conn.execute(
            select(_INBOX.c.id, _INBOX.c.device_tag).where(_INBOX.c.use_case == use_case)
        ).all()
        if len(rows) < min_batch or len({r.device_tag for r in rows} - {None}) < need_devices:
            return 0
        ids = [r.id for r in rows]
        taken: list[Any] = []
        for start in range(0, len(ids), batch):
            query = delete(_INBOX).where(_INBOX.c.id.in_(ids[start : start + batch]))
            taken += conn.execute(
                query.returning(
                    _INBOX.c.params, _INBOX.c.day, _INBOX.c.payload, _INBOX.c.device_tag
                )
            )
        per_device = Counter(r.device_tag for r in taken if r.device_tag is not None)
        if len(taken) < max(min_batch, 1) or len(per_device) < need_devices:
            raise _ShortBatch(use_case)  # rolls back: the rows stay in the inbox
        rng.shuffle(taken)  # RETURNING follows the table's order, not the shuffled ids
        for start in range(0, len(taken), batch):
            conn.execute(
                _REPORTS.insert(),
                [
                    {
                        "id": secrets.token_hex(16),
                        "use_case": use_case,
                        "params": r.params,
                        "day": r.day,
                        "payload": r.payload,
                        "folded": False,
                    }
                    for r in taken[start : start + batch]
                ],
            )
        layers = batch_layers(per_device.values())
        untagged = len(taken) - sum(per_device.values())
        eps = max(terms.epsilon_micro.get(r.params, terms.max_epsilon_micro) for r in taken)
        conn.execute(
            _BATCHES.insert().values(
                use_case=use_case,
                day=today,
                first_day=min(r.day for r in taken),
                last_day=max(r.day for r in taken),
                devices=len(per_device),
                reports=len(taken),
                max_per_device=max(per_device.values(), default=0),  # 0: not counted
                layers=orjson.dumps(layers).decode(),
                untagged=untagged,
                epsilon_micro=eps,
                min_batch_devices=terms.min_devices,
            )
        )
    return len(taken)


def sketch_arrays(sketch: Sketch) -> dict[str, np.ndarray]:
    """A sketch's whole state as named arrays (what persists and what crosses processes)."""
    if isinstance(sketch, CmsSketch):
        return {"counts": np.asarray(sketch.counts), "rows": np.asarray(sketch.row_counts)}
    if isinstance(sketch, HcmsSketch):
        return {"sums": np.asarray(sketch.sums), "rows": np.asarray(sketch.row_counts)}
    arrays = {"word_counts": sketch.word.counts, "word_rows": sketch.word.row_counts}
    for i, frag in enumerate(sketch.fragments):
        arrays[f"frag{i}_counts"] = frag.counts
        arrays[f"frag{i}_rows"] = frag.row_counts
    return {name: np.asarray(a) for name, a in arrays.items()}


def sketch_digest(sketch: Sketch) -> str:
    """SHA-256 over a sketch's arrays as int64: equal digests mean equal sketches, bit for bit."""
    h = hashlib.sha256()
    for name, array in sorted(sketch_arrays(sketch).items()):
        h.update(name.encode())
        h.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
    return h.hexdigest()


def sketch_from_arrays(mechanism: Mechanism, arrays: Mapping[str, np.ndarray]) -> Sketch:
    """Inverse of :func:`sketch_arrays` for the mechanism's parameters (validated)."""
    if isinstance(mechanism, CMS):
        return CmsSketch.from_arrays(mechanism, arrays["counts"], arrays["rows"])
    if isinstance(mechanism, HCMS):
        return HcmsSketch.from_arrays(mechanism, arrays["sums"], arrays["rows"])
    sk = SfpSketch(mechanism)
    sk.word = CmsSketch.from_arrays(mechanism.word_cms, arrays["word_counts"], arrays["word_rows"])
    frag = mechanism.fragment_cms
    sk.fragments = tuple(
        CmsSketch.from_arrays(frag, arrays[f"frag{i}_counts"], arrays[f"frag{i}_rows"])
        for i in range(len(sk.fragments))
    )
    return sk


def sketch_to_bytes(sketch: Sketch) -> bytes:
    """Compressed arrays of a sketch's state (``numpy.savez_compressed``)."""
    buf = io.BytesIO()
    np.savez_compressed(buf, **sketch_arrays(sketch))  # type: ignore[arg-type]
    return buf.getvalue()


def sketch_from_bytes(mechanism: Mechanism, data: bytes) -> Sketch:
    """Inverse of :func:`sketch_to_bytes` for the mechanism's parameters."""
    with np.load(io.BytesIO(data)) as arrays:
        return sketch_from_arrays(mechanism, arrays)


def _cms_batch(bodies: list[dict[str, Any]], m: int) -> CmsReports:
    j = np.fromiter((b["j"] for b in bodies), dtype=np.int64, count=len(bodies))
    raw = b"".join(base64.b64decode(b["bits"]) for b in bodies)
    bits = np.frombuffer(raw, dtype=np.uint8).reshape(len(bodies), (m + 7) // 8)
    return CmsReports(j, bits, m)


def decode_payloads(
    mechanism: Mechanism, payloads: Iterable[str | bytes]
) -> CmsReports | HcmsReports | SfpReports:
    """Stored JSON payloads (already validated at ingestion) as one report batch."""
    bodies = [orjson.loads(p) for p in payloads]
    n = len(bodies)
    if isinstance(mechanism, CMS):
        return _cms_batch(bodies, mechanism.m)
    if isinstance(mechanism, HCMS):
        return HcmsReports(
            np.fromiter((b["j"] for b in bodies), dtype=np.int64, count=n),
            np.fromiter((b["l"] for b in bodies), dtype=np.int64, count=n),
            np.fromiter((b["bit"] for b in bodies), dtype=np.int8, count=n),
        )
    return SfpReports(
        _cms_batch([b["word"] for b in bodies], mechanism.m),
        _cms_batch([b["fragment"] for b in bodies], mechanism.m_fragment),
        np.fromiter((b["position"] for b in bodies), dtype=np.int64, count=n),
    )


def mechanisms_by_params(ledger: Ledger, use_case: str) -> dict[str, Mechanism]:
    """Every parameter set a use case ever had, by its hash (reports keep theirs)."""
    out: dict[str, Mechanism] = {}
    for version in ledger.policies.versions(use_case):
        mech = mechanism_for(version)
        out[params_hash(mech)] = mech
    return out


@dataclass(frozen=True, slots=True)
class AggregateResult:
    """Reports folded into sketches by one ``aggregate`` run, and the use cases that failed.

    ``failed`` maps a use case to the error that stopped its folding (its reports stay
    unfolded for the next run); the other use cases were folded regardless.
    """

    reports: int
    sketches: int
    failed: dict[str, str] = field(default_factory=dict)


def aggregate(
    ledger: Ledger, *, progress: Callable[[int, int], None] | None = None
) -> AggregateResult:
    """Fold every unfolded stored report into its (use case, parameters, day) sketch.

    Each group is folded on its own: an error in one (a sketch too large for memory, a
    corrupt report) is logged and reported in the result, and the other groups go on.
    ``progress`` is called with the unfolded reports handled so far and those found, before
    each group and at the end.
    """
    engine = ledger.engine
    with engine.connect() as conn:
        groups = conn.execute(
            select(_REPORTS.c.use_case, _REPORTS.c.params, _REPORTS.c.day, func.count())
            .where(_REPORTS.c.folded.is_(False))
            .group_by(_REPORTS.c.use_case, _REPORTS.c.params, _REPORTS.c.day)
        ).all()
    folded = 0
    touched = set()
    failed: dict[str, str] = {}
    known: dict[str, dict[str, Mechanism]] = {}
    total, handled = sum(int(n) for *_, n in groups), 0
    for use_case, params, day, count in groups:
        if progress is not None:  # before each group, and once all are done
            progress(handled, total)
        handled += int(count)
        if use_case in failed:
            continue
        try:
            if use_case not in known:
                known[use_case] = mechanisms_by_params(ledger, use_case)
            mechanism = known[use_case].get(params)
            if mechanism is None:
                continue  # parameters of no known version: leave the reports for inspection
            n = _fold_group(engine, mechanism, use_case, params, day)
        except Exception as exc:  # one use case's failure never stops the others
            log.exception("aggregate: folding %s (day %d) failed", use_case, day)
            failed[use_case] = f"{type(exc).__name__}: {exc}"
            continue
        folded += n
        if n:
            touched.add((use_case, params, day))
    if progress is not None:
        progress(total, total)
    return AggregateResult(folded, len(touched), failed)


def _fold_group(engine: Engine, mechanism: Mechanism, use_case: str, params: str, day: int) -> int:
    """Fold one group's unfolded reports, a chunk per transaction; how many were folded.

    On PostgreSQL each transaction first takes an advisory lock on the group, so a concurrent
    fold of the same group waits, then reads the reports the first one left unfolded (READ
    COMMITTED: statements after the lock see what it committed); SQLite's write transactions
    are serial already. Reports are marked folded in the transaction that writes the sketch.
    """
    where_group = and_(
        _SKETCHES.c.use_case == use_case, _SKETCHES.c.params == params, _SKETCHES.c.day == day
    )
    folded = 0
    while True:
        with writer(engine).begin() as conn:
            lock_names(conn, [f"sketch:{use_case}:{params}:{day}"])
            rows = conn.execute(
                select(_REPORTS.c.id, _REPORTS.c.payload)
                .where(
                    and_(
                        _REPORTS.c.use_case == use_case,
                        _REPORTS.c.params == params,
                        _REPORTS.c.day == day,
                        _REPORTS.c.folded.is_(False),
                    )
                )
                .limit(_FOLD_CHUNK)
            ).all()
            if not rows:
                return folded
            existing = conn.execute(select(_SKETCHES.c.state).where(where_group)).first()
            sketch: Any = (
                sketch_from_bytes(mechanism, existing[0]) if existing else mechanism.sketch()
            )
            sketch.add(decode_payloads(mechanism, (r.payload for r in rows)))
            state = sketch_to_bytes(sketch)
            if existing:
                conn.execute(update(_SKETCHES).where(where_group).values(n=sketch.n, state=state))
            else:
                conn.execute(
                    _SKETCHES.insert().values(
                        use_case=use_case, params=params, day=day, n=sketch.n, state=state
                    )
                )
            ids = [r.id for r in rows]
            for s in range(0, len(ids), 500):
                conn.execute(
                    update(_REPORTS).where(_REPORTS.c.id.in_(ids[s : s + 500])).values(folded=True)
                )
            folded += len(rows)


def load_sketch(
    ledger: Ledger, ingestor: Ingestor, policy: Policy, first_day: int, last_day: int
) -> tuple[Sketch, list[int]]:
    """The merged sketch of the policy's current parameters over ``first_day..last_day``."""
    mechanism, params = ingestor.mechanism(policy)
    merged: Any = mechanism.sketch()
    days: list[int] = []
    with ledger.engine.connect() as conn:
        rows = conn.execute(
            select(_SKETCHES.c.day, _SKETCHES.c.state)
            .where(
                and_(
                    _SKETCHES.c.use_case == policy.name,
                    _SKETCHES.c.params == params,
                    _SKETCHES.c.day >= first_day,
                    _SKETCHES.c.day <= last_day,
                )
            )
            .order_by(_SKETCHES.c.day)
        )
        for day, state in rows:
            merged.merge(sketch_from_bytes(mechanism, state))
            days.append(int(day))
    return merged, days


def purge(ledger: Ledger, *, now: datetime) -> dict[str, int]:
    """Retention: the ledger's purge of the spend records, then of the reports themselves.

    Both follow the book's one rule (:meth:`budget.book.PolicyBook.purge_through`) over every
    use case ever defined, retired ones included: the ledger keeps spend records for the
    longest retention ever, the inbox rows, stored reports and sketches go at the latest
    version's retention (``data_through``; docs/decisions/retention.md).
    """
    result = ledger.purge(now=now)
    day = utc_day(now)
    reports = sketches = inbox = 0
    with writer(ledger.engine).begin() as conn:
        for name, kept in ledger.gate.book(conn).purge_through(day).items():
            cutoff = kept.data_through
            inbox += conn.execute(
                delete(_INBOX).where(and_(_INBOX.c.use_case == name, _INBOX.c.day <= cutoff))
            ).rowcount
            reports += conn.execute(
                delete(_REPORTS).where(and_(_REPORTS.c.use_case == name, _REPORTS.c.day <= cutoff))
            ).rowcount
            sketches += conn.execute(
                delete(_SKETCHES).where(
                    and_(_SKETCHES.c.use_case == name, _SKETCHES.c.day <= cutoff)
                )
            ).rowcount
        inbox_depth = conn.execute(select(func.count()).select_from(_INBOX)).scalar_one()
        data = {"day": day, "reports": reports, "sketches": sketches, "inbox": inbox}
        ledger.audit.append(conn, [Entry("job:purge", "purge.reports", data)], now=now)
    return {
        "charges": result.charges,
        "daily_spend": result.daily_spend,
        "idempotency": result.idempotency,
        "reports": reports,
        "sketches": sketches,
        "inbox": inbox,
        "inbox_depth": int(inbox_depth),
    }

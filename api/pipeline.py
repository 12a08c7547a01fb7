"""The private pipeline's jobs: shuffle the inbox into the store, fold sketches, apply retention.

Every job is idempotent: ``flush_inbox`` moves rows it deletes in the same transaction,
``aggregate`` marks the reports it folds in the same transaction as the sketch it writes, and
``purge`` deletes by day. Running one twice, or in two processes, does no harm beyond the work.
"""

from __future__ import annotations

import base64
import hashlib
import io
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import orjson
from sqlalchemy import Engine, and_, delete, func, select, update

from api.ingest import Ingestor, Mechanism, params_hash
from api.tables import InboxRow, SketchRow, StoredReport
from budget import Ledger, utc_day
from budget.audit import Entry
from budget.db import writer
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

__all__ = [
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
Sketch = CmsSketch | HcmsSketch | SfpSketch
_FOLD_CHUNK = 50_000


def flush_inbox(engine: Engine, *, batch: int = 10_000) -> int:
    """Move every inbox row to the report store in CSPRNG-shuffled order with random ids.

    All pending ids are shuffled together, then moved ``batch`` at a time, so neither the
    store's order nor its ids follow submission order. Returns how many rows moved.
    """
    rng = secrets.SystemRandom()
    with engine.connect() as conn:
        ids = [row[0] for row in conn.execute(select(_INBOX.c.id))]
    rng.shuffle(ids)
    moved = 0
    for start in range(0, len(ids), batch):
        chunk = ids[start : start + batch]
        with writer(engine).begin() as conn:
            rows = {r.id: r for r in conn.execute(select(_INBOX).where(_INBOX.c.id.in_(chunk)))}
            present = [i for i in chunk if i in rows]  # keeps the shuffled order
            if not present:
                continue
            conn.execute(
                _REPORTS.insert(),
                [
                    {
                        "id": secrets.token_hex(16),
                        "use_case": rows[i].use_case,
                        "params": rows[i].params,
                        "day": rows[i].day,
                        "payload": rows[i].payload,
                        "folded": False,
                    }
                    for i in present
                ],
            )
            conn.execute(delete(_INBOX).where(_INBOX.c.id.in_(present)))
            moved += len(present)
    return moved


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
    """Reports folded into sketches by one ``aggregate`` run."""

    reports: int
    sketches: int


def aggregate(ledger: Ledger) -> AggregateResult:
    """Fold every unfolded stored report into its (use case, parameters, day) sketch."""
    engine = ledger.engine
    with engine.connect() as conn:
        groups = conn.execute(
            select(_REPORTS.c.use_case, _REPORTS.c.params, _REPORTS.c.day)
            .where(_REPORTS.c.folded.is_(False))
            .group_by(_REPORTS.c.use_case, _REPORTS.c.params, _REPORTS.c.day)
        ).all()
    folded = 0
    touched = set()
    known: dict[str, dict[str, Mechanism]] = {}
    for use_case, params, day in groups:
        if use_case not in known:
            known[use_case] = mechanisms_by_params(ledger, use_case)
        mechanism = known[use_case].get(params)
        if mechanism is None:
            continue  # parameters of no known version: leave the reports for inspection
        while True:
            with writer(engine).begin() as conn:
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
                    break
                existing = conn.execute(
                    select(_SKETCHES.c.state).where(
                        and_(
                            _SKETCHES.c.use_case == use_case,
                            _SKETCHES.c.params == params,
                            _SKETCHES.c.day == day,
                        )
                    )
                ).first()
                sketch: Any = (
                    sketch_from_bytes(mechanism, existing[0]) if existing else mechanism.sketch()
                )
                sketch.add(decode_payloads(mechanism, (r.payload for r in rows)))
                state = sketch_to_bytes(sketch)
                if existing:
                    conn.execute(
                        update(_SKETCHES)
                        .where(
                            and_(
                                _SKETCHES.c.use_case == use_case,
                                _SKETCHES.c.params == params,
                                _SKETCHES.c.day == day,
                            )
                        )
                        .values(n=sketch.n, state=state)
                    )
                else:
                    conn.execute(
                        _SKETCHES.insert().values(
                            use_case=use_case, params=params, day=day, n=sketch.n, state=state
                        )
                    )
                ids = [r.id for r in rows]
                for s in range(0, len(ids), 500):
                    conn.execute(
                        update(_REPORTS)
                        .where(_REPORTS.c.id.in_(ids[s : s + 500]))
                        .values(folded=True)
                    )
                folded += len(rows)
                touched.add((use_case, params, day))
    return AggregateResult(folded, len(touched))


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
    """Retention: the ledger's purge, plus reports and sketches older than each window."""
    result = ledger.purge(now=now)
    day = utc_day(now)
    reports = sketches = 0
    with writer(ledger.engine).begin() as conn:
        for policy in ledger.policies.list():
            cutoff = day - policy.retention_days
            reports += conn.execute(
                delete(_REPORTS).where(
                    and_(_REPORTS.c.use_case == policy.name, _REPORTS.c.day <= cutoff)
                )
            ).rowcount
            sketches += conn.execute(
                delete(_SKETCHES).where(
                    and_(_SKETCHES.c.use_case == policy.name, _SKETCHES.c.day <= cutoff)
                )
            ).rowcount
        inbox_depth = conn.execute(select(func.count()).select_from(_INBOX)).scalar_one()
        data = {"day": day, "reports": reports, "sketches": sketches}
        ledger.audit.append(conn, [Entry("job:purge", "purge.reports", data)], now=now)
    return {
        "charges": result.charges,
        "daily_spend": result.daily_spend,
        "idempotency": result.idempotency,
        "reports": reports,
        "sketches": sketches,
        "inbox_depth": int(inbox_depth),
    }

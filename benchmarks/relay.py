"""The relay's batch path in-process (no HTTP): reports/s and bytes written; prints a table.

Usage: ``python -m benchmarks.relay [--batch 5000 20000] [--batches 10] [--postgres URL]``.

The service's own :meth:`dp_governor.pipeline.ingest.Ingestor.submit_many` on a fresh database
with the default policies: Safari HCMS reports that carry their family identifier, every item a new
device (so every report is accepted and every ledger row is new), ``--warm`` batches first, then
``--batches`` timed. On SQLite it also reports what the WAL grew by per report (automatic
checkpoints off during the timed batches, so the figure is every page the commits wrote): the
ledger layout's cost that no Python tuning removes. The loop to iterate on for the relay target,
a few seconds a row instead of the HTTP benchmark's server process.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson
from sqlalchemy import Engine, event

from benchmarks.budget import database
from dp_governor.api.database import init_service_db
from dp_governor.budget import Ledger
from dp_governor.mechanisms import family_id
from dp_governor.pipeline.ingest import Ingestor
from dp_governor.pipeline.seal import InboxSeal
from dp_governor.policies import mechanism_for

USE_CASE = "safari-energy-domains"
SECRET = b"relay-benchmark-secret-relay-benchmark"
SEAL = InboxSeal([b"relay-benchmark-shuffler-relay-benchmark-shuffler-relay-benchmark-shuffler"])
NOW = datetime(2026, 11, 23, 12, tzinfo=UTC)


def _items(reports: list[dict[str, Any]], size: int) -> list[Any]:
    """One relay batch as the route hands it over: parsed JSON, a new device per item."""
    run = uuid.uuid4().hex[:12]
    raw = orjson.dumps(
        [{"device_id": f"{run}-{i}", "report": reports[i % len(reports)]} for i in range(size)]
    )
    items: list[Any] = orjson.loads(raw)
    return items


def prepare(engine: Engine) -> tuple[Ingestor, list[dict[str, Any]]]:
    """A fresh service database on ``engine``: its ingestor and 2,000 Safari HCMS report bodies."""
    init_service_db(engine)  # the pipeline's tables beside the ledger's
    ledger = Ledger(engine, SECRET, audit_key=SECRET)
    ledger.policies.ensure_defaults()
    mech = mechanism_for(ledger.policies.get(USE_CASE))
    reports = mech.privatize(
        [f"d{i}.example" for i in range(2_000)], rng=np.random.default_rng(1)
    ).to_dicts()
    family = family_id(mech)  # devices send the family they built under; the server checks it
    reports = [r | {"family": family} for r in reports]
    return Ingestor(ledger, SECRET, seal=SEAL), reports


def no_autocheckpoint(engine: Engine) -> None:
    """Make the engine's connections (all new from here) never checkpoint the WAL on their own."""
    engine.dispose()

    @event.listens_for(engine, "connect")
    def _no_autocheckpoint(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute("PRAGMA wal_autocheckpoint=0")


def run(kind: str, size: int, warm: int, batches: int, pg_url: str | None) -> str:
    """Time ``batches`` batches of ``size`` after ``warm``; one table row."""
    with database(kind, pg_url) as engine:
        path = engine.url.database if kind == "sqlite" else None
        ingestor, reports = prepare(engine)
        for _ in range(warm):
            ingestor.submit_many(USE_CASE, _items(reports, size), now=NOW)
        wal_before = 0
        if path is not None:
            with engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            no_autocheckpoint(engine)
            wal_before = os.path.getsize(f"{path}-wal") if os.path.exists(f"{path}-wal") else 0
        gc.freeze()  # as the service does after start-up (api.app's lifespan)
        accepted = 0
        times = []
        for _ in range(batches):
            items = _items(reports, size)  # one batch at a time, as a request body lives
            t0 = time.perf_counter()
            results = ingestor.submit_many(USE_CASE, items, now=NOW)
            times.append(time.perf_counter() - t0)
            accepted += sum(1 for r in results if r.decision is not None and r.decision.accepted)
            del items, results
        gc.unfreeze()
        n = size * batches
        seconds = sum(times)
        if accepted != n:
            raise AssertionError(f"{accepted} of {n} accepted: the benchmark's devices are new")
        wal = "n/a"
        if path is not None:
            grown = os.path.getsize(f"{path}-wal") - wal_before
            wal = f"{grown / n / 1024:.1f} KiB"
        return (
            f"| {kind} | {size:,} | {warm * size:,} | {n / seconds:,.0f} /s"
            f" | {size / min(times):,.0f} /s | {seconds / n * 1e6:.1f} | {wal} |"
        )


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run every backend and batch size, print one table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[5_000, 20_000])
    parser.add_argument("--warm", type=int, default=4, help="untimed batches first")
    parser.add_argument("--batches", type=int, default=6, help="timed batches")
    parser.add_argument("--postgres", default=os.environ.get("DPGOV_TEST_DATABASE_URL"))
    args = parser.parse_args(argv)
    print(
        "| backend | batch | devices before | accepted | best batch | us/report"
        " | WAL written/report |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    kinds = ["sqlite"] + (["postgresql"] if args.postgres else [])
    for kind in kinds:
        for size in args.batch:
            print(run(kind, size, args.warm, args.batches, args.postgres), flush=True)


if __name__ == "__main__":
    main()

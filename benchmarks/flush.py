"""The inbox flush (shuffle into the report store): reports moved a second; prints a Markdown table.

Usage: ``python -m benchmarks.flush [--reports 20000 100000] [--rounds 3] [--min-devices 1]
[--pause 2 0] [--postgres URL]``.

Each round fills the inbox through the real ingest path (one report from each of ``reports``
devices, one small CMS use case, not timed) and times one ``flush_inbox`` that moves them all;
the table gives the median round. ``--min-devices`` sets the policy's ``min_batch_devices``
(2 or more: every report carries a device pseudonym, and the flush counts distinct devices).
SQLite on a temporary file, once per ``--pause`` (the jobs' pause after each write
transaction, ``DPGOV_JOB_PAUSE``); PostgreSQL in a scratch schema when ``--postgres`` names a
server.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from sqlalchemy import Engine, text

from dp_governor.api.database import init_service_db
from dp_governor.budget import Ledger, create_db_engine
from dp_governor.budget.storage.db import PAUSE_FACTOR, scratch_schema
from dp_governor.pipeline.flush import flush_inbox
from dp_governor.pipeline.ingest import Ingestor, SubmitRequest
from dp_governor.pipeline.seal import InboxSeal
from dp_governor.policies import PolicyCreate, mechanism_for

SECRET = b"flush-bench-secret-flush-bench-secret"
SEAL = InboxSeal([b"flush-bench-shuffler-flush-bench-shuffler-flush-bench-shuffler"])
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
POLICY = {
    "name": "bench-flush",
    "mechanism": "cms",
    "k": 16,
    "m": 64,
    "epsilon_per_report": 2.0,
    "max_reports_per_day": 1000,
    "retention_days": 30,
}


def fill(ingestor: Ingestor, reports: int, round_no: int) -> None:
    """``reports`` accepted reports, one from each of as many fresh devices (not timed)."""
    mech = mechanism_for(PolicyCreate.model_validate(POLICY))
    rng = np.random.default_rng(round_no)
    for start in range(0, reports, 2_000):
        size = min(2_000, reports - start)
        bodies = mech.privatize([f"v{i % 10}" for i in range(size)], rng=rng).to_dicts()
        requests = [
            SubmitRequest(POLICY["name"], f"r{round_no}-d{start + i}", body)  # type: ignore[arg-type]
            for i, body in enumerate(bodies)
        ]
        ingestor.submit_group(requests, now=NOW)


def run(engine: Engine, reports: int, rounds: int, min_devices: int = 1) -> float:
    """Median reports moved per second over ``rounds`` fill-then-flush rounds."""
    init_service_db(engine)
    ledger = Ledger(engine, SECRET)
    extra = {"min_batch_devices": min_devices} if min_devices > 1 else {}
    ledger.policies.create(PolicyCreate.model_validate({**POLICY, **extra}))
    ingestor = Ingestor(ledger, SECRET, seal=SEAL)
    rates = []
    for r in range(rounds):
        fill(ingestor, reports, r)
        start = time.perf_counter()
        moved = flush_inbox(engine, seal=SEAL, min_batch=1)
        took = time.perf_counter() - start
        assert moved == reports, (moved, reports)
        rates.append(reports / took)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM inbox")).scalar_one() == 0
    return statistics.median(rates)


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and print one row per backend and size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-devices", type=int, default=1)
    parser.add_argument("--postgres", default=None)
    parser.add_argument(
        "--pause",
        type=float,
        nargs="+",
        default=[PAUSE_FACTOR, 0.0],
        help="SQLite job pauses to measure (DPGOV_JOB_PAUSE; default: the default and 0)",
    )
    args = parser.parse_args(argv)
    print("| backend | job pause | reports a flush | reports moved/s |")
    print("|---|---:|---:|---:|")
    for reports in args.reports:
        for pause in args.pause:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "flush.sqlite"
                engine = create_db_engine(f"sqlite:///{path}", job_pause=pause)
                rate = run(engine, reports, args.rounds, args.min_devices)
                engine.dispose()
            print(f"| sqlite | {pause:g} | {reports:,} | {rate:,.0f} |", flush=True)
        if args.postgres:
            with scratch_schema(args.postgres, "bflush") as url:
                engine = create_db_engine(url)
                rate = run(engine, reports, args.rounds, args.min_devices)
                engine.dispose()
            print(f"| postgresql | none | {reports:,} | {rate:,.0f} |", flush=True)


if __name__ == "__main__":
    main()

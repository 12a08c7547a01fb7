"""Retention on PostgreSQL: purging a day of charges, partitioned vs. one table; a Markdown table.

Usage: ``python -m benchmarks.partitions [--day-charges 1e7] [--compare 1e6] [--postgres URL]``.

In a fresh schema each: a day-partitioned ledger (what ``init_db`` creates) holding
``--day-charges`` charges on the day that just left the window plus 100,000 of today, and an
unpartitioned ledger (the pre-partitioning layout) holding ``--compare`` charges on that day.
The rows are generated server-side (``generate_series``; random 128-bit device keys). Then
``Ledger.purge`` runs and is timed: the partitioned ledger drops the day's partition, the
other deletes its rows one by one. Both check that exactly the old day's charges went.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import UTC, datetime

from sqlalchemy import Engine, text
from sqlmodel import SQLModel

from dp_governor.budget import Ledger, create_db_engine, init_db, utc_day
from dp_governor.budget.storage.db import scratch_schema
from dp_governor.budget.storage.partitions import ensure_partitions

NOW = datetime.now(UTC)
TODAY = utc_day(NOW)
OLD = TODAY - 90  # left the default 90-day window today


def _fill(engine: Engine, day: int, n: int) -> float:
    """Insert ``n`` emoji charges on ``day`` server-side; returns the seconds it took."""
    t0 = time.perf_counter()
    step = 1_000_000
    for start in range(0, n, step):
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO charges"
                    " (device_key, use_case, budget, policy_version, epsilon_micro, day)"
                    " SELECT substr(md5(random()::text || g::text), 1, 32), 'emoji', 'emoji', 1,"
                    " 4000000, :day FROM generate_series(1, :n) AS g"
                ),
                {"day": day, "n": min(step, n - start)},
            )
    with engine.begin() as conn:
        conn.execute(text("ANALYZE charges"))
    return time.perf_counter() - t0


def _purge(engine: Engine, expected: int) -> float:
    ledger = Ledger(engine, b"bench-secret-bench-secret-bench!!")
    ledger.policies.ensure_defaults()
    t0 = time.perf_counter()
    result = ledger.purge(now=NOW)
    seconds = time.perf_counter() - t0
    assert result.charges == expected, (result.charges, expected)
    with engine.connect() as conn:
        left = conn.execute(text("SELECT count(*) FROM charges WHERE day <= :d"), {"d": OLD})
        assert left.scalar_one() == 0
    return seconds


def run(url: str, n: int, *, partitioned: bool) -> tuple[float, float]:
    """Fill and purge one ledger layout in a fresh schema; (fill seconds, purge seconds)."""
    import dp_governor.budget.storage.tables
    import dp_governor.policies.model  # noqa: F401 - registers the tables for the one-table layout

    with scratch_schema(url, "bench_part" if partitioned else "bench_flat") as scoped:
        engine = create_db_engine(scoped)
        try:
            if partitioned:
                init_db(engine)
                ensure_partitions(engine, OLD, OLD)
            else:
                SQLModel.metadata.create_all(engine)  # the layout before partitioning
            fill = _fill(engine, OLD, n)
            _fill(engine, TODAY, 100_000)
            return fill, _purge(engine, n)
        finally:
            engine.dispose()


def main(argv: list[str] | None = None) -> None:
    """Run both layouts and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--day-charges", type=float, default=1e7)
    parser.add_argument("--compare", type=float, default=1e6)
    parser.add_argument("--postgres", default=os.environ.get("DPGOV_TEST_DATABASE_URL"))
    args = parser.parse_args(argv)
    if not args.postgres:
        raise SystemExit("--postgres URL (or DPGOV_TEST_DATABASE_URL) is required")
    print("| ledger layout | charges on the purged day | fill (s) | purge (s) | charges/s |")
    print("|---|---:|---:|---:|---:|")
    for label, partitioned, n in (
        ("partitioned by day (drop)", True, int(args.day_charges)),
        ("one table (delete)", False, int(args.compare)),
    ):
        fill, purge = run(args.postgres, n, partitioned=partitioned)
        print(f"| {label} | {n:,} | {fill:.1f} | {purge:.2f} | {n / purge:,.0f} |")


if __name__ == "__main__":
    main()

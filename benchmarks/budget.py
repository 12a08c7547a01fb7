"""Budget core benchmarks: gate throughput and population accounting; prints a Markdown table.

Usage: ``python -m benchmarks.budget [--devices 1000000] [--charges 20000]
[--postgres postgresql+psycopg://postgres@127.0.0.1:5432/test]``.

- gate: ``Ledger.charge`` in-process on a fresh database (Apple's default policies), each
  charge for a new device (so every one is accepted and written), single thread and 8 threads;
- window totals: ``dp_governor.budget.reporting.loss.window_totals`` (a chunked scan of the
accounts) over
  ``--devices`` devices with 1 to 5 Emoji charges each in the window (bulk-loaded with their
  accounts);
- tight bounds: ``dp_governor.budget.reporting.loss.population_window_loss`` for the same devices:
the
  optimal composition per device ledger, memoized by the ledger's multiset (hit rate reported).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Engine, text

from dp_governor.budget import Ledger, create_db_engine, init_db, utc_day
from dp_governor.budget.reporting.loss import population_window_loss, window_totals
from dp_governor.budget.rule.state import AccountState, state_columns
from dp_governor.budget.storage.db import scratch_schema

SECRET = b"benchmark-secret-benchmark-secret!!"
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)


@contextmanager
def database(kind: str, pg_url: str | None) -> Iterator[Engine]:
    """A fresh database: a SQLite file, or a throw-away PostgreSQL schema."""
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            engine = create_db_engine(f"sqlite:///{Path(tmp) / 'bench.sqlite'}")
            init_db(engine)
            yield engine
            engine.dispose()
        return
    assert pg_url is not None
    with scratch_schema(pg_url, "bench") as url:
        engine = create_db_engine(url, pool_size=16)
        init_db(engine)
        try:
            yield engine
        finally:
            engine.dispose()


def gate_throughput(engine: Engine, charges: int, threads: int) -> float:
    """Accepted charges per second."""
    ledger = Ledger(engine, SECRET)
    ledger.policies.ensure_defaults()
    tag = uuid.uuid4().hex[:6]
    for i in range(200):  # warm the pool and the statement caches
        ledger.charge(f"warm-{tag}-{i}", "emoji", now=NOW)
    t0 = time.perf_counter()
    if threads == 1:
        for i in range(charges):
            assert ledger.charge(f"d-{tag}-{i}", "emoji", now=NOW).accepted
    else:
        with ThreadPoolExecutor(threads) as pool:
            results = pool.map(
                lambda i: ledger.charge(f"d-{tag}-{i}", "emoji", now=NOW).accepted, range(charges)
            )
            assert all(results)
    return charges / (time.perf_counter() - t0)


def load_population(engine: Engine, ledger: Ledger, devices: int) -> int:
    """Bulk-load 1-5 Emoji charges per device in the window and their accounts; the charges."""
    day = utc_day(NOW)
    rows = []
    accounts = []
    for d in range(devices):
        key = ledger.device_key(f"pop-{d}")
        state = AccountState()
        for c in range(1 + d % 5):
            rows.append((key, "emoji", "emoji", 1, 4_000_000, day - c * 7))
            state.charge("emoji", day - c * 7, 4_000_000)
        accounts.append((key, *state_columns(state)))
    columns = "device_key, use_case, budget, policy_version, epsilon_micro, day"
    account_columns = "device_key, count, epsilon_micro, days, lifetime, oldest_day"
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        if engine.dialect.name == "sqlite":
            cur.execute("BEGIN")  # the engine's connections run without implicit transactions
            cur.executemany(f"INSERT INTO charges ({columns}) VALUES (?, ?, ?, ?, ?, ?)", rows)
            cur.executemany(
                f"INSERT INTO accounts ({account_columns}) VALUES (?, ?, ?, ?, ?, ?)", accounts
            )
        else:
            for table, names, values in (
                ("charges", columns, rows),
                ("accounts", account_columns, accounts),
            ):
                with cur.copy(f"COPY {table} ({names}) FROM STDIN") as copy:
                    for row in values:
                        copy.write_row(row)
        raw.commit()
    finally:
        raw.close()
    if engine.dialect.name != "sqlite":
        # what autovacuum does after a bulk load: statistics and the visibility map
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE charges"))
            conn.execute(text("VACUUM ANALYZE accounts"))
    return len(rows)


def accounting(engine: Engine, devices: int) -> list[str]:
    """Window totals and tight bounds over a bulk-loaded population."""
    ledger = Ledger(engine, SECRET)
    ledger.policies.ensure_defaults()
    t0 = time.perf_counter()
    n_rows = load_population(engine, ledger, devices)
    load = time.perf_counter() - t0
    t0 = time.perf_counter()
    totals = window_totals(ledger, now=NOW, use_case="emoji")
    window = time.perf_counter() - t0
    assert len(totals) == devices
    t0 = time.perf_counter()
    losses = population_window_loss(ledger, now=NOW, use_case="emoji")
    tight = time.perf_counter() - t0
    assert len(losses) == devices
    acc = ledger.accountant
    return [
        f"| {engine.dialect.name} | bulk load {n_rows:,d} charges | {load:.1f} s | |",
        f"| {engine.dialect.name} | window totals, {devices:,d} devices | {window:.2f} s | |",
        f"| {engine.dialect.name} | tight bounds, {devices:,d} devices | {tight:.2f} s"
        f" | memo hit rate {acc.hit_rate:.4%} ({acc.misses} distinct ledgers) |",
    ]


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1_000_000)
    parser.add_argument("--charges", type=int, default=20_000)
    parser.add_argument("--postgres", default=os.environ.get("DPGOV_TEST_DATABASE_URL"))
    args = parser.parse_args(argv)
    kinds = ["sqlite"] + (["postgresql"] if args.postgres else [])
    print("| backend | measurement | result | note |")
    print("|---|---|---|---|")
    for kind in kinds:
        for threads in (1, 8):
            with database(kind, args.postgres) as engine:
                rate = gate_throughput(engine, args.charges, threads)
            print(f"| {kind} | gate, {threads} thread(s) | {rate:,.0f} charges/s | |", flush=True)
        with database(kind, args.postgres) as engine:
            for row in accounting(engine, args.devices):
                print(row, flush=True)


if __name__ == "__main__":
    main()

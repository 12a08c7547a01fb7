"""Bulk ledger generator for the population benchmarks; prints a Markdown table.

Usage: ``python -m benchmarks.scale [--devices 10000 100000 1000000] [--days 30]
[--database-url URL] [--no-audit] [--reports] [--purge] [--measure] [--recompute]
[--partitions P]``.

Builds a ledger of ``--devices`` devices that report under Apple's default use cases
(:mod:`dp_governor.policies.defaults`) for ``--days`` days, as the gate would have written it,
without going through the gate's one-transaction-a-batch path: each report is decided by the
gate's own rule (:func:`dp_governor.budget.rule.decide.decide_on` on the terms of the gate's
policy book), its charge row and its audit entry are built by the gate's own code
(:func:`dp_governor.budget.gate.charge.charge_entry`, :meth:`AuditLog.append`), and the rows are
written with ``executemany`` in transactions of :data:`CHUNK` reports, the accounts once at the end
(:func:`dp_governor.budget.rule.state.state_columns`). tests/test_benchmark_scale.py checks, on a
sample, that the tables equal those the gate writes for the same reports, and that ``verify``
accepts them. With ``--reports``, each accepted report also gets a stored report (one published
batch per use case and day, as the flush would publish it), for the purge benchmark
(``--purge``: the retention purge of the older half of the history, timed).

What the generated ledger lacks: idempotency records (the reports carry no idempotency key),
inbox rows (every report is already published), the transparency log's leaves (the next
checkpoint job projects the audit log into it) and the stored reports' row tags.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Engine, text

from dp_governor.budget import Ledger, create_db_engine, init_db
from dp_governor.budget.clock import day_start
from dp_governor.budget.gate.charge import charge_entry
from dp_governor.budget.rule.decide import decide_on
from dp_governor.budget.rule.state import AccountState, state_columns
from dp_governor.budget.storage.db import placeholder, scratch_schema
from dp_governor.budget.storage.partitions import ensure_partitions
from dp_governor.pipeline.tables import STEP_ROWS
from dp_governor.policies.defaults import default_policies

__all__ = ["RATES", "Built", "analyze", "build", "main", "plan_day"]

SECRET = b"benchmark-secret-benchmark-secret!!"
FIRST_DAY = 20_000  # 2024-10-04: any UTC day; the generated days follow it
CHUNK = 50_000  # reports a transaction
RATES: dict[str, float] = {
    # chance that a device reports under the use case on a given day; with a second attempt
    # on 20% of those days, about 0.18 attempts and 0.15 charges a device-day in all
    "emoji": 0.05,
    "quicktype": 0.03,
    "lookup-hints": 0.02,
    "safari-energy-domains": 0.01,
    "safari-crash-domains": 0.01,
    "safari-autoplay": 0.01,
    "health-types": 0.02,
}
SECOND_ATTEMPT = 0.2


@dataclass(frozen=True, slots=True)
class Built:
    """What :func:`build` wrote and how long it took."""

    devices: int
    days: int
    attempts: int
    charges: int
    entries: int
    reports: int
    seconds: float


def device_id(i: int) -> str:
    """The generated device's id (only its keyed pseudonym is stored)."""
    return f"device-{i:09d}"


def noon(day: int) -> datetime:
    """The time every report of ``day`` is charged at (one audit timestamp a day)."""
    return day_start(day) + timedelta(hours=12)


def plan_day(devices: int, use_cases: Sequence[str], *, rng: np.random.Generator) -> np.ndarray:
    """One day's report attempts: rows ``(device, use case index)``, by device then use case.

    Each device reports under a use case with its :data:`RATES` chance, and once more on
    :data:`SECOND_ATTEMPT` of those days (refused where the daily cap is 1).
    """
    parts = []
    for u, name in enumerate(use_cases):
        active = np.flatnonzero(rng.random(devices) < RATES[name])
        again = active[rng.random(active.size) < SECOND_ATTEMPT]
        both = np.concatenate([active, again])
        parts.append(np.stack([both, np.full(both.size, u)], axis=1))
    plan = np.concatenate(parts) if parts else np.empty((0, 2), dtype=np.int64)
    return plan[np.lexsort((plan[:, 1], plan[:, 0]))]


def build(
    ledger: Ledger,
    *,
    devices: int,
    days: int,
    rng: np.random.Generator,
    audit: bool = True,
    reports: bool = False,
    retention_days: int | None = None,
    chunk: int = CHUNK,
) -> Built:
    """Write ``devices`` devices' reports over ``days`` days into ``ledger``'s empty database.

    Day by day, the attempts of :func:`plan_day` are decided in order against each device's
    state in memory; every ``chunk`` decisions the charges (and audit entries) go in one
    transaction. The accounts are written at the end. On a partitioned PostgreSQL ledger each
    generated day gets its partition first, as the service's days do (created ahead), so the
    purge drops whole days. ``retention_days`` replaces the defaults' 90 days (the purge
    benchmark keeps half the history).
    """
    t0 = time.perf_counter()
    defaults = default_policies()
    if retention_days is not None:
        defaults = [p.model_copy(update={"retention_days": retention_days}) for p in defaults]
    ledger.policies.write_all(defaults, actor="system")
    engine = ledger.gate.engine
    # each day its own partition, as the service creates them ahead (a no-op on SQLite)
    ensure_partitions(engine, FIRST_DAY, FIRST_DAY + days - 1)
    with engine.connect() as conn:
        book = ledger.gate.book(conn)
        terms = [ledger.gate.terms(conn, name) for name in RATES if name in book.terms]
    use_cases = [t.name for t in terms]
    keys = [ledger.device_key(device_id(i)) for i in range(devices)]
    states: list[AccountState | None] = [None] * devices
    ph = placeholder(engine)
    insert = (
        "INSERT INTO charges (id, device_key, use_case, budget, policy_version, epsilon_micro,"
        f" day, idempotency_key) VALUES ({', '.join([ph] * 8)})"
    )
    next_id = 1
    attempts = charges = entries = stored = 0
    batch_ids = iter(range(1, 1 + days * len(use_cases)))
    for day in range(FIRST_DAY, FIRST_DAY + days):
        plan = plan_day(devices, use_cases, rng=rng)
        attempts += len(plan)
        per_use_case: dict[str, list[str]] = {}
        for start in range(0, len(plan), chunk):
            rows: list[tuple[Any, ...]] = []
            decided = []
            for d, u in plan[start : start + chunk].tolist():
                state = states[d]
                if state is None:
                    state = states[d] = AccountState()
                t = terms[u]
                decision = decide_on(t, day, state, next_id)
                if decision.accepted:
                    rows.append((next_id, keys[d], t.name, t.budget, t.version, t.eps_micro, day))
                    per_use_case.setdefault(t.name, []).append(keys[d])
                    next_id += 1
                if audit:
                    tally = state.use_case_today(day, t.name) if decision.accepted else None
                    decided.append(charge_entry(keys[d], decision, t, None, tally))
            with engine.connect() as conn, conn.begin():
                cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
                cur.executemany(insert, [(*r, None) for r in rows])
                if decided:
                    ledger.audit.append(conn, decided, now=noon(day))
            charges += len(rows)
            entries += len(decided)
        if reports:
            stored += _publish(engine, per_use_case, day, batch_ids, rng=rng)
    _write_accounts(engine, keys, states, postgres=ledger.gate.postgres)
    if ledger.gate.postgres:
        with engine.begin() as conn:
            cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
            cur.execute(
                "SELECT setval(pg_get_serial_sequence('charges', 'id'), %s)", (max(next_id - 1, 1),)
            )
    analyze(engine)
    return Built(devices, days, attempts, charges, entries, stored, time.perf_counter() - t0)


def analyze(engine: Engine) -> None:
    """PostgreSQL: the planner's statistics of the bulk-loaded tables, as autovacuum keeps them.

    Without them (a server with autovacuum off, or before its next round) the planner guesses
    row counts, and a lookup of 500 keys can scan a whole level of ``tlog_nodes``.
    """
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))


def _write_accounts(
    engine: Engine, keys: list[str], states: list[AccountState | None], *, postgres: bool
) -> None:
    """Every device's account row, ``CHUNK`` rows a transaction (the gate's columns)."""
    ph = placeholder(engine)
    sql = (
        "INSERT INTO accounts (device_key, count, epsilon_micro, days, lifetime, oldest_day)"
        f" VALUES ({', '.join([ph] * 6)})"
    )
    rows = [(k, *state_columns(s)) for k, s in zip(keys, states, strict=True) if s is not None]
    rows.sort()  # key order: the primary key's order, so appends stay local
    for start in range(0, len(rows), CHUNK):
        with engine.connect() as conn, conn.begin():
            cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
            cur.executemany(sql, rows[start : start + CHUNK])


def _publish(
    engine: Engine,
    per_use_case: dict[str, list[str]],
    day: int,
    batch_ids: Iterator[int],
    *,
    rng: np.random.Generator,
) -> int:
    """One published batch a use case for ``day``: its stored reports and its part row."""
    ph = placeholder(engine)
    report_sql = (
        "INSERT INTO reports (id, use_case, params, day, payload, batch, tag)"
        f" VALUES ({', '.join([ph] * 7)})"
    )
    part_sql = (
        "INSERT INTO batch_parts (batch, params, day, use_case, reports, folded, charge_days)"
        f" VALUES ({', '.join([ph] * 7)})"
    )
    stored = 0
    for name, members in sorted(per_use_case.items()):
        batch = next(batch_ids)
        params = hashlib.sha256(name.encode()).hexdigest()
        # the flush's ids: a random 64-bit prefix for each move step of STEP_ROWS reports,
        # then the report's place in the step (pipeline.flush), so a step's ids are neighbours
        steps = [rng.bytes(8).hex() for _ in range(-(-len(members) // STEP_ROWS))]
        payload = '{"index": 1, "bits": "' + "01" * 32 + '"}'  # a CMS report's size
        rows = [
            (
                f"{steps[i // STEP_ROWS]}{i % STEP_ROWS:016x}",
                name,
                params,
                day,
                payload,
                batch,
                None,
            )
            for i in range(len(members))
        ]
        with engine.connect() as conn, conn.begin():
            cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
            for start in range(0, len(rows), CHUNK):
                cur.executemany(report_sql, rows[start : start + CHUNK])
            cur.execute(
                part_sql, (batch, params, day, name, len(rows), True, f'{{"{day}": {len(rows)}}}')
            )
        stored += len(rows)
    return stored


@contextmanager
def database(url: str | None) -> Iterator[Engine]:
    """A fresh database: a SQLite file in a temporary directory, or a scratch PostgreSQL schema."""
    if url is None or url.startswith("sqlite"):
        with tempfile.TemporaryDirectory(dir=os.environ.get("DPGOV_SCALE_DIR")) as tmp:
            engine = create_db_engine(url or f"sqlite:///{Path(tmp) / 'scale.sqlite'}")
            init_db(engine)
            try:
                yield engine
            finally:
                engine.dispose()
        return
    with scratch_schema(url, "scale") as scratch:
        engine = create_db_engine(scratch)
        init_db(engine)
        try:
            yield engine
        finally:
            engine.dispose()


def peak_rss_mib() -> float:
    """This process's peak resident set size so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def own_peak_rss_mib() -> float:
    """This process's own peak RSS, MiB: ``VmHWM``, which starts again at ``exec``.

    ``getrusage``'s maximum is carried over from the parent across ``fork`` and ``exec``.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return peak_rss_mib()


def main(argv: Sequence[str] | None = None) -> None:
    """Build a ledger per size and print what was written and how long it took."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--database-url", default=None, help="default: a temporary SQLite file")
    parser.add_argument("--no-audit", action="store_true", help="skip the audit log's entries")
    parser.add_argument("--reports", action="store_true", help="also store each report")
    parser.add_argument("--purge", action="store_true", help="then purge the older half")
    parser.add_argument(
        "--measure", action="store_true", help="time the report and a what-if (own processes)"
    )
    parser.add_argument(
        "--recompute",
        action="store_true",
        help="export the ledger, then time recompute streamed and in memory (own processes)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=0,
        help="time the report's pass single and over this many key ranges in as many processes",
    )
    parser.add_argument("--seed", type=int, default=33)
    args = parser.parse_args(argv)
    if args.days < 2 or min(args.devices) < 1:
        parser.error("--days must be at least 2 and --devices at least 1")
    print(
        "| devices | days | attempts | charges | audit entries | reports | build s"
        " | peak RSS MiB | report CPU s | report RSS MiB | what-if CPU s | what-if RSS MiB"
        " | purge s (CPU s) | purged charges | purged reports |"
    )
    print("|---" * 15 + "|")
    recomputed: list[tuple[int, int, float, dict[str, tuple[float, float]]]] = []
    split: list[tuple[int, float, float]] = []
    for n in args.devices:
        with database(args.database_url) as engine:
            ledger = Ledger(engine, SECRET)
            built = build(
                ledger,
                devices=n,
                days=args.days,
                rng=np.random.default_rng(args.seed),
                audit=not args.no_audit,
                reports=args.reports,
                retention_days=args.days // 2 if args.purge else None,
            )
            figures = ["", "", "", ""]
            if args.measure:
                url = engine.url.render_as_string(hide_password=False)
                done = measure(url, args.days)
                figures = [
                    f"{done[op][i]:.{1 - i}f}" for op in ("report", "what-if") for i in (0, 1)
                ]
            if args.recompute:
                recomputed.append((n, *measure_recompute(ledger, args.days)))
            if args.partitions:
                split.append((n, *measure_partitions(ledger, args.days, args.partitions)))
            purge_s, purged = "", ("", "")
            if args.purge:
                purge_s, purged = _purge_half(ledger, args.days)
            print(
                f"| {n:,} | {args.days} | {built.attempts:,} | {built.charges:,}"
                f" | {built.entries:,} | {built.reports:,} | {built.seconds:.1f}"
                f" | {peak_rss_mib():.0f} | {' | '.join(figures)}"
                f" | {purge_s} | {purged[0]} | {purged[1]} |",
                flush=True,
            )
    if recomputed:
        print(
            "\n| devices | export MiB | export s | streamed CPU s | streamed RSS MiB"
            " | in memory CPU s | in memory RSS MiB |"
        )
        print("|---" * 7 + "|")
        for n, size, took, done in recomputed:
            print(
                f"| {n:,} | {size / 2**20:.0f} | {took:.1f}"
                f" | {done['streamed'][0]:.1f} | {done['streamed'][1]:.0f}"
                f" | {done['in memory'][0]:.1f} | {done['in memory'][1]:.0f} |"
            )
    if split:
        ranges = f"{args.partitions} ranges (s, wall)"
        print(f"\n| devices | report pass, one process (s, wall) | {ranges} |")
        print("|---" * 3 + "|")
        for n, single, parallel in split:
            print(f"| {n:,} | {single:.1f} | {parallel:.1f} |")


def _open(url: str) -> Ledger:
    """The generated ledger at ``url``, opened in a worker of the partitioned pass."""
    return Ledger(create_db_engine(url), SECRET)


def measure_partitions(ledger: Ledger, days: int, partitions: int) -> tuple[float, float]:
    """Wall seconds of the report's full pass here, then over ``partitions`` processes."""
    import functools

    from dp_governor.budget.reporting.loss import effective_epsilon_basis
    from dp_governor.budget.reporting.partitioned import partitioned_basis

    now = noon(FIRST_DAY + days - 1)
    url = ledger.engine.url.render_as_string(hide_password=False)
    t0 = time.perf_counter()
    single = effective_epsilon_basis(ledger, now=now, full=True)
    t1 = time.perf_counter()
    merged = partitioned_basis(
        ledger,
        functools.partial(_open, url),
        now=now,
        partitions=partitions,
        workers=partitions,
        full=True,
    )
    t2 = time.perf_counter()
    assert merged == single, "the partitioned pass differs from the single one"
    return t1 - t0, t2 - t1


def _recomputed(path: str, operation: str, queue: Any) -> None:
    """Recompute the report of the export at ``path`` (spawned); its CPU seconds and peak RSS."""
    from dp_governor.budget.reporting.export import read_export, recompute, report_from_export

    t0 = time.process_time()
    if operation == "streamed":
        recompute(Path(path))
    else:
        report_from_export(read_export(Path(path)))
    queue.put((time.process_time() - t0, own_peak_rss_mib()))


def measure_recompute(
    ledger: Ledger, days: int
) -> tuple[int, float, dict[str, tuple[float, float]]]:
    """Export the ledger (size, seconds), then recompute it streamed and in memory, each alone."""
    import multiprocessing

    from dp_governor.budget.reporting.export import export_ledger

    spawn = multiprocessing.get_context("spawn")
    out = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("DPGOV_SCALE_DIR")) as tmp:
        path = Path(tmp) / "ledger.jsonl"
        t0 = time.perf_counter()
        with path.open("w", encoding="utf-8") as handle:
            export_ledger(ledger, handle, fmt="jsonl", now=noon(FIRST_DAY + days - 1))
        took = time.perf_counter() - t0
        for operation in ("streamed", "in memory"):
            queue = spawn.Queue()
            process = spawn.Process(target=_recomputed, args=(str(path), operation, queue))
            process.start()
            process.join()
            out[operation] = queue.get()
        return path.stat().st_size, took, out


def _measured(url: str, operation: str, queue: Any) -> None:
    """Run one population operation on the ledger at ``url``; its CPU seconds and peak RSS.

    Run in a process of its own (spawned, so that nothing of the generator's memory is
    counted), which reports through ``queue``.
    """
    from dp_governor.budget.reporting.loss import effective_epsilon_basis
    from dp_governor.budget.reporting.views import what_if
    from dp_governor.policies.model import PolicyCreate

    engine = create_db_engine(url)
    ledger = Ledger(engine, SECRET)
    now = noon(FIRST_DAY + int(queue.get()) - 1)
    t0 = time.process_time()
    if operation == "report":
        effective_epsilon_basis(ledger, now=now)
    else:
        current = ledger.policies.get("emoji")
        fields = current.model_dump(include=set(PolicyCreate.model_fields))
        proposed = PolicyCreate.model_validate(
            {**fields, "max_reports_per_day": current.max_reports_per_day + 1}
        )
        what_if(ledger, "emoji", proposed, now=now)
    queue.put((time.process_time() - t0, own_peak_rss_mib()))
    engine.dispose()


def measure(url: str, days: int) -> dict[str, tuple[float, float]]:
    """``{operation: (CPU seconds, peak RSS MiB)}`` of the report and a what-if, each alone."""
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    out = {}
    for operation in ("report", "what-if"):
        queue = spawn.Queue()
        queue.put(days)
        process = spawn.Process(target=_measured, args=(url, operation, queue))
        process.start()
        process.join()
        out[operation] = queue.get()
    return out


def _purged(url: str, days: int, queue: Any) -> None:
    """The retention purge on the last day (spawned: its CPU time is its own), timed."""
    from dp_governor.pipeline.purge import purge

    engine = create_db_engine(url)
    now = noon(FIRST_DAY + days - 1)
    t0, cpu = time.perf_counter(), time.process_time()
    result = purge(Ledger(engine, SECRET), now=now)
    queue.put((time.perf_counter() - t0, time.process_time() - cpu, result))
    engine.dispose()


def _purge_half(ledger: Ledger, days: int) -> tuple[str, tuple[str, str]]:
    """The retention purge on the last day (retention: half the days) in its own process."""
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    queue = spawn.Queue()
    url = ledger.engine.url.render_as_string(hide_password=False)
    process = spawn.Process(target=_purged, args=(url, days, queue))
    process.start()
    wall, cpu, result = queue.get()
    process.join()
    return f"{wall:.1f} ({cpu:.1f})", (f"{result['charges']:,}", f"{result['reports']:,}")


if __name__ == "__main__":
    main()

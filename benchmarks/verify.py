"""Incremental audit verify after one more day; prints a Markdown table.

Usage: ``python -m benchmarks.verify [--devices 1000000] [--days 10] [--charges 100000]
[--database-url URL] [--archive]``.

Builds a ledger with :func:`benchmarks.scale.build`, signs its head and projects the
transparency log (the checkpoint job's work), and verifies it in full (timed), which records
where the next verification starts. Then one more day of about ``--charges`` accepted reports goes
through the gate's batch path (:func:`dp_governor.budget.gate.charge.charge_batch`, 1,000 a
transaction), the checkpoint job signs again, and the incremental verification (what the
``verify`` job and ``dpgov audit verify`` run) is timed.

``--archive`` then archives every entry before the last verified checkpoint
(:meth:`dp_governor.budget.Ledger.archive`) and prints a second table: the audit log's rows and
stored size before and after (and after ``VACUUM FULL`` on PostgreSQL, where a DELETE leaves
dead rows until a vacuum), the archive file's size, the archive's time, and the full
verification's time without the file (from the archive's boundary) and with it (from the first
entry).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

import numpy as np
from sqlalchemy import Engine, text

from benchmarks.scale import (
    FIRST_DAY,
    RATES,
    SECRET,
    analyze,
    build,
    database,
    device_id,
    noon,
    plan_day,
)
from dp_governor.budget import Ledger
from dp_governor.budget.gate.charge import BatchItem, charge_batch

__all__ = ["main"]

BATCH = 1_000


def _timed(run: Callable[[], object]) -> tuple[float, float]:
    """Wall and CPU seconds of ``run()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def _verify(ledger: Ledger, *, full: bool, files: Sequence[Path] = ()) -> int:
    """One verification, recorded as the service records it; the entries it replayed."""
    verdict, state = ledger.verify(full=full, archive_files=files)
    assert verdict.ok, verdict
    ledger.verdicts.record(
        now=noon(FIRST_DAY),
        full=full,
        from_seq=verdict.from_seq,
        problem=None,
        resume=state.resume,
    )
    return verdict.entries


def _checkpoint(ledger: Ledger, day: int) -> None:
    """The checkpoint job: the chain's head signed, the transparency log projected and signed."""
    ledger.audit.checkpoint(now=noon(day) + timedelta(hours=11))
    ledger.tlog.sync()


def charge_day(
    ledger: Ledger, devices: int, day: int, charges: int, *, attempts: float = 1.2
) -> int:
    """About ``charges`` accepted reports of ``day`` through the gate; how many were accepted.

    Up to ``attempts`` times ``charges`` reports of the day's plan are sent, a relay's batch at
    a time, until ``charges`` are accepted (the caps refuse some).
    """
    use_cases = [name for name in RATES if name in ledger.book().terms]
    plan = plan_day(devices, use_cases, rng=np.random.default_rng(day))
    rng = np.random.default_rng(day + 1)
    attempts_made = plan[rng.permutation(len(plan))[: int(charges * attempts)]]
    items = [BatchItem(device_id(int(d)), use_cases[int(u)]) for d, u in attempts_made.tolist()]
    accepted = 0
    for start in range(0, len(items), BATCH):
        results = charge_batch(ledger.gate, items[start : start + BATCH], now=noon(day))
        accepted += sum(int(getattr(r, "accepted", False)) for r in results)
        if accepted >= charges:
            break
    return accepted


def _log_size(engine: Engine) -> tuple[int, int]:
    """The audit log's rows and stored bytes.

    PostgreSQL: table, indexes and TOAST; SQLite: its table's and primary key's pages (``dbstat``).
    """
    with engine.connect() as conn:
        rows = int(conn.execute(text("SELECT count(*) FROM audit_log")).scalar_one())
        if engine.dialect.name == "postgresql":
            size = conn.execute(text("SELECT pg_total_relation_size('audit_log')")).scalar_one()
        else:
            size = conn.execute(
                text(
                    "SELECT sum(pgsize) FROM dbstat"
                    " WHERE name IN ('audit_log', 'sqlite_autoindex_audit_log_1')"
                )
            ).scalar_one()
    return rows, int(size or 0)


def _archive_table(ledger: Ledger, day: int) -> None:
    """Archive up to the last verified checkpoint; sizes and the full verify's times, a table."""
    before = _log_size(ledger.engine)
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "audit-archive.jsonl.gz"
        archive_s = _timed(lambda: ledger.archive(through=None, out=out, now=noon(day)))
        after = _log_size(ledger.engine)
        if ledger.engine.dialect.name == "postgresql":  # DELETE leaves dead rows until a vacuum
            with ledger.engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").execute(
                    text("VACUUM FULL audit_log")
                )
        returned = _log_size(ledger.engine)
        without_s = _timed(lambda: _verify(ledger, full=True))
        with_s = _timed(lambda: _verify(ledger, full=True, files=[out]))
        file_size = out.stat().st_size
    print()
    print(
        "| backend | audit_log rows before | after | stored MiB before | after | after a vacuum"
        " | archive file MiB | archive s (CPU) | full verify without the file s (CPU)"
        " | with --archive s (CPU) |"
    )
    print("|---" * 10 + "|")
    mib = 1 << 20
    print(
        f"| {ledger.engine.dialect.name} | {before[0]:,} | {after[0]:,} | {before[1] / mib:.1f}"
        f" | {after[1] / mib:.1f} | {returned[1] / mib:.1f} | {file_size / mib:.1f}"
        f" | {archive_s[0]:.1f}"
        f" ({archive_s[1]:.1f}) | {without_s[0]:.1f} ({without_s[1]:.1f}) | {with_s[0]:.1f}"
        f" ({with_s[1]:.1f}) |",
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Build, verify in full, add a day, verify incrementally; both verifications timed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=10)
    parser.add_argument("--charges", type=int, default=100_000)
    parser.add_argument("--database-url", default=None, help="default: a temporary SQLite file")
    parser.add_argument(
        "--archive",
        action="store_true",
        help="then archive up to the last verified checkpoint and time the full verification"
        " with and without the archive file",
    )
    args = parser.parse_args(argv)
    if args.days < 1 or args.devices < 1 or args.charges < 1:
        parser.error("--days, --devices and --charges must be at least 1")
    with database(args.database_url) as engine:
        ledger = Ledger(engine, SECRET)
        build(ledger, devices=args.devices, days=args.days, rng=np.random.default_rng(33))
        last = FIRST_DAY + args.days - 1
        _checkpoint(ledger, last)
        analyze(engine)  # the transparency log's tables, filled by the checkpoint job's sync
        full_s = _timed(lambda: _verify(ledger, full=True))
        day = last + 1
        added = charge_day(ledger, args.devices, day, args.charges)
        _checkpoint(ledger, day)
        replayed: list[int] = []
        incremental_s = _timed(lambda: replayed.append(_verify(ledger, full=False)))
        print(
            "| backend | devices | days | entries | charges of the new day | entries replayed"
            " | full verify before the day s (CPU) | incremental verify after it s (CPU) |"
        )
        print("|---" * 8 + "|")
        print(
            f"| {engine.dialect.name} | {args.devices:,} | {args.days} + 1"
            f" | {ledger.audit.head()[0]:,} | {added:,} | {replayed[0]:,}"
            f" | {full_s[0]:.1f} ({full_s[1]:.1f}) | {incremental_s[0]:.1f}"
            f" ({incremental_s[1]:.1f}) |",
            flush=True,
        )
        if args.archive:
            _archive_table(ledger, day)


if __name__ == "__main__":
    main()

"""The effective-epsilon report in full and from its stored summary; prints a Markdown table.

Usage: ``python -m benchmarks.incremental [--devices 10000 100000] [--days 30]
[--charges 10000] [--retention DAYS] [--database-url URL]``.

Builds a ledger of ``--devices`` devices over ``--days`` days (:func:`benchmarks.scale.build`,
Apple's default use cases; ``--retention`` replaces their 90 days, so that the next day moves
every window), runs the report with ``full=True`` (every account read, the
summary stored), charges ``--charges`` reports through the gate on the next day (batches of
:data:`BATCH`, random devices and use cases, some refused by the daily caps), then runs the
report again, which starts from the summary. Each report runs in a process of its own (spawned:
CPU seconds and peak RSS are its own); the second also checks its basis equals a full pass's.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.scale import FIRST_DAY, SECRET, build, database, device_id, noon, own_peak_rss_mib
from dp_governor.budget import Ledger, create_db_engine
from dp_governor.budget.gate.charge import BatchItem, charge_batch

__all__ = ["main"]

BATCH = 500  # reports a gate transaction
USE_CASES = ("emoji", "lookup-hints", "quicktype", "safari-autoplay")


def _report(url: str, day: int, full: bool, queue: Any) -> None:
    """One report at noon of ``day`` (spawned); its CPU seconds, peak RSS, equal to full."""
    from dp_governor.budget.reporting.loss import effective_epsilon_basis

    engine = create_db_engine(url)
    ledger = Ledger(engine, SECRET)
    now = noon(day)
    t0 = time.process_time()
    basis = effective_epsilon_basis(ledger, now=now, full=full)
    cpu = time.process_time() - t0
    rss = own_peak_rss_mib()
    equal = full or basis == effective_epsilon_basis(ledger, now=now, full=True)
    queue.put((cpu, rss, equal))
    engine.dispose()


def _measured(url: str, day: int, full: bool) -> tuple[float, float, bool]:
    spawn = multiprocessing.get_context("spawn")
    queue = spawn.Queue()
    process = spawn.Process(target=_report, args=(url, day, full, queue))
    process.start()
    out: tuple[float, float, bool] = queue.get()
    process.join()
    return out


def _charge_day(ledger: Ledger, devices: int, charges: int, day: int, seed: int) -> int:
    """``charges`` reports on ``day`` through the gate; how many were accepted."""
    rng = np.random.default_rng(seed)
    who = rng.integers(devices, size=charges)
    what = rng.integers(len(USE_CASES), size=charges)
    items = [
        BatchItem(device_id(int(d)), USE_CASES[int(u)]) for d, u in zip(who, what, strict=True)
    ]
    accepted = 0
    for start in range(0, len(items), BATCH):
        results = charge_batch(ledger.gate, items[start : start + BATCH], now=noon(day))
        accepted += sum(1 for r in results if getattr(r, "accepted", False))
    return accepted


def main(argv: Sequence[str] | None = None) -> None:
    """Build a ledger per size; print the full and the incremental report's figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[10_000])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--charges", type=int, default=10_000)
    parser.add_argument("--retention", type=int, default=None, help="days (default: 90)")
    parser.add_argument("--database-url", default=None, help="default: a temporary SQLite file")
    parser.add_argument("--seed", type=int, default=33)
    args = parser.parse_args(argv)
    if args.days < 2 or min(args.devices) < 1 or args.charges < 0:
        parser.error("--days must be at least 2, --devices at least 1, --charges at least 0")
    print(
        "| devices | days | charges next day (accepted) | full report CPU s | full RSS MiB"
        " | incremental report CPU s | incremental RSS MiB | equal to full |"
    )
    print("|---" * 8 + "|")
    for n in args.devices:
        with database(args.database_url) as engine:
            ledger = Ledger(engine, SECRET)
            rng = np.random.default_rng(args.seed)
            build(ledger, devices=n, days=args.days, rng=rng, retention_days=args.retention)
            url = engine.url.render_as_string(hide_password=False)
            last = FIRST_DAY + args.days - 1
            full_cpu, full_rss, _ = _measured(url, last, True)
            accepted = _charge_day(ledger, n, args.charges, last + 1, args.seed)
            inc_cpu, inc_rss, equal = _measured(url, last + 1, False)
            print(
                f"| {n:,} | {args.days} | {args.charges:,} ({accepted:,}) | {full_cpu:.2f}"
                f" | {full_rss:.0f} | {inc_cpu:.2f} | {inc_rss:.0f} | {'yes' if equal else 'NO'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()

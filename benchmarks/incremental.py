"""The report or the what-if in full and from its stored summary; prints a Markdown table.

Usage: ``python -m benchmarks.incremental [--devices 10000 100000] [--days 30]
[--charges 1000 10000] [--retention DAYS] [--measure report|what-if] [--database-url URL]``.

Builds a ledger of ``--devices`` devices over ``--days`` days (:func:`benchmarks.scale.build`,
Apple's default use cases; ``--retention`` replaces their 90 days, so that the next day moves
every window), runs the report with ``full=True`` (every account read, the
summary stored), charges ``--charges`` reports through the gate on the next day (batches of
:data:`BATCH`, random devices and use cases, some refused by the daily caps), then runs the
report again, which starts from the summary. Each report runs in a process of its own (spawned:
CPU seconds and peak RSS are its own); the second also checks its basis equals a full pass's.
With several ``--charges``, each is a further day: a full pass, then that many charges the day
after. ``--measure what-if`` runs the what-if of :data:`PROPOSAL` (tighter caps on emoji)
instead of the report: its device sums (what reads the ledger; the effective-epsilon lines
then composed are the same work whatever the ledger), and checks the what-if from the summary
equals the what-if in full.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import numpy as np

from benchmarks.scale import FIRST_DAY, SECRET, build, database, device_id, noon, own_peak_rss_mib
from dp_governor.budget import Ledger, create_db_engine
from dp_governor.budget.gate.charge import BatchItem, charge_batch
from dp_governor.budget.reporting.loss import effective_epsilon_basis
from dp_governor.budget.reporting.views import what_if
from dp_governor.budget.reporting.what_if_summary import PolicyWhatIf, what_if_sums
from dp_governor.policies import PolicyCreate
from dp_governor.policies.model import Policy

__all__ = ["main"]

BATCH = 500  # reports a gate transaction
USE_CASES = ("emoji", "lookup-hints", "quicktype", "safari-autoplay")
PROPOSAL = {"max_reports_per_day": 1, "window_epsilon_cap": 8.0, "lifetime_epsilon_cap": 40.0}


def _proposal(ledger: Ledger) -> tuple[PolicyCreate, list[Policy]]:
    """:data:`PROPOSAL` on emoji, and its version as a write would make it."""
    emoji = ledger.policies.get("emoji").model_dump(include=set(PolicyCreate.model_fields))
    proposed = PolicyCreate.model_validate({**emoji, **PROPOSAL})
    with ledger.engine.connect() as conn:
        return proposed, ledger.policies.proposed(conn, [proposed])


def _measure(ledger: Ledger, measure: str, now: datetime, full: bool) -> None:
    """The report's basis, or the what-if's device sums (the part that reads the ledger)."""
    if measure == "report":
        effective_epsilon_basis(ledger, now=now, full=full)
        return
    proposed, rows = _proposal(ledger)
    what_if_sums(ledger, PolicyWhatIf(ledger.book(), "emoji", [proposed], rows), now=now, full=full)


def _equal(ledger: Ledger, measure: str, now: datetime) -> bool:
    """Whether the report or what-if from the summary equals the one in full, at ``now``."""
    if measure == "report":
        return effective_epsilon_basis(ledger, now=now) == effective_epsilon_basis(
            ledger, now=now, full=True
        )
    proposed, _ = _proposal(ledger)
    from_summary = what_if(ledger, "emoji", proposed, now=now)
    return from_summary == what_if(ledger, "emoji", proposed, now=now, full=True)


def _report(url: str, measure: str, day: int, full: bool, queue: Any) -> None:
    """One report or what-if at noon of ``day`` (spawned); CPU seconds, peak RSS, equal to full."""
    engine = create_db_engine(url)
    ledger = Ledger(engine, SECRET)
    now = noon(day)
    t0 = time.process_time()
    _measure(ledger, measure, now, full)
    cpu = time.process_time() - t0
    rss = own_peak_rss_mib()
    queue.put((cpu, rss, full or _equal(ledger, measure, now)))
    engine.dispose()


def _measured(url: str, measure: str, day: int, full: bool) -> tuple[float, float, bool]:
    spawn = multiprocessing.get_context("spawn")
    queue = spawn.Queue()
    process = spawn.Process(target=_report, args=(url, measure, day, full, queue))
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
    parser.add_argument("--charges", type=int, nargs="+", default=[10_000])
    parser.add_argument("--retention", type=int, default=None, help="days (default: 90)")
    parser.add_argument("--database-url", default=None, help="default: a temporary SQLite file")
    parser.add_argument("--measure", choices=("report", "what-if"), default="report")
    parser.add_argument("--seed", type=int, default=33)
    args = parser.parse_args(argv)
    if args.days < 2 or min(args.devices) < 1 or min(args.charges) < 0:
        parser.error("--days must be at least 2, --devices at least 1, --charges at least 0")
    what = args.measure
    print(
        f"| devices | days | charges next day (accepted) | full {what} CPU s | full RSS MiB"
        f" | incremental {what} CPU s | incremental RSS MiB | equal to full |"
    )
    print("|---" * 8 + "|")
    for n in args.devices:
        with database(args.database_url) as engine:
            ledger = Ledger(engine, SECRET)
            rng = np.random.default_rng(args.seed)
            build(ledger, devices=n, days=args.days, rng=rng, retention_days=args.retention)
            url = engine.url.render_as_string(hide_password=False)
            day = FIRST_DAY + args.days - 1
            for k, charges in enumerate(args.charges):
                full_cpu, full_rss, _ = _measured(url, what, day, True)
                accepted = _charge_day(ledger, n, charges, day + 1, args.seed + k)
                day += 1
                inc_cpu, inc_rss, equal = _measured(url, what, day, False)
                print(
                    f"| {n:,} | {args.days} | {charges:,} ({accepted:,}) | {full_cpu:.2f}"
                    f" | {full_rss:.0f} | {inc_cpu:.2f} | {inc_rss:.0f}"
                    f" | {'yes' if equal else 'NO'} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()

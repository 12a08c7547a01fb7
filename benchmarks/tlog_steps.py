"""The transparency log's sync by step size: each write's time, the CPU and the throughput.

Usage: ``python -m benchmarks.tlog_steps [--entries 100000] [--steps 5000 500] [--pause 2]``.

For each step size, a fresh SQLite ledger gets ``entries`` charge entries (as
``benchmarks.tlog`` writes them), then :meth:`TransparencyLog.sync` runs with that many
entries at most a step and the engine's job pause (``DPGOV_JOB_PAUSE``, default 2). A row gives
the write transactions (each step's store, its commit included: how long it held SQLite's
write lock), the sync's wall and CPU time and its entries a second.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.budget import SECRET
from benchmarks.job_latency import WriteTimes
from benchmarks.tlog import _append
from dp_governor.api.database import init_service_db
from dp_governor.budget import create_db_engine
from dp_governor.budget.audit import tlog
from dp_governor.budget.audit.log import AuditLog, derive_audit_key

HEADER = (
    "| entries a step | writes | write p50 / p90 / max ms | sync wall s | sync CPU s | entries/s |"
    "\n|---:|---:|---|---:|---:|---:|"
)


def run(entries: int, step: int, pause: float) -> str:
    """One sync of ``entries`` in steps of ``step`` on a fresh ledger; its table row."""
    default = tlog._STEP_ENTRIES
    tlog._STEP_ENTRIES = step
    try:
        with tempfile.TemporaryDirectory() as folder:
            engine = create_db_engine(f"sqlite:///{Path(folder) / 'steps.sqlite'}", job_pause=pause)
            init_service_db(engine)
            key = derive_audit_key(SECRET)
            _append(AuditLog(engine, key), engine, entries)
            log = tlog.TransparencyLog(engine, key)
            held = WriteTimes(engine)
            cpu, wall = time.process_time(), time.perf_counter()
            point = log.sync()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            assert point is not None and point.size == entries
            engine.dispose()
    finally:
        tlog._STEP_ENTRIES = default
    ms = np.asarray(held.ms)
    p50, p90 = np.percentile(ms, [50, 90])
    return (
        f"| {step:,} | {len(ms):,} | {p50:.1f} / {p90:.1f} / {ms.max():.1f} | {wall:.2f}"
        f" | {cpu:.2f} | {entries / wall:,.0f} |"
    )


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and print one row per step size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000, help="audit entries to sign")
    parser.add_argument("--steps", type=int, nargs="+", default=[5_000, 500], help="step sizes")
    parser.add_argument("--pause", type=float, default=2.0, help="the job pause (0: none)")
    args = parser.parse_args(argv)
    if args.entries < 1 or min(args.steps) < 1 or args.pause < 0:
        parser.error("--entries and --steps must be positive, --pause at least 0")
    print(HEADER, flush=True)
    for step in args.steps:
        print(run(args.entries, step, args.pause), flush=True)


if __name__ == "__main__":
    main()

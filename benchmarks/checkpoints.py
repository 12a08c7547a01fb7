"""The checkpoint job and verify against the number of checkpoints stored; prints a Markdown table.

Usage: ``python -m benchmarks.checkpoints [--entries 10000] [--checkpoints 100 10000]
[--runs 20] [--postgres postgresql+psycopg://postgres@127.0.0.1:5432/test]``.

For each count of checkpoints, a fresh ledger gets the same ``entries`` audit entries, signed
(both logs, as the checkpoint job signs them) every ``entries / count`` entries, and the kept
checkpoint file written. Then it times, as medians of ``runs``: the ``checkpoint`` job
(:func:`dp_governor.api.jobs.run_job`, with its lease and the kept file's append) after one new
entry, and with nothing new (the idle run every interval makes); then one full ``verify`` of the
ledger against the kept file (the chain, the state, the transparency log), with its time and
the peak of Python's allocations during it (``tracemalloc``, a second run), and an
incremental ``verify`` after one more entry and job run (the ``verify`` job's). The entries are the
same in every row, so what changes between rows is the checkpoints alone.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Engine

from benchmarks.budget import SECRET
from dp_governor.api._integrity import kept_checkpoints
from dp_governor.api.jobs import RUNTIMES, Runtime, run_job
from dp_governor.budget import FixedClock, Ledger, create_db_engine, init_db
from dp_governor.budget.audit.log import write_checkpoints
from dp_governor.budget.storage.db import scratch_schema
from dp_governor.pipeline.ingest import Ingestor
from dp_governor.pipeline.seal import InboxSeal

__all__ = ["main"]

NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
SEAL = InboxSeal([b"bench-shuffler-bench-shuffler-bench-shuffler"])
KEY = "bench-checkpoints"


def _record(ledger: Ledger, i: int) -> None:
    ledger.audit.record("system", "bench", {"i": i}, now=NOW)


def _build(ledger: Ledger, entries: int, checkpoints: int, kept: Path) -> None:
    """``entries`` entries, both logs signed every ``entries / checkpoints``, the file written."""
    every = max(entries // checkpoints, 1)
    for i in range(entries):
        _record(ledger, i)
        if (i + 1) % every == 0:
            ledger.tlog.sync()
            ledger.audit.checkpoint(now=NOW)
    write_checkpoints(ledger.audit.checkpoints(), kept)


def _median(run: Callable[[], object], runs: int, before: Callable[[], object]) -> float:
    """The median wall seconds of ``run()`` over ``runs`` runs, ``before()`` untimed each time."""
    times = []
    for _ in range(runs):
        before()
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def _job() -> None:
    result = run_job("checkpoint", KEY, force=True)
    assert result is not None


def _new_entry_signed(ledger: Ledger) -> None:
    """One more entry and the job's run that signs it (before an incremental verify)."""
    _record(ledger, -1)
    _job()


def _verify(ledger: Ledger, kept: Path, *, full: bool = True) -> None:
    """One verification against the kept file, recorded as the service records it."""
    verdict, state = ledger.verify(kept=kept_checkpoints(kept).points, full=full)
    assert verdict.ok, verdict
    resume = state.resume
    ledger.verdicts.record(
        now=NOW, full=full, from_seq=verdict.from_seq, problem=None, resume=resume
    )


def _row(engine: Engine, backend: str, entries: int, count: int, runs: int) -> str:
    ledger = Ledger(engine, SECRET)
    ledger.policies.ensure_defaults()
    with tempfile.TemporaryDirectory() as tmp:
        kept = Path(tmp) / "checkpoints.jsonl"
        began = time.perf_counter()
        _build(ledger, entries, count, kept)
        built = time.perf_counter() - began
        RUNTIMES[KEY] = Runtime(
            ledger, Ingestor(ledger, SECRET, seal=SEAL), FixedClock(NOW), checkpoint_file=kept
        )
        try:
            _job()  # warm
            busy = _median(_job, runs, lambda: _record(ledger, -1))
            cpu = time.process_time()
            idle = _median(_job, runs, lambda: None)
            idle_cpu = (time.process_time() - cpu) / runs
            verify = _median(lambda: _verify(ledger, kept), 3, lambda: None)
            tracemalloc.start()
            _verify(ledger, kept)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            incremental = _median(
                lambda: _verify(ledger, kept, full=False),
                3,
                lambda: _new_entry_signed(ledger),
            )
        finally:
            RUNTIMES.pop(KEY, None)
    stored = ledger.audit.checkpoints()
    return (
        f"| {backend} | {len(stored):,} | {built:.1f} s | {busy * 1000:.1f} ms |"
        f" {idle * 1000:.1f} ms ({idle_cpu * 1000:.1f} ms CPU) | {verify:.2f} s |"
        f" {peak / 2**20:.1f} MiB | {incremental * 1000:.0f} ms |"
    )


def main(argv: list[str] | None = None) -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--checkpoints", type=int, nargs="+", default=[100, 10_000])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--postgres", default=None, help="also on this PostgreSQL server")
    args = parser.parse_args(argv)
    print(
        "| backend | checkpoints stored | built in | job, one new entry | job, nothing new |"
        " full verify | verify's peak allocations | incremental verify, one new entry |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for count in args.checkpoints:
        with tempfile.TemporaryDirectory() as tmp:
            engine = create_db_engine(f"sqlite:///{Path(tmp) / 'bench.sqlite'}", job_pause=0)
            init_db(engine)
            print(_row(engine, "SQLite", args.entries, count, args.runs), flush=True)
            engine.dispose()
        if args.postgres:
            with scratch_schema(args.postgres, "ckbench") as url:
                engine = create_db_engine(url)
                init_db(engine)
                try:
                    print(_row(engine, "PostgreSQL", args.entries, count, args.runs), flush=True)
                finally:
                    engine.dispose()


if __name__ == "__main__":
    main()

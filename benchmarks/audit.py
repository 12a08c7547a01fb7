"""Audit log benchmark: append and verify a million entries; prints a Markdown table.

Usage: ``python -m benchmarks.audit [--entries 1000000]
[--postgres postgresql+psycopg://postgres@127.0.0.1:5432/test]``.

Entries are realistic charge decisions (device pseudonym, use case, budget, version,
micro-epsilon, day, outcome, charge id), appended through ``AuditLog.append`` in transactions
of 10,000 (as the relay batch path writes them); then ``AuditLog.verify`` checks the chain,
every tag and a checkpoint. Target: 1,000,000 entries verified in under 10 s.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

from benchmarks.budget import NOW, SECRET, database
from dp_governor.budget.audit.log import AuditLog, Entry, derive_audit_key
from dp_governor.budget.storage.db import writer

CHUNK = 10_000


def run(kind: str, pg_url: str | None, entries: int) -> str:
    """Append and verify on one backend; returns a table row."""
    with database(kind, pg_url) as engine:
        log = AuditLog(engine, derive_audit_key(SECRET))
        t0 = time.perf_counter()
        for start in range(0, entries, CHUNK):
            batch = [
                Entry(
                    f"device:{(i * 2654435761) % (1 << 64):032x}",
                    "charge",
                    {
                        "use_case": "emoji",
                        "budget": "emoji",
                        "policy_version": 1,
                        "epsilon_micro": 4_000_000,
                        "day": 20_779,
                        "accepted": i % 7 != 0,
                        "reason": "accepted" if i % 7 else "daily_cap",
                        "charge_id": i,
                    },
                )
                for i in range(start, min(entries, start + CHUNK))
            ]
            with writer(engine).begin() as conn:
                log.append(conn, batch, now=NOW)
        appended = time.perf_counter() - t0
        log.checkpoint(now=NOW)
        t1 = time.perf_counter()
        result = log.verify()
        verified = time.perf_counter() - t1
        assert result.ok and result.entries == entries, result
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return (
        f"| {kind} | {entries:,} | {entries / appended:,.0f} /s | {verified:.2f} s"
        f" | {entries / verified:,.0f} /s | {peak:,.0f} MiB |"
    )


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--postgres", default=os.environ.get("DPGOV_TEST_DATABASE_URL"))
    args = parser.parse_args(argv)
    print("| backend | entries | append | verify (target < 10 s) | verify rate | peak RSS |")
    print("|---|---|---|---|---|---|")
    print(run("sqlite", None, args.entries), flush=True)
    if args.postgres:
        print(run("postgresql", args.postgres, args.entries), flush=True)


if __name__ == "__main__":
    main()

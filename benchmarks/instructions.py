"""Instructions per report on the relay's batch path, counted by valgrind; prints a table.

Usage: ``python -m benchmarks.instructions [--batch 2000] [--batches 2] [--tlog]``.

Wall-clock figures on a shared virtual machine move by tens of percent from one minute to the
next; an instruction count does not (repeatable to about 0.3% here), so this is the figure to
compare two versions of the relay path by. The benchmark runs itself under valgrind's callgrind
(Debian package ``valgrind``) with instrumentation off: the child process builds a fresh SQLite
ledger with the default policies, charges two untimed batches and builds the timed ones, says
``READY``, and this process switches instrumentation on with ``callgrind_control`` for exactly
the timed :meth:`dp_governor.pipeline.ingest.Ingestor.submit_many` calls, as
:mod:`benchmarks.relay` times them (automatic checkpoints off, every item a new device). Everything
the path does is counted: Python, SQLite, hashing.

``--tlog`` also counts, after the batches, the checkpoint job's transparency-log step for
their entries (:meth:`~dp_governor.budget.audit.tlog.TransparencyLog.sync`: each entry
projected to its leaf with its label, hashed into the tree, stored, one checkpoint signed; the
warm-up batches' entries are signed before the count starts): a second row gives the log's
instructions a report beside the path's.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GO, DONE = "go", "done"
PATH_DONE, GO_TLOG = "path-done", "go-tlog"


def child(size: int, batches: int, signals: Path, *, tlog: bool = False) -> None:
    """Inside valgrind: set up, say READY, wait for ``go``, run the batches, write ``done``.

    ``done`` appears by an atomic rename of a finished file, so it is never seen empty.
    """
    from benchmarks.budget import database
    from benchmarks.relay import NOW, USE_CASE, _items, no_autocheckpoint, prepare

    with database("sqlite", None) as engine:
        ingestor, reports = prepare(engine)
        for _ in range(2):
            ingestor.submit_many(USE_CASE, _items(reports, size), now=NOW)
        no_autocheckpoint(engine)
        log = ingestor.ledger.tlog
        if tlog:
            log.sync()  # the warm-up batches' entries: only the timed ones are counted
        timed = [_items(reports, size) for _ in range(batches)]
        gc.freeze()  # as the service does after start-up
        print("READY", flush=True)
        while not (signals / GO).exists():
            time.sleep(0.02)
        accepted = 0
        for items in timed:
            results = ingestor.submit_many(USE_CASE, items, now=NOW)
            accepted += sum(1 for r in results if r.decision is not None and r.decision.accepted)
        if tlog:
            (signals / PATH_DONE).touch()  # the path's count ends here, the log's starts
            while not (signals / GO_TLOG).exists():
                time.sleep(0.02)
            log.sync()
        # Write, then rename: the parent sees `done` only once it holds the whole count.
        partial = signals / (DONE + ".partial")
        partial.write_text(str(accepted))
        os.replace(partial, signals / DONE)


def _totals(path: Path) -> int:
    """The instruction total of one callgrind output file."""
    counts = [
        int(line.split()[1])
        for line in path.read_text().splitlines()
        if line.startswith(("summary:", "totals:"))
    ]
    if not counts:
        raise SystemExit(f"callgrind wrote no totals in {path.name}")
    return max(counts)


def measure(size: int, batches: int, *, tlog: bool = False) -> tuple[int, int, int | None]:
    """``(instructions, reports accepted, the log's instructions)``, counted in a child process.

    With ``tlog``, the path's count is dumped when the batches are done and the log's when its
    sync is (numbered files, each dump zeroing the count); otherwise the log's figure is ``None``.
    """
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (Debian package valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        signals = Path(tmp)
        out = signals / "callgrind.out"
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "benchmarks.instructions",
            "--child",
            str(signals),
            "--batch",
            str(size),
            "--batches",
            str(batches),
            *(["--tlog"] if tlog else []),
        ]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        log = signals / "valgrind.log"

        def wait_for(name: str) -> None:
            while not (signals / name).exists():
                if proc.poll() is not None:
                    raise SystemExit("the child failed while it was measured")
                time.sleep(0.05)

        with (
            log.open("w") as stderr,
            subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env
            ) as proc,
        ):
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.strip() == "READY":
                    break
            else:
                raise SystemExit(f"the child exited before it was ready:\n{log.read_text()}")
            control = ["callgrind_control", "--instr=on", str(proc.pid)]
            subprocess.run(control, check=True, capture_output=True)
            (signals / GO).touch()
            if tlog:
                wait_for(PATH_DONE)
                dump = ["callgrind_control", "--dump=path", str(proc.pid)]
                subprocess.run(dump, check=True, capture_output=True)  # the path's count, zeroed
                (signals / GO_TLOG).touch()
            wait_for(DONE)
            if tlog:
                dump = ["callgrind_control", "--dump=tlog", str(proc.pid)]
                subprocess.run(dump, check=True, capture_output=True)  # the log's count
            control[1] = "--instr=off"
            subprocess.run(control, check=True, capture_output=True)
            accepted = int((signals / DONE).read_text())
            proc.stdout.read()
        if proc.returncode != 0:
            raise SystemExit(f"the child exited with {proc.returncode}:\n{log.read_text()}")
        if not tlog:
            return _totals(out), accepted, None
        parts = sorted(signals.glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
        if len(parts) < 2:
            raise SystemExit("callgrind wrote no dumps of the path and the log")
        return _totals(parts[0]), accepted, _totals(parts[1])


def main(argv: list[str] | None = None) -> None:
    """Parse arguments; as the parent, measure and print one table row."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2_000)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument(
        "--tlog", action="store_true", help="also count the transparency log's sync of the batches"
    )
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        child(args.batch, args.batches, args.child, tlog=args.tlog)
        return
    instructions, accepted, logged = measure(args.batch, args.batches, tlog=args.tlog)
    n = args.batch * args.batches
    if accepted != n:
        raise SystemExit(f"{accepted} of {n} accepted: the benchmark's devices are new")
    print("| path | batch | reports counted | instructions | per report |")
    print("|---|---:|---:|---:|---:|")
    print(
        f"| relay, in-process, SQLite | {args.batch:,} | {n:,} | {instructions:,}"
        f" | {instructions / n:,.0f} |"
    )
    if logged is not None:
        print(
            f"| transparency log sync of those entries | {args.batch:,} | {n:,} | {logged:,}"
            f" | {logged / n:,.0f} ({logged / instructions:+.1%} over the path) |"
        )


if __name__ == "__main__":
    main()

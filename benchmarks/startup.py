"""Start-up benchmark: wall time of ``dpgov`` commands in fresh processes; prints a Markdown table.

Usage: ``python -m benchmarks.startup [--runs 5]``.

Each command runs as its own subprocess (a new interpreter, as an operator's shell starts it)
against a SQLite ledger made by ``dpgov db init`` in a temporary folder; the table gives the
median and the slowest of ``--runs`` wall times, the median CPU time (user + system: what the
command itself costs on a machine busy with other work), and the packages of :data:`HEAVY` its
process imported (``python -X importtime``), which none should. Target: under 1 s each for
``--help`` and the read commands. ``tests/test_benchmark_startup.py`` checks the import sets.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = [
    ["--help"],
    ["policies", "list"],
    ["budget", "device-1"],
    ["policies", "show", "emoji"],
]
# What no read command needs: the web framework and the scheduler, the numerics of the tight
# bounds, the `scale` extra and the pipeline's tables. The ledger's own stack (SQLAlchemy and
# SQLModel, pydantic, numpy) is imported by `budget` and stays, as does YAML (`policies`): it
# costs a few milliseconds, and a service that loads it on first use instead runs the relay
# path about 0.5% more instructions (benchmarks/instructions.py; the allocator's state differs).
HEAVY = (
    "fastapi",
    "starlette",
    "uvicorn",
    "apscheduler",
    "httpx",
    "scipy",
    "dp_accounting",
    "pandas",
    "pyarrow",
    "dask",
    "dp_governor.pipeline",
)


def environment(folder: Path) -> dict[str, str]:
    """A ``dpgov`` environment on a ledger in ``folder`` (no other ``DPGOV_*`` setting)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPGOV_")}
    env["DPGOV_DATABASE_URL"] = f"sqlite:///{folder / 'dpgov.sqlite'}"
    env["DPGOV_SECRET_FILE"] = str(folder / "secret")
    env["DPGOV_AUDIT_KEY_FILE"] = str(folder / "audit.key")
    return env


def imported(args: list[str], env: dict[str, str]) -> set[str]:
    """Every module a run of ``dpgov args`` imports (``python -X importtime``)."""
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dp_governor.api.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = (x for x in run.stderr.splitlines() if x.startswith("import time:"))
    return {line.rsplit("|", 1)[-1].strip() for line in lines} - {"package"}


def heavy(modules: set[str]) -> list[str]:
    """The entries of :data:`HEAVY` among ``modules`` (a package or any of its modules).

    >>> heavy({"numpy", "scipy.stats", "dp_governor.pipeline.tables", "dp_governor.api.cli"})
    ['dp_governor.pipeline', 'scipy']
    """
    return sorted(h for h in HEAVY if any(m == h or m.startswith(h + ".") for m in modules))


def main() -> None:
    """Time each command ``--runs`` times and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory() as tmp:
        env = environment(Path(tmp))
        init = [sys.executable, "-m", "dp_governor.api.cli", "db", "init"]
        subprocess.run(init, env=env, check=True, capture_output=True)
        print(f"`dpgov` start-up, wall time of {runs} fresh processes (SQLite ledger)\n")
        print("| command | median wall s | slowest wall s | median CPU s | heavy imports |")
        print("|---|---:|---:|---:|---|")
        for args in COMMANDS:
            walls, cpus = [], []
            for _ in range(runs):
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                subprocess.run(
                    [sys.executable, "-m", "dp_governor.api.cli", *args],
                    env=env,
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
                walls.append(time.perf_counter() - t0)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
            found = ", ".join(heavy(imported(args, env))) or "none"
            print(
                f"| `dpgov {' '.join(args)}` | {statistics.median(walls):.2f} |"
                f" {max(walls):.2f} | {statistics.median(cpus):.2f} | {found} |"
            )


if __name__ == "__main__":
    main()

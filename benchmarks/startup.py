"""Start-up benchmark: wall time of ``dpgov`` commands in fresh processes; prints a Markdown table.

Usage: ``python -m benchmarks.startup [--runs 5]``.

Each command runs as its own subprocess (a new interpreter, as an operator's shell starts it)
against a SQLite ledger made by ``dpgov db init`` in a temporary folder; the table gives the
median and the slowest of ``--runs`` wall times, the median CPU time (user + system: what the
command itself costs on a machine busy with other work), and the heavy packages its process
imported (``python -X importtime``). Target: under 1 s each for ``--help`` and the read commands.
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
HEAVY = ("fastapi", "uvicorn", "scipy", "dp_accounting", "pandas", "pyarrow", "dask")


def _env(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPGOV_")}
    env["DPGOV_DATABASE_URL"] = f"sqlite:///{folder / 'dpgov.sqlite'}"
    env["DPGOV_SECRET_FILE"] = str(folder / "secret")
    env["DPGOV_AUDIT_KEY_FILE"] = str(folder / "audit.key")
    return env


def _heavy_imports(args: list[str], env: dict[str, str]) -> list[str]:
    """The top-level heavy packages a run of ``dpgov args`` imports."""
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "api.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    found = set()
    for line in run.stderr.splitlines():
        name = line.rsplit("|", 1)[-1].strip()
        if name.split(".")[0] in HEAVY:
            found.add(name.split(".")[0])
    return sorted(found)


def main() -> None:
    """Time each command ``--runs`` times and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory() as tmp:
        env = _env(Path(tmp))
        init = [sys.executable, "-m", "api.cli", "db", "init"]
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
                    [sys.executable, "-m", "api.cli", *args],
                    env=env,
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
                walls.append(time.perf_counter() - t0)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
            heavy = ", ".join(_heavy_imports(args, env)) or "none"
            print(
                f"| `dpgov {' '.join(args)}` | {statistics.median(walls):.2f} |"
                f" {max(walls):.2f} | {statistics.median(cpus):.2f} | {heavy} |"
            )


if __name__ == "__main__":
    main()

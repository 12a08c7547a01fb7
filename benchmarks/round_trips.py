"""Round trips to PostgreSQL per accepted report, counted at libpq; prints a table.

Usage: ``python -m benchmarks.round_trips [--postgres URL] [--batch 100]``.

Each statement, ``BEGIN``, ``COMMIT``, ``ROLLBACK``, the pool's liveness ping and every
``PREPARE`` is a message the client sends and waits for: on a network between the service and
its database every one costs a round trip, whatever the server does. The benchmark runs itself
again with psycopg's pure-Python libpq wrapper (``PSYCOPG_IMPL=python``: the same protocol,
whose methods can be wrapped) on a throw-away schema with the default policies, warms the path,
then counts the messages the service's own :meth:`dp_governor.pipeline.ingest.Ingestor.submit_group`
sends for one device's report (the HTTP route's single report) and for a relay's batch, and
lists the single report's messages. A single report waits for each of its messages in turn, so
its count is its round trips; a relay batch's ``executemany`` rows travel in psycopg's pipeline
mode, many to a round trip, so its count is an upper bound.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
_SENDS = ("exec_", "exec_params", "send_query", "send_query_params", "send_prepare",
          "send_query_prepared", "exec_prepared", "prepare")  # fmt: skip


def _count(url: str, batch: int) -> None:
    """In the child: count libpq sends for one report, then per report of a relay batch."""
    import psycopg.pq

    from benchmarks.budget import database
    from benchmarks.relay import NOW, USE_CASE, prepare
    from dp_governor.pipeline.ingest import SubmitRequest

    sent: list[tuple[str, str]] = []
    counting = [False]
    pgconn: Any = psycopg.pq.PGconn

    def wrapped(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def send(self: Any, *args: Any, **kwargs: Any) -> Any:
            if counting[0]:
                query = args[0] if args else b""
                text = query.decode(errors="replace") if isinstance(query, bytes) else str(query)
                sent.append((name, " ".join(text.split())))
            return original(self, *args, **kwargs)

        return send

    for name in _SENDS:
        if hasattr(pgconn, name):
            setattr(pgconn, name, wrapped(name, getattr(pgconn, name)))
    with database("postgresql", url) as engine:
        ingestor, reports = prepare(engine)
        for i in range(6):  # past psycopg's prepare threshold, were statements prepared
            ingestor.submit_group([SubmitRequest(USE_CASE, f"warm-{i}", reports[i], None)], now=NOW)
        counting[0] = True
        ingestor.submit_group([SubmitRequest(USE_CASE, "single", reports[7], None)], now=NOW)
        single = list(sent)
        sent.clear()
        requests = [SubmitRequest(USE_CASE, f"relay-{i}", reports[i], None) for i in range(batch)]
        ingestor.submit_group(requests, now=NOW)
        counting[0] = False
    print("| path | reports | messages sent | per report |")
    print("|---|---:|---:|---:|")
    print(f"| single report | 1 | {len(single)} | {len(single)} |")
    per = len(sent) / batch
    print(f"| relay batch (executemany rows pipelined) | {batch} | {len(sent)} | {per:.2f} |")
    print()
    print("The single report's messages, in order:")
    print()
    for i, (name, text) in enumerate(single, 1):
        print(f"{i}. `{name}`: `{text[:110]}`")


def main(argv: list[str] | None = None) -> None:
    """Run the count in a child process with psycopg's Python implementation."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--postgres", default=os.environ.get("DPGOV_TEST_DATABASE_URL", DEFAULT_URL)
    )
    parser.add_argument("--batch", type=int, default=100, help="reports in the relay batch")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.batch < 1:
        parser.error("--batch must be at least 1")
    if args.child:
        _count(args.postgres, args.batch)
        return
    child = [sys.executable, "-m", "benchmarks.round_trips", "--child",
             "--postgres", args.postgres, "--batch", str(args.batch)]  # fmt: skip
    env = {**os.environ, "PSYCOPG_IMPL": "python"}
    done = subprocess.run(child, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"round_trips: the counting process failed:\n{done.stderr.strip()}")
    print(done.stdout, end="")


if __name__ == "__main__":
    main()

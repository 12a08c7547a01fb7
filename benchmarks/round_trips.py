"""Round trips to PostgreSQL per accepted report, counted at libpq; prints a table.

Usage: ``python -m benchmarks.round_trips [--postgres URL] [--batch 100] [--cpu N] [--rtt MS]``.

Each statement, ``BEGIN``, ``COMMIT``, ``ROLLBACK``, the pool's liveness ping and every
``PREPARE`` is a message the client sends; a round trip is a wait: the client stops until the
server answers what it sent. On a network every round trip costs its latency, whatever the
server does; messages sent together in psycopg's pipeline mode share one. The benchmark runs
itself again with psycopg's pure-Python libpq wrapper (``PSYCOPG_IMPL=python``: the same
protocol, whose methods can be wrapped) on a throw-away schema with the default policies, warms
the path, then counts what the service's own
:meth:`dp_governor.pipeline.ingest.Ingestor.submit_group` sends for one device's report (the
HTTP route's single report) and for a relay's batch, and lists the single report's messages.
Round trips are counted where the client waits to read after sending something: psycopg's
wait loop is replaced by one that reads only when the client asks to (on loopback the answer
is often there before it is needed; on a network it is not), so the count does not depend on
timing. ``--cpu N`` also times the client's CPU over ``N`` single reports with the compiled
wrapper the service runs; ``--rtt MS`` adds a network's round trip to that run (a relay in this
process delays what the server sends).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable, Generator
from typing import Any, TypeVar

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
_SENDS = ("exec_", "exec_params", "send_query", "send_query_params", "send_prepare",
          "send_query_prepared", "exec_prepared", "prepare")  # fmt: skip
_T = TypeVar("_T")
_BLOCKING = ("exec_", "exec_params", "exec_prepared", "prepare")  # send and wait in one call
_SYNCS = ("send_flush_request", "pipeline_sync")  # ask for the pipeline's answers so far


class _Waits:
    """Counts round trips: each wait to read that follows something sent."""

    def __init__(self) -> None:
        self.counting = False
        self.sent = False  # something went out since the last counted wait
        self.trips = 0

    def send(self, blocking: bool) -> None:
        """Note a message sent (a blocking call is its own round trip)."""
        if self.counting:
            if blocking:
                self.trips += 1
            else:
                self.sent = True

    def wait(
        self,
        gen: Generator[Any, Any, _T],
        fileno: int,
        interval: float = 0.0,
        timeout: float | None = None,
    ) -> _T:
        """Drive a psycopg generator; read only when it asks to read, never in passing."""
        import select

        from psycopg.waiting import Ready, Wait

        try:
            state = next(gen)
            while True:
                if state == Wait.R:
                    if self.counting and self.sent:
                        self.trips += 1
                        self.sent = False
                    select.select([fileno], [], [])
                    ready = Ready.R
                elif state == Wait.W:
                    select.select([], [fileno], [])
                    ready = Ready.W
                else:  # read and write: write if it can (a network would not have answered)
                    _, writable, _ = select.select([fileno], [fileno], [])
                    ready = Ready.W if writable else Ready.R
                state = gen.send(ready)
        except StopIteration as done:
            value: _T = done.value
            return value


def _count(url: str, batch: int) -> None:
    """In the child: count libpq sends for one report, then per report of a relay batch."""
    import psycopg.pq
    import psycopg.waiting

    from benchmarks.budget import database
    from benchmarks.relay import NOW, USE_CASE, prepare
    from dp_governor.pipeline.ingest import SubmitRequest

    sent: list[tuple[str, str]] = []
    waits = _Waits()
    pgconn: Any = psycopg.pq.PGconn

    def wrapped(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def send(self: Any, *args: Any, **kwargs: Any) -> Any:
            if waits.counting and name in _SENDS:
                query = args[0] if args else b""
                text = query.decode(errors="replace") if isinstance(query, bytes) else str(query)
                sent.append((name, " ".join(text.split())))
            waits.send(name in _BLOCKING)
            return original(self, *args, **kwargs)

        return send

    for name in _SENDS + _SYNCS:
        if hasattr(pgconn, name):
            setattr(pgconn, name, wrapped(name, getattr(pgconn, name)))
    psycopg.waiting.wait = waits.wait
    with database("postgresql", url) as engine:
        ingestor, reports = prepare(engine)
        for i in range(6):  # past psycopg's prepare threshold, were statements prepared
            ingestor.submit_group([SubmitRequest(USE_CASE, f"warm-{i}", reports[i], None)], now=NOW)
        waits.counting = True
        ingestor.submit_group([SubmitRequest(USE_CASE, "single", reports[7], None)], now=NOW)
        single, single_trips = list(sent), waits.trips
        sent.clear()
        waits.trips = 0
        requests = [SubmitRequest(USE_CASE, f"relay-{i}", reports[i], None) for i in range(batch)]
        ingestor.submit_group(requests, now=NOW)
        waits.counting = False
    print("| path | reports | messages sent | round trips | round trips a report |")
    print("|---|---:|---:|---:|---:|")
    print(f"| single report | 1 | {len(single)} | {single_trips} | {single_trips} |")
    per = waits.trips / batch
    print(f"| relay batch | {batch} | {len(sent)} | {waits.trips} | {per:.2f} |")
    print()
    print("The single report's messages, in order:")
    print()
    for i, (name, text) in enumerate(single, 1):
        print(f"{i}. `{name}`: `{text[:110]}`")


def _cpu(url: str, reports_n: int) -> None:
    """In the child (compiled psycopg): the client's CPU and wall time a single report."""
    import time

    from benchmarks.budget import database
    from benchmarks.relay import NOW, USE_CASE, prepare
    from dp_governor.pipeline.ingest import SubmitRequest

    with database("postgresql", url) as engine:
        ingestor, reports = prepare(engine)
        for i in range(20):
            ingestor.submit_group([SubmitRequest(USE_CASE, f"warm-{i}", reports[i], None)], now=NOW)
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(reports_n):
            body = reports[i % len(reports)]
            ingestor.submit_group([SubmitRequest(USE_CASE, f"cpu-{i}", body, None)], now=NOW)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(f"| single report, one after another | {reports_n} |"
          f" {cpu / reports_n * 1e6:,.0f} | {wall / reports_n * 1e6:,.0f} |")  # fmt: skip


class _Latency:
    """A TCP relay to the database that delays what the server sends by ``delay`` seconds.

    Each chunk leaves ``delay`` after it arrived, in order: a network's latency, not a
    throttle. Runs in a thread of the parent, so the timed child's CPU excludes it.
    """

    def __init__(self, host: str, port: int, delay: float) -> None:
        import asyncio
        import threading

        self.target, self.delay = (host, port), delay
        self.loop = asyncio.new_event_loop()
        self.port = 0
        started = threading.Event()

        async def serve() -> None:
            server = await asyncio.start_server(self._client, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            started.set()
            await server.serve_forever()

        self.thread = threading.Thread(
            target=self.loop.run_until_complete, args=(serve(),), daemon=True
        )
        self.thread.start()
        started.wait()

    async def _client(self, reader: Any, writer: Any) -> None:
        import asyncio

        up_reader, up_writer = await asyncio.open_connection(*self.target)
        await asyncio.gather(
            self._copy(reader, up_writer, 0.0), self._copy(up_reader, writer, self.delay)
        )

    async def _copy(self, reader: Any, writer: Any, delay: float) -> None:
        import asyncio

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                at, data = await queue.get()
                if not data:
                    writer.close()
                    return
                await asyncio.sleep(max(0.0, at + delay - loop.time()))
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(send())
        while True:
            data = await reader.read(1 << 16)
            queue.put_nowait((loop.time(), data))
            if not data:
                break
        await sender


def _child(args: list[str], env: dict[str, str]) -> str:
    """Run this benchmark's child with ``args``; its output, or exit with its error."""
    child = [sys.executable, "-m", "benchmarks.round_trips", *args]
    done = subprocess.run(child, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"round_trips: the measuring process failed:\n{done.stderr.strip()}")
    return done.stdout


def main(argv: list[str] | None = None) -> None:
    """Run the count in a child process with psycopg's Python implementation."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--postgres", default=os.environ.get("DPGOV_TEST_DATABASE_URL", DEFAULT_URL)
    )
    parser.add_argument("--batch", type=int, default=100, help="reports in the relay batch")
    parser.add_argument(
        "--cpu", type=int, default=0, help="also time the client over this many single reports"
    )
    parser.add_argument(
        "--rtt",
        type=float,
        default=0.0,
        help="milliseconds of network round trip added for the timing run (a relay)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cpu-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.batch < 1:
        parser.error("--batch must be at least 1")
    if args.cpu < 0:
        parser.error("--cpu must be 0 or more")
    if not 0 <= args.rtt <= 1000:
        parser.error("--rtt must be 0 to 1000 ms")
    if args.child:
        _count(args.postgres, args.batch)
        return
    if args.cpu_child:
        _cpu(args.postgres, args.cpu)
        return
    url = ["--postgres", args.postgres]
    python = {**os.environ, "PSYCOPG_IMPL": "python"}
    print(_child(["--child", *url, "--batch", str(args.batch)], python), end="")
    if args.cpu:
        from sqlalchemy import make_url

        compiled = {k: v for k, v in os.environ.items() if k != "PSYCOPG_IMPL"}
        timed = args.postgres
        if args.rtt:
            parsed = make_url(args.postgres)
            relay = _Latency(parsed.host or "127.0.0.1", parsed.port or 5432, args.rtt / 1000)
            timed = parsed.set(host="127.0.0.1", port=relay.port).render_as_string(False)
        print()
        print(f"| client (compiled psycopg), {args.rtt:g} ms added round trip | reports"
              " | CPU a report (us) | wall a report (us) |")  # fmt: skip
        print("|---|---:|---:|---:|")
        print(
            _child(["--cpu-child", "--postgres", timed, "--cpu", str(args.cpu)], compiled), end=""
        )


if __name__ == "__main__":
    main()

"""HTTP ingestion against a real ``dpgov serve`` process; prints a Markdown table.

Usage: ``python -m benchmarks.http [--seconds 15] [--clients 16] [--postgres URL]
[--loads singles relay] [--batch-items 5000] [--relay-connections N] [--sqlite-workers 1]
[--checkpoint-seconds S]``.

The server runs in its own process (SQLite file in a temporary folder, or a fresh PostgreSQL
schema with ``--workers``); the load comes from this process: ``--clients`` threads, each with
its own keep-alive connection, submitting one HCMS report per request for a new device each
time (so every report is accepted and written); then the same with ``wrk`` (a C load generator,
Debian package ``wrk``) when installed, since a Python client saturates a core before the
server does; then the relay endpoint: batches of ``--batch-items`` (5,000) over
``--relay-connections`` (two per server worker) for as long, each batch on a new connection.
Keep-alive connections opened together all go to whichever worker accepts first and stay
there, so that two workers served as one (seen here: 93% and 3% of a core); a connection per
batch spreads batches over the workers as a load balancer would, at one handshake per 5,000
reports. ``wrk``'s keep-alive connections for single reports are subject to the same.
Afterwards it checks that accepted = charged = stored (inbox + reports). On Linux it also reads
the server processes' CPU time from ``/proc`` over each load: the CPU a report costs the server,
and how busy each worker was (a worker near 100% is CPU-bound; workers well below it that add
no throughput wait on SQLite's single writer). PostgreSQL's own processes are not counted.

``--checkpoint-seconds S`` runs the server's scheduler with the ``checkpoint`` job every ``S``
seconds (the other jobs' intervals a day, so only the log's work is added) and watches the
database from this process every 0.25 s during each load: the seconds between successive
signed transparency-log checkpoints (from the load's start to its end, so a stall at either end
counts), the longest stretch with entries waiting and no checkpoint signed (from the first
entry past the newest checkpoint to the next signed one: the load's first seconds, before a
batch commits, do not count) and the log's lag, audit entries not yet under a signed checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from itertools import pairwise
from pathlib import Path

import httpx
import numpy as np
import orjson
from sqlalchemy import text

from dp_governor.api.server import free_port
from dp_governor.budget import create_db_engine
from dp_governor.budget.storage.db import scratch_schema
from dp_governor.mechanisms import HCMS, family_id
from dp_governor.policies import PolicyCreate, mechanism_for

TOKEN = "bench-admin-token-bench-admin-token"
LOADS = frozenset({"singles", "relay"})
Body = dict[str, int | str]  # a report's JSON body: the mechanism's fields and its family


_DAY = str(86_400)


def server_env(
    url: str, tmp: Path, batch_items: int = 5000, checkpoint_seconds: int | None = None
) -> dict[str, str]:
    """The environment of a benchmark's ``dpgov`` processes: keys in ``tmp``, no scheduler.

    With ``checkpoint_seconds``, the scheduler runs the ``checkpoint`` job at that interval
    and every other job once a day (the dashboard and verify jobs also once at the start).
    """
    jobs = (
        {"DPGOV_SCHEDULER": "false"}
        if checkpoint_seconds is None
        else {
            "DPGOV_SCHEDULER": "true",
            "DPGOV_CHECKPOINT_SECONDS": str(checkpoint_seconds),
            "DPGOV_FLUSH_SECONDS": _DAY,
            "DPGOV_AGGREGATE_SECONDS": _DAY,
            "DPGOV_DASHBOARD_SECONDS": _DAY,
            "DPGOV_VERIFY_SECONDS": _DAY,
        }
    )
    return {
        **os.environ,
        "DPGOV_DATABASE_URL": url,
        "DPGOV_SECRET_FILE": str(tmp / "secret"),
        "DPGOV_AUDIT_KEY_FILE": str(tmp / "audit.key"),
        "DPGOV_SHUFFLER_KEY_FILE": str(tmp / "shuffler.key"),
        "DPGOV_ADMIN_TOKEN": TOKEN,
        "DPGOV_MAX_BATCH_ITEMS": str(batch_items),
        "DPGOV_MAX_BODY_BYTES": str(64 << 20),
        **jobs,
    }


def start_server(
    url: str,
    workers: int,
    tmp: Path,
    batch_items: int,
    checkpoint_seconds: int | None = None,
    extra_env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """A ``dpgov serve`` process on ``url`` (in ``tmp``), once it answers: (process, base URL).

    ``extra_env``: variables set in its environment besides :func:`server_env`'s.
    """
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dp_governor.api.cli",
            "serve",
            "--port",
            str(port),
            "--workers",
            str(workers),
        ],
        env={**server_env(url, tmp, batch_items, checkpoint_seconds), **(extra_env or {})},
        cwd=tmp,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                return proc, base
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server did not start")


def report_bodies(base: str) -> list[Body]:
    """2,000 Safari HCMS report bodies from the policy the server publishes, with its family."""
    policy = httpx.get(base + "/v1/use-cases/safari-energy-domains").json()
    fields = {k: v for k, v in policy.items() if k in PolicyCreate.model_fields}
    mech = mechanism_for(PolicyCreate.model_validate(fields))
    assert isinstance(mech, HCMS)
    family = family_id(mech)  # devices send the family they built under; the server checks it
    bodies: list[Body] = [
        r | {"family": family}
        for r in mech.privatize(
            [f"d{i}.example" for i in range(2000)], rng=np.random.default_rng(1)
        ).to_dicts()
    ]
    return bodies


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state, ppid, ...), or ``None``.

    ``None`` when the process has gone (or there is no ``/proc``); the name, in parentheses,
    may hold spaces, so the fields start after its last ``)``.
    """
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _process_tree(root: int) -> list[int]:
    """``root`` and its descendants (Linux ``/proc``; empty elsewhere)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat(entry.name)
        if fields is not None:
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(parents.get(pid, []))
    return tree if _stat(root) is not None else []


def _cpu_seconds(pids: list[int]) -> dict[int, float]:
    """User + system CPU seconds of each live process in ``pids``."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in pids:
        fields = _stat(pid)
        if fields is not None:
            out[pid] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return out


class ServerCpu:
    """The server's CPU time over one load: per report, and each process's share of a core."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.pids = _process_tree(proc.pid)
        self.start = _cpu_seconds(self.pids)
        self.t0 = time.perf_counter()

    def summary(self, reports: int) -> str:
        """``us/report (busy processes' % of a core)``, or ``n/a`` without ``/proc``."""
        seconds = time.perf_counter() - self.t0
        end = _cpu_seconds(self.pids)
        used = {p: end[p] - self.start[p] for p in end if p in self.start}
        if not used or not reports:
            return "n/a"
        busy = sorted((u for u in used.values() if u > 0.01 * seconds), reverse=True)
        shares = ", ".join(f"{u / seconds:.0%}" for u in busy)
        return f"{sum(used.values()) / reports * 1e6:.1f} us ({shares})"


class LogWatch:
    """The transparency log during one load: checkpoint intervals and lag, polled from the DB."""

    def __init__(self, url: str, every: float = 0.25) -> None:
        self.engine = create_db_engine(url)
        self.every = every
        self.samples: list[tuple[float, int, int]] = []  # (time, checkpoint size, audit head)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            with self.engine.connect() as conn:
                size = conn.execute(text("SELECT max(size) FROM tlog_checkpoints")).scalar()
                head = conn.execute(text("SELECT max(seq) FROM audit_log")).scalar()
            self.samples.append((time.perf_counter(), int(size or 0), int(head or 0)))
            self._stop.wait(self.every)

    def summary(self) -> str:
        """``median / max s between checkpoints | longest unsigned | median / max / final lag``."""
        self._stop.set()
        self._thread.join()
        self.engine.dispose()
        if len(self.samples) < 2:
            return "n/a | n/a | n/a"
        marks = [self.samples[0][0]]
        marks += [t for (_, before, _), (t, size, _) in pairwise(self.samples) if size > before]
        marks.append(self.samples[-1][0])
        gaps = np.diff(marks)
        lags = [head - size for _, size, head in self.samples]
        return (
            f"{np.median(gaps):.1f} / {gaps.max():.1f} s ({len(marks) - 2} signed)"
            f" | {self.unsigned():.1f} s"
            f" | {np.median(lags):,.0f} / {max(lags):,} / {lags[-1]:,}"
        )

    def unsigned(self) -> float:
        """The longest stretch with entries under no signed checkpoint and no new one signed.

        It starts when an entry beyond the newest checkpoint is first seen (at the load's start
        if there is one then) and ends at the next checkpoint or the load's end: what "a signed
        checkpoint at least every N s under load" bounds, without counting the load's first
        seconds, before its first batch commits, when there is nothing to sign.
        """
        longest = 0.0
        since: float | None = None
        last_size = self.samples[0][1]
        for t, size, head in self.samples:
            if size > last_size:
                if since is not None:
                    longest = max(longest, t - since)
                since, last_size = None, size
            if head > size and since is None:
                since = t
        if since is not None:
            longest = max(longest, self.samples[-1][0] - since)
        return longest


def _started_jobs_done(url: str) -> None:
    """Wait for the jobs a scheduler runs at its start (dashboard, verify): the load comes after."""
    engine = create_db_engine(url)
    try:
        for _ in range(600):
            with engine.connect() as conn:
                rows = conn.execute(text("SELECT count(*) FROM dashboard_snapshots")).scalar()
            if rows == 2:  # the dashboard's figures and the verification
                return
            time.sleep(0.1)
        raise SystemExit("the scheduler's first dashboard and verify runs did not finish")
    finally:
        engine.dispose()


def _singles(
    base: str, bodies: list[Body], seconds: float, clients: int
) -> tuple[int, int, list[float]]:
    latencies: list[float] = []
    counts = {"ok": 0, "err": 0}
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    run = uuid.uuid4().hex[:8]

    def worker(w: int) -> None:
        mine: list[float] = []
        ok = err = 0
        with httpx.Client(base_url=base, timeout=30) as c:
            i = 0
            while time.monotonic() < stop:
                body = bodies[(w * 7919 + i) % len(bodies)]
                t0 = time.perf_counter()
                r = c.post(
                    "/v1/use-cases/safari-energy-domains/reports",
                    json=body,
                    headers={"X-Device-Id": f"{run}-{w}-{i}"},
                )
                mine.append(time.perf_counter() - t0)
                if r.status_code == 202:
                    ok += 1
                else:
                    err += 1
                i += 1
        with lock:
            latencies.extend(mine)
            counts["ok"] += ok
            counts["err"] += err

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts["ok"], counts["err"], latencies


_WRK_SCRIPT = """
counter = 0
local next_id = 0
setup = function(thread)
  thread:set("tid", next_id)
  next_id = next_id + 1
end
request = function()
  counter = counter + 1
  local headers = {}
  headers["Content-Type"] = "application/json"
  headers["X-Device-Id"] = "wrk-" .. RUN .. "-" .. tid .. "-" .. counter
  return wrk.format("POST", "/v1/use-cases/safari-energy-domains/reports", headers, BODY)
end
"""


def _wrk(
    base: str, body: Body, seconds: float, clients: int, tmp: Path
) -> tuple[int, int, float, float] | None:
    """Single reports from wrk (a C load generator), if installed: (ok, errors, p50, p99)."""
    if shutil.which("wrk") is None:
        return None
    script = tmp / "post.lua"
    run = uuid.uuid4().hex[:8]
    script.write_text(
        _WRK_SCRIPT.replace("RUN", repr(run)).replace("BODY", repr(json.dumps(body))),
        encoding="utf-8",
    )
    proc = subprocess.run(
        ["wrk", "-t1", f"-c{clients}", f"-d{int(seconds)}s", "--latency", "-s", str(script), base],
        capture_output=True,
        text=True,
        check=True,
    )
    out = proc.stdout
    found = re.search(r"(\d+) requests in", out)
    assert found is not None, out
    total = int(found.group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = int(non2xx.group(1)) if non2xx else 0

    def ms(label: str) -> float:
        m = re.search(rf"{label}%\s+([\d.]+)(us|ms|s)", out)
        assert m is not None, out
        value = float(m.group(1))
        return {"us": value / 1000, "ms": value, "s": value * 1000}[m.group(2)]

    return total - errors, errors, ms("50"), ms("99")


def _batches(
    base: str, bodies: list[Body], seconds: float, connections: int, size: int
) -> tuple[int, float]:
    """Relay batches of ``size`` over ``connections`` connections for ``seconds``: (accepted, s).

    The request bodies are encoded before the clock starts (a relay has them ready), so the
    figure is the server's; every batch carries new devices, so every report is accepted.
    """
    run = uuid.uuid4().hex[:8]
    template = [bodies[i % len(bodies)] for i in range(size)]

    def payload(b: int) -> bytes:
        items = [{"device_id": f"{run}-b{b}-{i}", "report": template[i]} for i in range(size)]
        return orjson.dumps({"items": items})

    ready = [payload(b) for b in range(2 * connections)]
    accepted = [0] * connections
    stop = time.monotonic() + seconds

    def worker(w: int) -> None:
        with httpx.Client(
            base_url=base,
            timeout=300,
            headers={
                "Authorization": f"Bearer {TOKEN}",
                "Content-Type": "application/json",
                "Connection": "close",
            },
        ) as c:
            b = w
            while time.monotonic() < stop:
                body = ready[b] if b < len(ready) else payload(b)
                r = c.post("/v1/use-cases/safari-energy-domains/reports:batch", content=body)
                r.raise_for_status()
                accepted[w] += r.json()["accepted"]
                b += connections

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(connections)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(accepted), time.perf_counter() - t0


def _check(url: str) -> tuple[int, int]:
    engine = create_db_engine(url)
    with engine.connect() as conn:
        charges = conn.execute(text("SELECT COUNT(*) FROM charges")).scalar_one()
        stored = conn.execute(
            text("SELECT (SELECT COUNT(*) FROM inbox) + (SELECT COUNT(*) FROM reports)")
        ).scalar_one()
    engine.dispose()
    return int(charges), int(stored)


def run(
    label: str,
    url: str,
    workers: int,
    seconds: float,
    clients: int,
    tmp: Path,
    size: int = 5000,
    loads: frozenset[str] = LOADS,
    relay_connections: int | None = None,
    checkpoint_seconds: int | None = None,
) -> list[str]:
    """Benchmark one configuration; returns table rows (two relay connections per worker).

    With ``checkpoint_seconds`` each row ends with the log's cells (:class:`LogWatch`).
    """
    relay_connections = relay_connections or 2 * workers
    proc, base = start_server(url, workers, tmp, size, checkpoint_seconds)

    def watch() -> LogWatch | None:
        return None if checkpoint_seconds is None else LogWatch(url)

    def logged(w: LogWatch | None) -> str:
        return "" if w is None else f" {w.summary()} |"

    try:
        bodies = report_bodies(base)
        if checkpoint_seconds is not None:
            _started_jobs_done(url)
        cpu, w = ServerCpu(proc), watch()
        wrk = _wrk(base, bodies[0], seconds, clients, tmp) if "singles" in loads else None
        wrk_cpu, wrk_log = cpu.summary(wrk[0] if wrk else 0), logged(w)
        cpu, w = ServerCpu(proc), watch()
        ok, err, lat = (
            _singles(base, bodies, seconds, clients) if "singles" in loads else (0, 0, [0.0])
        )
        singles_cpu, singles_log = cpu.summary(ok), logged(w)
        cpu, w = ServerCpu(proc), watch()
        batch_ok, batch_seconds = (
            _batches(base, bodies, seconds, relay_connections, size)
            if "relay" in loads
            else (0, 1.0)
        )
        relay_cpu, relay_log = cpu.summary(batch_ok), logged(w)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    charges, stored = _check(url)
    p = np.percentile(np.asarray(lat) * 1000, [50, 99])
    wrk_ok = wrk[0] if wrk else 0
    total = ok + batch_ok + wrk_ok
    # wrk stops counting with up to `clients` requests in flight; the server still answers them
    ok_counts = charges == stored and 0 <= charges - total <= (clients if wrk else 0)
    consistent = "yes" if ok_counts else f"NO ({charges}/{stored}/{total})"
    rows = []
    if "singles" in loads:
        rows.append(
            f"| {label} | single reports, {clients} Python clients | {ok / seconds:,.0f} /s"
            f" | {p[0]:.1f} | {p[1]:.1f} | {err} | {singles_cpu} | {consistent} |{singles_log}"
        )
    if wrk:
        rows.append(
            f"| {label} | single reports, wrk, {clients} connections | {wrk[0] / seconds:,.0f} /s"
            f" | {wrk[2]:.1f} | {wrk[3]:.1f} | {wrk[1]} | {wrk_cpu} | {consistent} |{wrk_log}"
        )
    if "relay" in loads:
        rows.append(
            f"| {label} | batches of {size:,}, {relay_connections} connections"
            f" | {batch_ok / batch_seconds:,.0f} /s"
            f" | | | 0 | {relay_cpu} | {consistent} |{relay_log}"
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2, help="server workers on PostgreSQL")
    parser.add_argument("--sqlite-workers", type=int, default=1, help="server workers on SQLite")
    parser.add_argument("--postgres", default=os.environ.get("DPGOV_TEST_DATABASE_URL"))
    parser.add_argument("--batch-items", type=int, default=5000, help="relay batch size")
    parser.add_argument(
        "--relay-connections", type=int, default=None, help="relay connections (2 per worker)"
    )
    parser.add_argument(
        "--loads", nargs="+", choices=sorted(LOADS), default=sorted(LOADS), help="what to run"
    )
    parser.add_argument(
        "--checkpoint-seconds",
        type=int,
        default=None,
        help="run the checkpoint job at this interval and report the log's cadence and lag",
    )
    args = parser.parse_args(argv)
    loads = frozenset(args.loads)
    log_head = (
        ""
        if args.checkpoint_seconds is None
        else " between signed checkpoints (median / max) | longest unsigned"
        " | log lag, entries (median / max / end) |"
    )
    print(
        "| backend | load | accepted throughput | p50 ms | p99 ms | errors"
        " | server CPU per report (busy processes) | accepted = charged = stored |" + log_head
    )
    print("|---|---|---|---|---|---|---|---|" + ("---|---|---|" if log_head else ""))
    n = args.sqlite_workers
    configs = [(f"sqlite, {n} worker{'s' if n > 1 else ''}", None, n)]
    if args.postgres:
        configs.append((f"postgresql, {args.workers} workers", args.postgres, args.workers))
    for label, pg_url, workers in configs:
        with ExitStack() as stack:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            url = (
                stack.enter_context(scratch_schema(pg_url, "http"))
                if pg_url
                else f"sqlite:///{tmp / 'bench.sqlite'}"
            )
            for row in run(
                label,
                url,
                workers,
                args.seconds,
                args.clients,
                tmp,
                args.batch_items,
                loads,
                args.relay_connections,
                args.checkpoint_seconds,
            ):
                print(row, flush=True)


if __name__ == "__main__":
    main()

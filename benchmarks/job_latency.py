"""Single-report latency while each scheduled job runs against a live server; a Markdown table.

Usage: ``python -m benchmarks.job_latency [--reports 100000] [--interval-ms 10]
[--baseline-seconds 5] [--batch-items 5000] [--postgres URL [--no-sqlite]] [--served]
[--jobs NAME,...] [--repeat N] [--control-seconds 10] [--cores-apart]``.

A ``dpgov serve`` process (scheduler off) runs on a temporary SQLite file, or in a scratch
PostgreSQL schema with ``--postgres``. This process sends single Safari HCMS reports over HTTP,
one every ``--interval-ms`` on a fixed schedule (a new device each), first with no job running
(the baseline), then beside a busy process that does no database work at the job worker's
priority (the control: what any CPU-bound process costs the gate on this machine), then while
each job runs in a separate process, as ``dpgov jobs run NAME`` would: ``flush-inbox`` after
the relay filled the inbox with ``--reports`` reports, ``aggregate`` after it filled the inbox
again (it flushes, then folds both lots), ``checkpoint``, the population passes
(``dashboard``: the effective-epsilon report and every use case's distributions; ``verify``:
the chain and the tables, from the last verified checkpoint), and ``purge`` run with its clock
ten years ahead (every retention window has passed: it deletes everything; the single reports
sent once its horizons have passed today are refused as dated on a deleted day, ``clock_behind``,
and counted apart: they pass the gate's transaction as an acceptance does). ``--jobs`` runs
some of them (both fills happen all the same, so each job finds the population it would);
``--repeat`` runs ``dashboard`` and ``verify`` several times (numbered rows: the first a full
pass, the next what changed since). Each row gives the job's own run time (without the
process's start-up), what it handled, and the latency of the single reports sent while it ran.
The Safari policy's batch minimum is lowered to 1 first (the default holds a batch for 5,000
distinct devices), so a short run's flush publishes as a long one's does. The job processes
lower their priority for the population jobs as ``dpgov jobs run`` does (``DPGOV_JOB_CPU``,
``DPGOV_JOB_NICE``), and on PostgreSQL run without parallel query as it does. On a PostgreSQL
server whose autovacuum is off, the database is vacuumed after the fills, as autovacuum would.

``--served`` runs the jobs through ``POST /v1/admin/jobs/{name}:run`` instead, in the server's
process as its scheduler runs them (the population jobs in the server's child process), every
job but ``purge`` (a server's clock cannot be moved ahead); the write transactions are then
not counted, and the job's time includes the request.

``--cores-apart`` gives the jobs a core of their own, as a host of their own would
(``DPGOV_SCHEDULED_JOBS``): the gate (the server, its PostgreSQL sessions and this process's
probe) is kept on the first CPU, the jobs (the job processes, the server's job worker, the
control's busy process and the sessions named ``dpgov-job``) on the second; with ``--served``,
``flush-inbox``, ``aggregate`` and ``checkpoint`` run in the server's threads, on the gate's
CPU. Linux only; pinning the database's sessions needs the right to set another user's
processes' affinity (root).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack, suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
from sqlalchemy import Connection, Engine, event

from benchmarks.http import TOKEN, Body, report_bodies, server_env, start_server
from dp_governor.api._job_database import JOB_SESSION_NAME
from dp_governor.budget.storage.db import WRITE_OPTION, scratch_schema

USE_CASE = "safari-energy-domains"
JOBS = ("flush-inbox", "aggregate", "checkpoint", "dashboard", "verify", "purge")
FILLED_BY = ("flush-inbox", "aggregate")  # the jobs a fill of the inbox comes before
REPEATABLE = ("dashboard", "verify")  # the others change what their next run finds
AHEAD_DAYS = 3651  # beyond the longest retention a policy may set (3,650 days)
HEADER = (
    "| backend | job | rows handled | job s | write transactions | single reports"
    " | p50 ms | p99 ms | max ms |\n|---|---|---|---:|---:|---:|---:|---:|---:|"
)


GATE_CPUS = {0}  # --cores-apart: the gate's core
JOB_CPUS = {1}  # and the jobs'
GATE_SESSIONS = "dpgov-gate"  # --cores-apart: the server's sessions (PGAPPNAME)


def pin(pid: int, cpus: set[int], *, skip: int | None = None) -> None:
    """Every thread of process ``pid`` (but thread ``skip``) onto ``cpus``.

    A thread or process gone meanwhile is passed over; a refusal (no right to set another
    user's affinity) stops the benchmark rather than leave its figures unpinned.
    """
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return
    for tid in threads:
        if tid == skip:
            continue
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # a thread that ended since the listing
            continue
        except PermissionError:
            raise SystemExit(
                f"--cores-apart: cannot set the CPUs of process {pid} (another user's: run as"
                " root, or on a database server of your own)"
            ) from None


class CoresApart:
    """The gate on :data:`GATE_CPUS`, the jobs on :data:`JOB_CPUS`, re-applied every 100 ms.

    Threads, job processes and database sessions come and go during a run, and each new one
    inherits its parent's CPUs, not the side it belongs to: the loop pins them as they appear.
    The gate: this process, the server and its sessions (named :data:`GATE_SESSIONS`); the
    jobs: the server's child processes (its job worker), the processes :meth:`add` names and
    their children, the sessions named :data:`JOB_SESSION_NAME` (``dpgov-job``), and the loop
    itself (its thread and its session). Sessions of other names are left alone; so are
    PostgreSQL's own background processes (the write-ahead log's writer, the checkpointer).
    """

    def __init__(self, server: int, url: str | None) -> None:
        import psutil
        from sqlalchemy import make_url, text

        from dp_governor.budget import create_db_engine

        if not hasattr(os, "sched_setaffinity") or not (
            GATE_CPUS | JOB_CPUS
        ) <= os.sched_getaffinity(0):
            raise SystemExit("--cores-apart needs Linux and CPUs 0 and 1")
        self._own = os.sched_getaffinity(0)
        self._psutil = psutil
        self._text = text
        self._server = server
        self._jobs: set[int] = set()
        self._loop: int | None = None  # the loop's thread id, once it runs
        self._failed: BaseException | None = None
        self._engine = None
        if url:  # the loop's own session counts on the jobs' side
            named = make_url(url).update_query_dict({"application_name": JOB_SESSION_NAME})
            self._engine = create_db_engine(
                named.render_as_string(hide_password=False), pool_size=1
            )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cores-apart", daemon=True)
        self.apply()
        self._thread.start()

    def add(self, pid: int) -> None:
        """Count process ``pid`` (and its children) on the jobs' side, pinned at once."""
        self._check()
        self._jobs.add(pid)
        pin(pid, JOB_CPUS)

    def discard(self, pid: int) -> None:
        """Process ``pid`` has ended (and been reaped): its number may be another's next."""
        self._jobs.discard(pid)

    def apply(self) -> None:
        """Pin every process, thread and session of the run to its side once."""
        pin(os.getpid(), GATE_CPUS, skip=self._loop)
        pin(self._server, GATE_CPUS)
        jobs = set(self._jobs)
        for root in (self._server, *self._jobs):
            with suppress(self._psutil.NoSuchProcess):
                jobs.update(c.pid for c in self._psutil.Process(root).children(recursive=True))
        for pid in jobs:
            pin(pid, JOB_CPUS)
        if self._engine is not None:
            with self._engine.connect() as conn:
                sessions = conn.execute(
                    self._text(
                        "SELECT pid, application_name FROM pg_stat_activity"
                        " WHERE datname = current_database() AND application_name IN (:g, :j)"
                    ),
                    {"g": GATE_SESSIONS, "j": JOB_SESSION_NAME},
                ).all()
            for pid, name in sessions:
                pin(pid, JOB_CPUS if name == JOB_SESSION_NAME else GATE_CPUS)

    def close(self) -> None:
        """Stop re-applying; this process back on every CPU it had (the others keep theirs).

        Raises what stopped the loop early, if anything did: the run's figures are not apart.
        """
        self._stop.set()
        self._thread.join()
        pin(os.getpid(), self._own)
        if self._engine is not None:
            self._engine.dispose()
        self._check()

    def _check(self) -> None:
        if self._failed is not None:
            raise SystemExit(f"--cores-apart: the pinning stopped: {self._failed}")

    def _run(self) -> None:
        self._loop = threading.get_native_id()
        try:
            os.sched_setaffinity(self._loop, JOB_CPUS)
            while not self._stop.wait(0.1):
                self.apply()
        except BaseException as exc:  # told at the next add() or at close()
            self._failed = exc


class Probe:
    """Single reports on a fixed schedule in a thread; the latency of each, in seconds."""

    def __init__(self, base: str, bodies: list[Body], interval: float) -> None:
        self.base = base
        self.bodies = bodies
        self.interval = interval
        self.latencies: list[float] = []
        self.failed = 0
        self.behind = 0  # refused as dated before a purge's horizon (``clock_behind``)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe", daemon=True)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        run = uuid.uuid4().hex[:12]
        start = time.monotonic()
        with httpx.Client(base_url=self.base, timeout=120) as client:
            i = 0
            while not self._stop.is_set():
                t0 = time.perf_counter()
                r = client.post(
                    f"/v1/use-cases/{USE_CASE}/reports",
                    json=self.bodies[i % len(self.bodies)],
                    headers={"X-Device-Id": f"probe-{run}-{i}"},
                )
                self.latencies.append(time.perf_counter() - t0)
                behind = r.status_code == 429 and r.json().get("reason") == "clock_behind"
                self.behind += behind
                self.failed += r.status_code != 202 and not behind
                i += 1
                # the next slot of the schedule; one already missed is taken at once
                self._stop.wait(max(0.0, start + i * self.interval - time.monotonic()))


def fill(base: str, bodies: list[Body], reports: int, batch_items: int) -> None:
    """``reports`` accepted reports through the relay endpoint, a new device each."""
    run = uuid.uuid4().hex[:12]
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    with httpx.Client(base_url=base, timeout=600, headers=headers) as client:
        for start in range(0, reports, batch_items):
            items = [
                {"device_id": f"fill-{run}-{i}", "report": bodies[i % len(bodies)]}
                for i in range(start, min(reports, start + batch_items))
            ]
            r = client.post(
                f"/v1/use-cases/{USE_CASE}/reports:batch", content=orjson.dumps({"items": items})
            )
            r.raise_for_status()
            assert r.json()["accepted"] == len(items), r.text


def no_batch_minimum(base: str) -> None:
    """Set the Safari policy's ``min_batch_devices`` to 1 (a loosening, written openly)."""
    from dp_governor.policies.defaults import DEFAULT_POLICIES

    (policy,) = [p for p in DEFAULT_POLICIES if p["name"] == USE_CASE]
    r = httpx.put(
        f"{base}/v1/use-cases/{USE_CASE}",
        params={"allow_loosen": "true"},
        json={**policy, "min_batch_devices": 1},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=60,
    )
    r.raise_for_status()


# The control's process: the job worker's priority (what it got, one line), then a busy loop.
_BUSY = """
import sys
from dp_governor.api._job_process import lower_priority
print(lower_priority(sys.argv[1], int(sys.argv[2])), flush=True)
while True:
    pass
"""


def run_control(seconds: float, probe: Probe, cores: CoresApart | None) -> dict[str, Any]:
    """A busy process with no database work at the job worker's priority, probing meanwhile.

    What any CPU-bound process beside the gate costs it on this machine: the floor under the
    population jobs' rows, which run at that priority too (``DPGOV_JOB_CPU``, ``DPGOV_JOB_NICE``).
    """
    from dp_governor.api.cli.common import load_settings

    settings = load_settings(None)
    busy = subprocess.Popen(
        [sys.executable, "-c", _BUSY, settings.job_cpu, str(settings.job_nice)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert busy.stdout is not None
    if cores is not None:
        cores.add(busy.pid)
    priority = busy.stdout.readline().strip()  # lowered before the first report is sent
    try:
        with probe:
            time.sleep(seconds)
    finally:
        busy.kill()
        busy.communicate()  # reaped, its pipe closed
        if cores is not None:
            cores.discard(busy.pid)
    return {"result": {"what": f"no database work, {priority}"}, "seconds": seconds, "writes": None}


def vacuum_unless_autovacuum(url: str) -> None:
    """``VACUUM (ANALYZE)`` the database if its autovacuum is off, as autovacuum would have.

    With autovacuum off (as on some test machines' servers), the first scan after the fills
    prunes the pages the fills left and writes their full-page images to the write-ahead log
    then: an effect of the server's setting that the passes would be charged with.
    """
    from sqlalchemy import text

    from dp_governor.budget import create_db_engine

    engine = create_db_engine(url, pool_size=1)
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            if conn.execute(text("SHOW autovacuum")).scalar_one() == "off":
                conn.execute(text("VACUUM (ANALYZE)"))
    finally:
        engine.dispose()


def handled(result: dict[str, Any] | None) -> str:
    """A job's counts as one cell: ``100,000 moved, 200,000 folded`` (nonzero counts only)."""
    if not result:
        return "nothing"
    if "what" in result:
        return str(result["what"])
    counts = [
        f"{v:,} {k}" for k, v in result.items() if isinstance(v, int) and v and k != "inbox_depth"
    ]
    if isinstance(result.get("signed"), dict):
        counts.append(f"checkpoint at entry {result['signed']['seq']:,}")
    return ", ".join(counts) or "nothing"


def row(backend: str, job: str, run: dict[str, Any] | None, probe: Probe) -> str:
    """One table row: the job, its work, run time and writes; the probes' count and latency."""
    work = " | | "
    if run is not None:
        writes = (
            "-" if run["writes"] is None else f"{run['writes']:,}, longest {run['longest']:.1f} ms"
        )
        work = f"{handled(run['result'])} | {run['seconds']:.2f} | {writes}"
    sent = f"{len(probe.latencies):,}" + (f" ({probe.failed} failed)" if probe.failed else "")
    if probe.behind:  # the purge, ahead, moved the horizons past today: refused, not charged
        sent += f" ({probe.behind:,} dated before the purge's horizons)"
    figures = "- | - | -"  # the job was over before the first report was sent
    if probe.latencies:
        ms = np.asarray(probe.latencies) * 1000
        p50, p99 = np.percentile(ms, [50, 99])
        figures = f"{p50:.1f} | {p99:.1f} | {ms.max():.1f}"
    return f"| {backend} | {job} | {work} | {sent} | {figures} |"


def run_job_process(
    name: str, env: dict[str, str], tmp: Path, probe: Probe, cores: CoresApart | None
) -> dict[str, Any]:
    """Run one job in a new process (:func:`job_main`), probing while it runs; what it printed.

    That is the job's result, its run time in seconds, and its write transactions: how many,
    and the longest in ms (the longest it held SQLite's write lock).

    The probe starts when the process says its job is starting (after its imports) and stops
    when it prints the job's result.
    """
    ahead = AHEAD_DAYS if name == "purge" else 0
    root = str(Path(__file__).resolve().parents[1])  # this checkout, whatever the folder
    path = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    command = ["-m", "benchmarks.job_latency", "--run-job", name, "--ahead", str(ahead)]
    named = {} if cores is None else {"PGAPPNAME": JOB_SESSION_NAME}  # every job's sessions
    with subprocess.Popen(
        [sys.executable, *command],
        env={**env, "PYTHONPATH": path, **named},
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        if cores is not None:
            cores.add(proc.pid)
        started = proc.stdout.readline()
        with probe if started == "starting\n" else ExitStack():
            out = proc.stdout.readline()  # the result, once the job is done
        err = proc.communicate()[1]
    if cores is not None:
        cores.discard(proc.pid)
    if proc.returncode != 0 or not out.strip():
        raise SystemExit(f"job {name} failed: {err.strip()}")
    done: dict[str, Any] = json.loads(out)
    return done


class WriteTimes:
    """How long each write transaction on ``engine`` held it (ms): SQLite's write lock."""

    def __init__(self, engine: Engine) -> None:
        self.ms: list[float] = []
        self._began: dict[int, float] = {}
        event.listen(engine, "begin", self._begin)
        event.listen(engine, "commit", self._end)
        event.listen(engine, "rollback", self._end)

    def _begin(self, conn: Connection) -> None:
        if conn.get_execution_options().get(WRITE_OPTION, False):
            self._began[id(conn)] = time.perf_counter()

    def _end(self, conn: Connection) -> None:
        began = self._began.pop(id(conn), None)
        if began is not None:
            self.ms.append((time.perf_counter() - began) * 1000)


def run_job_served(name: str, base: str, probe: Probe) -> dict[str, Any]:
    """Run one job through the admin route (in the server's process), probing while it runs."""
    with probe:
        started = time.perf_counter()
        r = httpx.post(
            f"{base}/v1/admin/jobs/{name}:run",
            params={"wait": 600},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=3600,
        )
        seconds = time.perf_counter() - started
    r.raise_for_status()
    return {"result": r.json()["result"], "seconds": seconds, "writes": None}


def job_main(name: str, ahead_days: int) -> None:
    """The job process: the job run once as ``dpgov jobs run`` runs it, its clock moved ahead."""
    from dp_governor.api._job_database import as_job_sessions
    from dp_governor.api._job_process import lower_priority
    from dp_governor.api.cli.common import Access, load_settings, open_service
    from dp_governor.api.jobs import CHILD_JOBS, RUNTIMES, Runtime, run_job
    from dp_governor.budget import FixedClock
    from dp_governor.pipeline.ingest import Ingestor
    from dp_governor.pipeline.seal import InboxSeal

    settings = load_settings(None)
    if name in CHILD_JOBS:
        lower_priority(settings.job_cpu, settings.job_nice)
    ledger, keys = open_service(settings, Access.WRITE)
    if name in CHILD_JOBS and as_job_sessions(ledger.engine):
        ledger.engine.dispose()  # the sessions opened so far predate the setting
    clock = FixedClock(datetime.now(UTC) + timedelta(days=ahead_days))
    ingestor = Ingestor(ledger, keys.device_key_secret, seal=InboxSeal(keys.shuffler_keys))
    RUNTIMES["bench"] = Runtime.configured(ledger, ingestor, clock, settings)
    held = WriteTimes(ledger.engine)
    print("starting", flush=True)
    started = time.perf_counter()
    result = run_job(name, "bench", force=True)
    seconds = time.perf_counter() - started
    out = {"result": result, "seconds": seconds, "writes": len(held.ms), "longest": max(held.ms)}
    print(json.dumps(out), flush=True)
    ledger.engine.dispose()


def run(backend: str, url: str, tmp: Path, args: argparse.Namespace) -> list[str]:
    """The baseline and one row per job against one database."""
    named = {"PGAPPNAME": GATE_SESSIONS} if args.cores_apart else None
    proc, base = start_server(url, 1, tmp, args.batch_items, extra_env=named)
    env = server_env(url, tmp, args.batch_items)
    interval = args.interval_ms / 1000
    rows = []
    cores = None
    try:
        if args.cores_apart:
            cores = CoresApart(proc.pid, url if backend == "postgresql" else None)
        no_batch_minimum(base)
        bodies = report_bodies(base)
        with Probe(base, bodies, interval) as probe:
            time.sleep(args.baseline_seconds)
        rows.append(row(backend, "none (baseline)", None, probe))
        if args.control_seconds > 0:
            probe = Probe(base, bodies, interval)
            control = run_control(args.control_seconds, probe, cores)
            rows.append(row(backend, "busy process (control)", control, probe))
        for name in JOBS:
            if name in FILLED_BY:  # the fills happen whether or not the job that moves them runs
                fill(base, bodies, args.reports, args.batch_items)
            if name == "checkpoint" and backend == "postgresql":
                vacuum_unless_autovacuum(url)  # after the fills, before the passes read them
            if name not in args.jobs or (args.served and name == "purge"):
                continue  # purge served: a server's clock cannot be moved ahead (refused above)
            for n in range(1, args.repeat + 1):
                probe = Probe(base, bodies, interval)
                if args.served:
                    done = run_job_served(name, base, probe)
                else:
                    done = run_job_process(name, env, tmp, probe, cores)
                rows.append(
                    row(backend, name if args.repeat == 1 else f"{name} ({n})", done, probe)
                )
    finally:
        if cores is not None:
            cores.close()
        proc.terminate()
        proc.wait(timeout=60)
    return rows


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run on SQLite (and PostgreSQL), print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=100_000, help="reports a fill")
    parser.add_argument(
        "--interval-ms", type=float, default=10.0, help="one single report every this many ms"
    )
    parser.add_argument(
        "--baseline-seconds", type=float, default=5.0, help="probing with no job running"
    )
    parser.add_argument("--batch-items", type=int, default=5000, help="relay batch size")
    parser.add_argument("--postgres", default=os.environ.get("DPGOV_TEST_DATABASE_URL"))
    parser.add_argument(
        "--served", action="store_true", help="run the jobs in the server (its admin route)"
    )
    parser.add_argument(
        "--jobs",
        type=lambda text: [name for name in text.split(",") if name],
        default=list(JOBS),
        help=f"comma-separated jobs to run, in their usual order (default: {','.join(JOBS)})",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each job")
    parser.add_argument(
        "--control-seconds",
        type=float,
        default=10.0,
        help="probe this long beside a busy process with no database work at the job worker's"
        " niceness (0: no such row)",
    )
    parser.add_argument(
        "--no-sqlite", action="store_true", help="only the PostgreSQL rows (with --postgres)"
    )
    parser.add_argument(
        "--cores-apart",
        action="store_true",
        help="the gate on the first CPU, the jobs and their sessions on the second",
    )
    parser.add_argument("--run-job", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ahead", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_job is not None:
        job_main(args.run_job, args.ahead)
        return
    if args.reports < 1 or args.interval_ms <= 0 or args.baseline_seconds <= 0 or args.repeat < 1:
        parser.error("--reports, --interval-ms, --baseline-seconds and --repeat must be positive")
    if args.control_seconds < 0:
        parser.error("--control-seconds must not be negative (0: no control row)")
    unknown = sorted(set(args.jobs) - set(JOBS))
    if unknown or not args.jobs:
        parser.error(
            f"--jobs: unknown {', '.join(unknown) or '(none given)'}; one of {', '.join(JOBS)}"
        )
    if args.repeat > 1 and set(args.jobs) - set(REPEATABLE):
        parser.error(f"--repeat runs only {' and '.join(REPEATABLE)} again (--jobs)")
    if args.served and set(args.jobs) == {"purge"}:
        parser.error("--served cannot run purge (a server's clock cannot be moved ahead)")
    if args.no_sqlite and not args.postgres:
        parser.error("--no-sqlite needs --postgres")
    configs = ([] if args.no_sqlite else [("sqlite", None)]) + (
        [("postgresql", args.postgres)] if args.postgres else []
    )
    print(HEADER, flush=True)
    for label, pg_url in configs:
        with ExitStack() as stack:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            url = (
                stack.enter_context(scratch_schema(pg_url, "joblat"))
                if pg_url
                else f"sqlite:///{tmp / 'bench.sqlite'}"
            )
            for line in run(label, url, tmp, args):
                print(line, flush=True)


if __name__ == "__main__":
    main()

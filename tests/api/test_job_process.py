"""A service's population jobs run in its job worker, one long-lived child at the lowest priority.

The worker's scheduling class, niceness, process id and clock are read in it by the job itself
(a job swapped in for the real one, passed to the worker by reference); the real ``dashboard``
and ``verify`` run there too and store what the pages show. The worker is reused, started
again when it died, and ends with its server. Nothing here is timed: a wait for another
process polls with a generous deadline.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from typer.testing import CliRunner

from dp_governor.api import _job_process, _snapshots
from dp_governor.api._job_process import JobProcessError, JobWorker
from dp_governor.api._keys import ServiceKeys
from dp_governor.api._service import Service
from dp_governor.api._snapshots import FIGURES, VERIFICATION, read_snapshot, store_figures
from dp_governor.api.app import create_app
from dp_governor.api.cli import app as cli
from dp_governor.api.database import init_service_db
from dp_governor.api.jobs import (
    CHILD_JOBS,
    JOBS,
    RUNTIMES,
    Runtime,
    lease_of,
    run_job,
    run_scheduled,
)
from dp_governor.api.leases import LeaseLost, acquire_lease
from dp_governor.api.metrics import Metrics
from dp_governor.api.settings import Settings
from dp_governor.budget import FixedClock, Ledger
from dp_governor.budget.storage.db import write_step
from dp_governor.pipeline.ingest import Ingestor
from dp_governor.pipeline.seal import InboxSeal
from tests.live import app_settings

SECRET = b"child-secret-child-secret-child-secret!"
AUDIT = b"child-audit-key-child-audit-key-child!!"
SHUFFLER = b"child-shuffler-child-shuffler-child-shuf"
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
NICE = 7
KEY = "child"
KEYS = ServiceKeys(SECRET, AUDIT, ("test", "test"), (SHUFFLER,))
MARK = "DPGOV_TEST_JOB_MARK"  # read by the jobs below only: a file they write their pid to
DEADLINE = 300.0  # seconds another process may take on a busy machine: generous, never asserted


def _where(rt: Runtime) -> dict[str, Any]:
    """A job that says which process ran it, at what priority, and what its clock read."""
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    policy = os.sched_getscheduler(0)
    return {"pid": os.getpid(), "nice": nice, "policy": policy, "now": rt.clock.now().isoformat()}


def _hangs(rt: Runtime) -> dict[str, Any]:
    """A job that writes its process id to the file ``$DPGOV_TEST_JOB_MARK``, then never ends."""
    _hang_in_worker(None, os.environ[MARK])
    return {}


def _hang_in_worker(service: Service | None, mark: str) -> dict[str, Any]:
    """A worker call that writes its process id to ``mark``, then never ends."""
    Path(mark).write_text(str(os.getpid()), encoding="utf-8")
    threading.Event().wait()
    return {}


def _stores_after_a_takeover(rt: Runtime) -> dict[str, Any]:
    """Another holder takes the dashboard's lease over; then the job stores its figures."""
    acquire_lease(rt.ledger.engine, lease_of("dashboard"), "another process", 60, force=True)
    return store_figures(rt.ledger, now=rt.clock.now())


def _fails(rt: Runtime) -> dict[str, Any]:
    raise ValueError("`limit` must be positive, got -1")


def _loses_its_lease(rt: Runtime) -> dict[str, Any]:
    """Another holder takes the lease over; the job's next write is refused by its fence."""
    acquire_lease(rt.ledger.engine, lease_of("purge"), "another process", 60, force=True)
    with write_step(rt.ledger.engine) as conn:
        conn.execute(text("SELECT 1"))
    return {"written": True}


@pytest.fixture
def service(engine: Engine) -> Iterator[Metrics]:
    """A service's runtime over a database (SQLite file or PostgreSQL), with a job process."""
    init_service_db(engine)
    ledger = Ledger(engine, SECRET, audit_key=AUDIT)
    ledger.policies.ensure_defaults()
    url = engine.url.render_as_string(hide_password=False)
    settings = Settings(database_url=url, job_nice=NICE)
    metrics = Metrics(wall=lambda: 1_700_000_000.0)
    worker = JobWorker(settings, KEYS)
    RUNTIMES[KEY] = Runtime(
        ledger,
        Ingestor(ledger, SECRET, seal=InboxSeal([SHUFFLER])),
        FixedClock(NOW),
        metrics=metrics,
        worker=worker,
    )
    yield metrics
    RUNTIMES.pop(KEY, None)
    worker.close()


def _worker() -> JobWorker:
    worker = RUNTIMES[KEY].worker
    assert worker is not None
    return worker


def _eventually(check: Callable[[], bool], what: str) -> None:
    """Poll ``check`` until it holds (another process's doing), at most :data:`DEADLINE` s."""
    deadline = time.monotonic() + DEADLINE
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended: reaped, or every thread of it a zombie (Linux /proc).

    A killed process's first thread is a zombie while its other threads still exit, its files
    (the pipe to its server, its database connections) open until the last one has.
    """
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except (FileNotFoundError, ProcessLookupError):
        return True
    for task in tasks:
        try:
            stat = (task / "stat").read_text(encoding="utf-8")
        except (FileNotFoundError, ProcessLookupError):  # that thread has just ended
            continue
        if stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
            return False
    return True


def _runs(metrics: Metrics, job: str, outcome: str) -> float | None:
    return metrics.registry.get_sample_value(
        "dpgov_job_runs_total", {"job": job, "outcome": outcome}
    )


@pytest.mark.parametrize("name", sorted(CHILD_JOBS))
def test_a_scheduled_population_job_runs_in_the_worker_at_its_niceness(
    service: Metrics, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(JOBS, name, (_where, JOBS[name][1]))
    result = run_scheduled(name, KEY, 60.0, 0.0)
    assert result is not None
    assert result["pid"] != os.getpid() and result["pid"] == _worker().pid()
    assert result["policy"] == os.SCHED_OTHER  # the default, DPGOV_JOB_CPU=nice
    assert result["nice"] == min(19, os.getpriority(os.PRIO_PROCESS, 0) + NICE)
    assert result["now"] == NOW.isoformat()  # the parent's clock when it started the run
    assert _runs(service, name, "done") == 1  # counted by the parent, as in-process runs are


def test_the_worker_is_reused_and_started_again_when_it_died(
    service: Metrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in CHILD_JOBS:
        monkeypatch.setitem(JOBS, name, (_where, JOBS[name][1]))
    pids = {name: run_job(name, KEY)["pid"] for name in sorted(CHILD_JOBS)}  # type: ignore[index]
    first = _worker().pid()
    assert first is not None and set(pids.values()) == {first}
    os.kill(first, signal.SIGKILL)
    _eventually(lambda: _gone(first), "the killed worker never ended")
    again = run_job("verify", KEY)
    assert again is not None and again["pid"] not in (first, os.getpid())
    assert _runs(service, "verify", "done") == 2


def test_a_worker_killed_mid_run_fails_that_run_and_the_next_one_runs(
    service: Metrics, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    mark = tmp_path / "mark"
    monkeypatch.setenv(MARK, str(mark))  # the worker, started after this, inherits it
    monkeypatch.setitem(JOBS, "purge", (_hangs, JOBS["purge"][1]))
    failed: list[BaseException] = []

    def run() -> None:
        try:
            run_job("purge", KEY)
        except BaseException as exc:
            failed.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    _eventually(mark.exists, "the job never started in the worker")
    _eventually(lambda: mark.read_text(encoding="utf-8") != "", "the job never wrote its pid")
    os.kill(int(mark.read_text(encoding="utf-8")), signal.SIGKILL)
    runner.join(DEADLINE)
    assert not runner.is_alive()
    (exc,) = failed
    assert isinstance(exc, JobProcessError) and exc.error == "ProcessExited", exc
    assert _runs(service, "purge", "failed") == 1
    monkeypatch.setitem(JOBS, "purge", (_where, JOBS["purge"][1]))
    assert run_job("purge", KEY) is not None  # a new worker; the lease was released


def test_a_summary_store_after_a_lost_lease_does_not_land(
    service: Metrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(JOBS, "dashboard", (_stores_after_a_takeover, JOBS["dashboard"][1]))
    with pytest.raises(LeaseLost, match="lost its lease 'dashboard:run'"):
        run_job("dashboard", KEY)
    assert read_snapshot(RUNTIMES[KEY].ledger.engine, FIGURES) is None
    assert _runs(service, "dashboard", "lease_lost") == 1


def test_the_worker_ends_when_its_server_is_killed(tmp_path: Path) -> None:
    """A server process killed mid-job leaves no worker behind (it would write on, unleased)."""
    mark = tmp_path / "mark"
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    script = (
        "from dp_governor.api._job_process import JobWorker\n"
        "from dp_governor.api.settings import Settings\n"
        "from tests.api.test_job_process import KEYS, _hang_in_worker\n"
        f"JobWorker(Settings(database_url={url!r}), KEYS).call(_hang_in_worker, {str(mark)!r})\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    with subprocess.Popen([sys.executable, "-c", script], cwd=root, env=env) as server:
        try:
            _eventually(lambda: mark.exists() and mark.read_text() != "", "no worker started")
            worker = int(mark.read_text(encoding="utf-8"))
            assert worker != server.pid and not _gone(worker)
        finally:
            server.kill()
    _eventually(lambda: _gone(worker), "the worker outlived its killed server")


def test_idle_class_or_niceness_as_set(
    service: Metrics, monkeypatch: pytest.MonkeyPatch, engine: Engine
) -> None:
    url = engine.url.render_as_string(hide_password=False)
    idle = JobWorker(Settings(database_url=url, job_cpu="idle", job_nice=NICE), KEYS)
    monkeypatch.setattr(RUNTIMES[KEY], "worker", idle)
    monkeypatch.setitem(JOBS, "verify", (_where, JOBS["verify"][1]))
    try:
        result = run_job("verify", KEY)
    finally:
        idle.close()
    assert result is not None and result["policy"] == os.SCHED_IDLE
    assert result["nice"] == min(19, os.getpriority(os.PRIO_PROCESS, 0) + NICE)


def test_the_other_jobs_run_in_the_servers_process(
    service: Metrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in set(JOBS) - CHILD_JOBS:
        monkeypatch.setitem(JOBS, name, (_where, JOBS[name][1]))
        result = run_job(name, KEY)
        assert result is not None and result["pid"] == os.getpid(), name


def test_the_dashboard_and_verify_store_what_the_pages_show_from_the_worker(
    service: Metrics,
) -> None:
    engine = RUNTIMES[KEY].ledger.engine
    done = run_job("dashboard", KEY)
    assert done is not None and done["computed_at"] == NOW.isoformat()
    figures = read_snapshot(engine, FIGURES)
    assert figures is not None and figures.computed_at == NOW.isoformat()  # type: ignore[union-attr]
    verdict = run_job("verify", KEY)
    assert verdict is not None and verdict["ok"] is True, verdict
    assert read_snapshot(engine, VERIFICATION) is not None
    assert _runs(service, "dashboard", "done") == _runs(service, "verify", "done") == 1


def test_a_failure_in_the_worker_is_the_jobs_failure_in_one_line(
    service: Metrics, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(JOBS, "purge", (_fails, JOBS["purge"][1]))
    with caplog.at_level(logging.INFO, logger="dpgov.jobs"):
        with pytest.raises(JobProcessError, match="ValueError: `limit` must be positive"):
            run_job("purge", KEY)
    (line,) = [r for r in caplog.records if r.name == "dpgov.jobs"]
    assert getattr(line, "fields", {})["outcome"] == "failed"
    assert getattr(line, "fields", {})["error"] == "ValueError"  # the child's exception
    assert _runs(service, "purge", "failed") == 1
    monkeypatch.setitem(JOBS, "purge", (_where, JOBS["purge"][1]))
    assert run_job("purge", KEY) is not None  # its lease was released


def test_a_lease_lost_in_the_worker_stops_the_job(
    service: Metrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(JOBS, "purge", (_loses_its_lease, JOBS["purge"][1]))
    with pytest.raises(LeaseLost, match="lost its lease 'purge:run'"):
        run_job("purge", KEY)
    assert _runs(service, "purge", "lease_lost") == 1


def test_dpgov_jobs_run_lowers_its_priority_for_the_population_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with TestClient(create_app(app_settings(tmp_path, "child-admin-token-child-admin-token"))):
        pass  # the database and its key files
    env = {
        "DPGOV_DATABASE_URL": f"sqlite:///{tmp_path / 'service.sqlite'}",
        "DPGOV_SECRET_FILE": str(tmp_path / "secret"),
        "DPGOV_AUDIT_KEY_FILE": str(tmp_path / "audit.key"),
        "DPGOV_SHUFFLER_KEY_FILE": str(tmp_path / "shuffler.key"),
        "DPGOV_JOB_NICE": str(NICE),
    }
    lowered: list[tuple[str, int]] = []
    monkeypatch.setattr(  # not this test's own
        _job_process, "lower_priority", lambda cpu, nice: lowered.append((cpu, nice))
    )
    for name in ("checkpoint", "dashboard"):
        run = CliRunner().invoke(cli, ["jobs", "run", name], env=env)
        assert run.exit_code == 0, run.output
    assert lowered == [("nice", NICE)]  # for the dashboard, not for the checkpoint


def test_the_figures_a_request_waits_for_are_computed_in_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def not_here(ledger: Ledger, *, now: datetime) -> None:
        raise AssertionError("the figures were computed in the server's process")

    monkeypatch.setattr(_snapshots, "compute_figures", not_here)  # this process's only
    settings = app_settings(tmp_path, "child-admin-token-child-admin-token")
    settings = settings.model_copy(update={"figures_wait_seconds": DEADLINE})
    with TestClient(create_app(settings, clock=FixedClock(NOW))) as client:
        r = client.get("/v1/audit/effective-epsilon")  # a fresh install: none stored yet
        assert r.status_code == 200, r.text
        worker = RUNTIMES[client.app.state.runtime_key].worker  # type: ignore[attr-defined]
        assert worker is not None and worker.pid() not in (None, os.getpid())
    assert worker.pid() is None  # closed with the app


def _unsendable(service: Service) -> dict[str, Any]:
    """A worker call whose result cannot be pickled back."""
    return {"lock": threading.Lock()}


def _pid_in_worker(service: Service) -> dict[str, Any]:
    """A worker call that says which process ran it."""
    return {"pid": os.getpid()}


def test_a_result_that_cannot_be_sent_back_fails_its_call_and_the_worker_goes_on(
    service: Metrics,
) -> None:
    worker = _worker()
    with pytest.raises(JobProcessError, match="could not be sent back"):
        worker.call(_unsendable)
    first = worker.pid()
    assert worker.call(_pid_in_worker)["pid"] == first  # the same worker answers the next call


def test_ctrl_c_is_the_servers_the_worker_keeps_answering_until_closed(service: Metrics) -> None:
    worker = _worker()
    pid = worker.call(_pid_in_worker)["pid"]
    os.kill(pid, signal.SIGINT)  # as a terminal's Ctrl-C reaches the whole process group
    assert worker.call(_pid_in_worker)["pid"] == pid

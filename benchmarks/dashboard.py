"""Dashboard benchmark: the public page's cost against the ledger; prints a Markdown table.

Usage: ``python -m benchmarks.dashboard [--devices 10000] [--days 10] [--new-charges 1000]
[--requests 200] [--postgres postgresql+psycopg://postgres@127.0.0.1:5432/test [--no-sqlite]]``.

An in-process app (its own keys and default policies, no scheduler) over a fresh database
holding the ledger :func:`benchmarks.scale.build` writes for ``--devices`` devices over
``--days`` days (without its audit entries: no figure of the page reads them), the clock at
noon of the day after. Measured, wall and CPU of this process (the app's threads included) and
of the job processes it spawned and waited for:

- fresh install: the first ``GET /`` with no stored figures: it starts the refresher and waits
  for it at most ``figures_wait_seconds`` (2 s), then answers 503 with ``Retry-After`` (or 200
  when the figures were computed in time); then the refresher's run to the stored figures (the
  ``dashboard`` job's computation, a full pass with no stored report summary), timed from that
  request; then the first ``GET /`` once they are stored;
- the ``dashboard`` job after ``--new-charges`` more charges through the gate (the report's
  summary and the series brought up to date by what changed), once more with nothing new, and
  on the next day after as many charges of that day (every window moved by a day);
- the series alone (every use case's), in this process: on the day after that, after as many
  charges, brought forward from the job's stored states, then computed from the windows'
  charges (what the job did for every run before it kept them);
- first page: ``GET /`` of a newly started app on the stored figures (nothing cached in it);
- steady page, report and distribution: the mean over ``--requests`` requests each once the
  figures are stored (the page cached, the report and the spends parsed once);
- page after a job: the first ``GET /`` after another job run (the row parsed again, the page
  drawn again).
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient
from pydantic import SecretStr

from benchmarks.scale import FIRST_DAY, build, noon
from benchmarks.verify import charge_day
from dp_governor.api._snapshots import FIGURES, read_snapshot
from dp_governor.api.app import create_app
from dp_governor.api.settings import Settings
from dp_governor.budget import FixedClock, Ledger
from dp_governor.budget.reporting.series import cumulative_series
from dp_governor.budget.reporting.series_forward import series_brought_forward
from dp_governor.budget.storage.db import scratch_schema

TOKEN = "dashboard-benchmark-admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
JOB = "/v1/admin/jobs/dashboard:run"

Timing = tuple[float, float]  # (wall ms, CPU ms)


@contextmanager
def _settings(kind: str, pg_url: str | None) -> Iterator[Settings]:
    """Settings of a fresh database: a SQLite file, or a throw-away PostgreSQL schema."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("DPGOV_SCALE_DIR")) as tmp:
        folder = Path(tmp)

        def settings(url: str) -> Settings:
            return Settings(
                database_url=url,
                secret_file=folder / "secret",
                audit_key_file=folder / "audit.key",
                shuffler_key_file=folder / "shuffler.key",
                admin_token=SecretStr(TOKEN),
                scheduler=False,
            )

        if kind == "sqlite":
            yield settings(f"sqlite:///{folder / 'dashboard.sqlite'}")
            return
        assert pg_url is not None
        with scratch_schema(pg_url, "dash") as url:
            yield settings(url)


def _cpu() -> float:
    """CPU seconds of this process (the app's threads too) and of its children, live or ended.

    The ``dashboard`` job runs in the app's job worker, a child process that lives on between
    runs (its start-up counted in the first run that starts it); psutil reads its CPU so far.
    """
    import psutil

    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    live = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.NoSuchProcess:  # ended since the listing: counted in `ended` once reaped
            continue
        live += times.user + times.system
    return time.process_time() + ended.ru_utime + ended.ru_stime + live


def _timed(call: Callable[[], object]) -> Timing:
    """``(wall ms, CPU ms)`` of one call; CPU as :func:`_cpu` counts it."""
    wall, cpu = time.perf_counter(), _cpu()
    call()
    return (time.perf_counter() - wall) * 1000, (_cpu() - cpu) * 1000


def _get(client: TestClient, path: str) -> Callable[[], object]:
    def call() -> object:
        response = client.get(path)
        assert response.status_code == 200, (path, response.text[:200])
        return response

    return call


def _job(client: TestClient) -> Callable[[], object]:
    def call() -> object:
        response = client.post(JOB, headers=ADMIN)
        assert response.status_code == 200, response.text[:200]
        return response

    return call


def _mean(client: TestClient, path: str, requests: int) -> Timing:
    client.get(path)  # parsed and drawn once
    runs = [_timed(_get(client, path)) for _ in range(requests)]
    return sum(w for w, _ in runs) / requests, sum(c for _, c in runs) / requests


def _fresh_install(client: TestClient, ledger: Ledger) -> list[tuple[str, Timing]]:
    """The first page with no figures, the refresher's run to stored figures, the next page."""
    wall, cpu = time.perf_counter(), _cpu()
    first = client.get("/")
    answered = (time.perf_counter() - wall) * 1000, (_cpu() - cpu) * 1000
    assert first.status_code in (200, 503), first.text[:200]
    status = f"{first.status_code}" + (
        f", Retry-After {first.headers['Retry-After']}" if first.status_code == 503 else ""
    )
    while read_snapshot(ledger.engine, FIGURES) is None:
        time.sleep(0.05)
    stored = (time.perf_counter() - wall) * 1000, (_cpu() - cpu) * 1000
    return [
        (f"fresh install: first page, answered {status}", answered),
        ("fresh install: figures stored by the refresher, from that request", stored),
        ("fresh install: first page once stored", _timed(_get(client, "/"))),
    ]


def _series(
    ledger: Ledger, clock: FixedClock, devices: int, day: int, new_charges: int
) -> list[tuple[str, Timing]]:
    """The series alone, in this process, on ``day`` after its charges: brought forward, afresh."""
    clock.advance(days=1)
    added = charge_day(ledger, devices, day, new_charges, attempts=2)
    names = [p.name for p in ledger.book().active]
    now = clock.now()
    forward = _timed(lambda: series_brought_forward(ledger, names, now=now))
    afresh = _timed(lambda: [cumulative_series(ledger, name, now=now) for name in names])
    return [
        (f"the series brought forward, the next day after {added:,d} new charges", forward),
        ("the series from their windows' charges (as many use cases)", afresh),
    ]


def run(
    kind: str, pg_url: str | None, *, devices: int, days: int, new_charges: int, requests: int
) -> list[str]:
    """Every measurement on one backend; returns the table's rows."""
    day = FIRST_DAY + days  # the day after the generated ones
    clock = FixedClock(noon(day))
    rows: list[tuple[str, Timing]] = []
    with _settings(kind, pg_url) as settings:
        with TestClient(create_app(settings, clock=clock)) as client:
            ledger: Ledger = client.app.state.ledger  # type: ignore[attr-defined]
            built = build(
                ledger, devices=devices, days=days, rng=np.random.default_rng(33), audit=False
            )
            rows += _fresh_install(client, ledger)
            added = charge_day(ledger, devices, day, new_charges, attempts=2)
            rows.append((f"`dashboard` job after {added:,d} new charges", _timed(_job(client))))
            rows.append(("`dashboard` job, nothing new", _timed(_job(client))))
            clock.advance(days=1)  # the windows move: a day leaves them, the new one enters
            added = charge_day(ledger, devices, day + 1, new_charges, attempts=2)
            what = f"`dashboard` job the next day, after {added:,d} new charges"
            rows.append((what, _timed(_job(client))))
            rows += _series(ledger, clock, devices, day + 2, new_charges)
        with TestClient(create_app(settings, clock=clock)) as client:
            rows.append(("first page of a new process", _timed(_get(client, "/"))))
            rows.append((f"steady page (mean of {requests})", _mean(client, "/", requests)))
            report = "/v1/audit/effective-epsilon"
            rows.append((f"steady report (mean of {requests})", _mean(client, report, requests)))
            dist = "/v1/audit/use-cases/emoji/distribution?bins=50"
            rows.append(
                (f"steady distribution (mean of {requests})", _mean(client, dist, requests))
            )
            _job(client)()
            rows.append(("first page after a job run", _timed(_get(client, "/"))))
    size = f"{devices:,d} | {built.charges:,d}"
    return [
        f"| {kind} | {size} | {what} | {wall:,.1f} ms | {cpu:,.1f} ms |"
        for what, (wall, cpu) in rows
    ]


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--days", type=int, default=10)
    parser.add_argument("--new-charges", type=int, default=1_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--postgres", default=os.environ.get("DPGOV_TEST_DATABASE_URL"))
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL's rows only")
    args = parser.parse_args(argv)
    if min(args.devices, args.days, args.new_charges, args.requests) < 1:
        parser.error("--devices, --days, --new-charges and --requests must be at least 1")
    sizes = {"devices": args.devices, "days": args.days, "new_charges": args.new_charges}
    print("| backend | devices | charges | what | wall | CPU |")
    print("|---|---:|---:|---|---:|---:|")
    if not args.no_sqlite:
        for line in run("sqlite", None, **sizes, requests=args.requests):
            print(line, flush=True)
    if args.postgres:
        for line in run("postgresql", args.postgres, **sizes, requests=args.requests):
            print(line, flush=True)


if __name__ == "__main__":
    main()

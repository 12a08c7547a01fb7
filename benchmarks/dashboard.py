"""Dashboard benchmark: the public page's cost against the ledger; prints a Markdown table.

Usage: ``python -m benchmarks.dashboard [--charges 140000] [--requests 200]
[--postgres postgresql+psycopg://postgres@127.0.0.1:5432/test]``.

An in-process app (its own keys and default policies) over a fresh database, bulk-loaded with
``--charges`` Emoji charges (1 to 5 per device, with their accounts:
:func:`benchmarks.budget.load_population`). Measured, wall and CPU of this process (the app's
threads included):

- fresh install: the first ``GET /`` with no stored figures, which computes them once;
- snapshot job: the ``dashboard`` job (every figure computed from the ledger, then stored);
- first page: ``GET /`` of a newly started app on the stored figures (nothing cached in it);
- steady page, report and distribution: the mean over ``--requests`` requests each once the
  figures are stored (the page cached, the report and the spends parsed once);
- page after a job: the first ``GET /`` after another job run (the row parsed again, the page
  drawn again).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fastapi.testclient import TestClient
from pydantic import SecretStr

from benchmarks.budget import NOW, load_population
from dp_governor.api.app import create_app
from dp_governor.api.settings import Settings
from dp_governor.budget import FixedClock
from dp_governor.budget.storage.db import scratch_schema

TOKEN = "dashboard-benchmark-admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
MEAN_CHARGES_PER_DEVICE = 3  # load_population gives device d 1 + d % 5 charges


@contextmanager
def _settings(kind: str, pg_url: str | None) -> Iterator[Settings]:
    """Settings of a fresh database: a SQLite file, or a throw-away PostgreSQL schema."""
    with tempfile.TemporaryDirectory() as tmp:
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


def _timed(call: Callable[[], object]) -> tuple[float, float]:
    """``(wall ms, CPU ms)`` of one call; CPU of the whole process (the app's threads too)."""
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000


def _get(client: TestClient, path: str) -> Callable[[], object]:
    def call() -> object:
        response = client.get(path)
        assert response.status_code == 200, (path, response.text[:200])
        return response

    return call


def _mean(client: TestClient, path: str, requests: int) -> tuple[float, float]:
    client.get(path)  # parsed and drawn once
    runs = [_timed(_get(client, path)) for _ in range(requests)]
    return sum(w for w, _ in runs) / requests, sum(c for _, c in runs) / requests


def run(kind: str, pg_url: str | None, charges: int, requests: int) -> list[str]:
    """Every measurement on one backend; returns the table's rows."""
    devices = max(1, charges // MEAN_CHARGES_PER_DEVICE)
    rows: list[tuple[str, tuple[float, float]]] = []
    with _settings(kind, pg_url) as settings:
        with TestClient(create_app(settings, clock=FixedClock(NOW))) as client:
            ledger = client.app.state.ledger  # type: ignore[attr-defined]
            loaded = load_population(ledger.engine, ledger, devices)
            rows.append(
                ("fresh install: first page, computes the figures", _timed(_get(client, "/")))
            )
            job = client.post
            rows.append(
                (
                    "snapshot job (`dashboard`)",
                    _timed(lambda: job("/v1/admin/jobs/dashboard:run", headers=ADMIN)),
                )
            )
        with TestClient(create_app(settings, clock=FixedClock(NOW))) as client:
            rows.append(("first page of a new process", _timed(_get(client, "/"))))
            rows.append((f"steady page (mean of {requests})", _mean(client, "/", requests)))
            report = "/v1/audit/effective-epsilon"
            rows.append((f"steady report (mean of {requests})", _mean(client, report, requests)))
            dist = "/v1/audit/use-cases/emoji/distribution?bins=50"
            rows.append(
                (f"steady distribution (mean of {requests})", _mean(client, dist, requests))
            )
            client.post("/v1/admin/jobs/dashboard:run", headers=ADMIN)
            rows.append(("first page after a job run", _timed(_get(client, "/"))))
    return [
        f"| {kind} | {loaded:,d} | {what} | {wall:,.1f} ms | {cpu:,.1f} ms |"
        for what, (wall, cpu) in rows
    ]


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--charges", type=int, default=140_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--postgres", default=os.environ.get("DPGOV_TEST_DATABASE_URL"))
    args = parser.parse_args(argv)
    print("| backend | charges | what | wall | CPU |")
    print("|---|---|---|---|---|")
    for line in run("sqlite", None, args.charges, args.requests):
        print(line, flush=True)
    if args.postgres:
        for line in run("postgresql", args.postgres, args.charges, args.requests):
            print(line, flush=True)


if __name__ == "__main__":
    main()

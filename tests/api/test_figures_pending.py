"""No visitor computes the audit figures: a policy edit makes the refresher compute them.

In-process app on a real SQLite file, no scheduler, its job worker replaced by one that runs
each call in the caller's thread (the worker itself: ``tests/api/test_job_process.py``). After a
policy edit the stored figures no longer match the policies in force; the next public request
starts the refresher (a thread of its own) and waits for it, or answers 503 with
``Retry-After`` (JSON on the API, a page that reloads itself on the dashboard) when it takes
longer than ``figures_wait_seconds``. Figures computed under other policies are never served.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from dp_governor.api import _caches, _snapshots, app
from dp_governor.api._snapshots import FIGURES, Figures, compute_figures, read_snapshot
from dp_governor.api.app import create_app
from dp_governor.budget import FixedClock
from dp_governor.policies import PolicyCreate
from tests.api.worker_double import InProcessWorker
from tests.live import app_settings

TOKEN = "pending-admin-token-pending-admin-token-01"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)


class _Computations:
    """The real ``compute_figures``, recording the thread of each call; can be held or failed."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.threads: list[str] = []
        self.release = threading.Event()
        self.release.set()
        self.fail = False

    def __call__(self, ledger: Any, *, now: datetime) -> Figures:
        self.threads.append(threading.current_thread().name)
        self.release.wait(timeout=600)
        if self.fail:
            raise RuntimeError("the ledger could not be read")
        figures: Figures = self.real(ledger, now=now)
        return figures


@pytest.fixture
def computations(monkeypatch: pytest.MonkeyPatch) -> _Computations:
    calls = _Computations(compute_figures)
    monkeypatch.setattr(_snapshots, "compute_figures", calls)
    monkeypatch.setattr(app, "JobWorker", InProcessWorker)
    return calls


def _client(tmp_path: Path, wait: float) -> TestClient:
    settings = app_settings(tmp_path, TOKEN).model_copy(update={"figures_wait_seconds": wait})
    return TestClient(create_app(settings, clock=FixedClock(NOW)))


def _new_use_case(client: TestClient, name: str) -> None:
    """Create ``name`` with emoji's terms: a new policy revision."""
    policy = client.get("/v1/use-cases/emoji").json()
    fields = {k: v for k, v in policy.items() if k in PolicyCreate.model_fields}
    fields.update(name=name, budget_group=None)
    r = client.put(f"/v1/use-cases/{name}", json=fields, headers=ADMIN)
    assert r.status_code == 200, r.text


def _stored(client: TestClient) -> Figures | None:
    found = read_snapshot(client.app.state.ledger.engine, FIGURES)  # type: ignore[attr-defined]
    assert found is None or isinstance(found, Figures)
    return found


def _wait_stored(client: TestClient, names: set[str]) -> Figures:
    """The stored figures once they hold ``names`` (the refresher finishing in the background)."""
    deadline = time.monotonic() + 600  # generous: a busy machine computes slowly
    while time.monotonic() < deadline:
        found = _stored(client)
        if found is not None and names <= {s.use_case for s in found.spends}:
            return found
        time.sleep(0.05)
    raise AssertionError("the refresher never stored the figures")


@pytest.fixture
def waiting(tmp_path: Path, computations: _Computations) -> Iterator[TestClient]:
    with _client(tmp_path, wait=600) as client:
        yield client


def test_after_a_policy_edit_the_refresher_computes_and_the_request_waits(
    waiting: TestClient, computations: _Computations
) -> None:
    assert waiting.get("/v1/audit/effective-epsilon").status_code == 200  # a fresh install
    _new_use_case(waiting, "emoji-copy")
    r = waiting.get("/v1/audit/use-cases/emoji-copy/distribution")
    assert r.status_code == 200, r.text
    report = waiting.get("/v1/audit/effective-epsilon").json()
    assert "emoji-copy" in {u["use_case"] for u in report["use_cases"]}
    assert waiting.get("/").status_code == 200
    # two computations (install, edit), each in the refresher's thread, none in a request's
    assert computations.threads == ["dpgov-figures", "dpgov-figures"], computations.threads


def test_figures_slower_than_the_wait_answer_503_and_never_the_old_ones(
    tmp_path: Path, computations: _Computations
) -> None:
    with _client(tmp_path, wait=0.2) as client:
        computations.release.set()
        assert client.get("/v1/audit/effective-epsilon").status_code in (200, 503)
        before = _wait_stored(client, {"emoji"})
        computations.release.clear()  # the next computation is held
        _new_use_case(client, "emoji-copy")
        api = client.get("/v1/audit/effective-epsilon")
        assert api.status_code == 503, api.text
        assert int(api.headers["Retry-After"]) >= 1
        assert "computed under other policies than those in force" in api.json()["detail"]
        page = client.get("/", headers={"accept": "text/html"})
        assert page.status_code == 503 and 'http-equiv="refresh"' in page.text
        assert 'id="pending"' in page.text
        dist = client.get("/v1/audit/use-cases/emoji/distribution")
        assert dist.status_code == 503, dist.text
        assert len(computations.threads) == 2  # many requests, one computation of the edit
        assert _stored(client) == before  # still the old figures, never served
        computations.release.set()
        after = _wait_stored(client, {"emoji", "emoji-copy"})
        assert after.book != before.book
        report = client.get("/v1/audit/effective-epsilon")
        assert report.status_code == 200, report.text
        assert "emoji-copy" in {u["use_case"] for u in report.json()["use_cases"]}


def test_a_failed_computation_is_not_retried_by_every_request(
    tmp_path: Path, computations: _Computations, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_caches, "_RETRY_FAILED", 3600.0)
    computations.fail = True
    with _client(tmp_path, wait=0.2) as client:
        for _ in range(5):
            r = client.get("/v1/audit/effective-epsilon")
            assert r.status_code == 503, r.text
            assert "no audit figures have been computed yet" in r.json()["detail"]
        assert computations.threads == ["dpgov-figures"]

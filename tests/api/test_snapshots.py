"""The public pages read the figures the jobs stored; no request scans the ledger.

In-process app on a real SQLite file. The stored figures equal the direct computation from
the ledger; once stored, a public page or route makes only a few small queries and none of
the ledger's tables (counted on the engine); charges after them change nothing until the
``dashboard`` job runs; the ``verify`` job's verdict is what the page and the metrics show.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from dp_governor.api._snapshots import (
    FIGURES,
    VERIFICATION,
    Figures,
    Verified,
    compute_figures,
    read_snapshot,
)
from dp_governor.api._verdict_text import SEALED_OPENED
from dp_governor.api.app import create_app
from dp_governor.api.schemas import AuditVerification
from dp_governor.budget import FixedClock
from dp_governor.budget.reporting.activity import daily_activity
from dp_governor.budget.reporting.loss import effective_epsilon_basis
from dp_governor.budget.reporting.report import finish_report
from dp_governor.budget.reporting.series import cumulative_series
from dp_governor.budget.reporting.views import distribution
from dp_governor.budget.storage.db import scratch_schema
from dp_governor.policies import PolicyCreate, mechanism_for
from tests.conftest import BACKENDS, PG_URL
from tests.live import app_settings

TOKEN = "snapshot-admin-token-snapshot-admin-0123"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
LEDGER_TABLES = ("accounts", "charges", "audit_log", "shuffled_batches", "idempotency")


def _send(client: TestClient, use_case: str, devices: range, seed: int) -> None:
    """One report from each device, privatized by the use case's own mechanism."""
    policy = client.get(f"/v1/use-cases/{use_case}").json()
    fields = {k: v for k, v in policy.items() if k in PolicyCreate.model_fields}
    mech = mechanism_for(PolicyCreate.model_validate(fields))
    bodies = mech.privatize(["a"] * len(devices), rng=np.random.default_rng(seed)).to_dicts()
    items = [{"device_id": f"dev-{d}", "report": b} for d, b in zip(devices, bodies, strict=True)]
    r = client.post(f"/v1/use-cases/{use_case}/reports:batch", json={"items": items}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["accepted"] == len(devices), r.text


@pytest.fixture(params=BACKENDS)
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TestClient]:
    """An in-process app on a new SQLite file or PostgreSQL schema, with two use cases' reports."""
    settings = app_settings(tmp_path, TOKEN)
    database: AbstractContextManager[str] = nullcontext(settings.database_url)
    if request.param == "postgresql":
        assert PG_URL is not None
        database = scratch_schema(PG_URL, "snap")
    with (
        database as url,
        TestClient(
            create_app(settings.model_copy(update={"database_url": url}), clock=FixedClock(NOW))
        ) as c,
    ):
        _send(c, "emoji", range(150), seed=1)
        _send(c, "safari-energy-domains", range(100, 220), seed=2)
        yield c


@contextmanager
def _statements(client: TestClient) -> Iterator[list[str]]:
    """Every SQL statement the app's engine runs in the block (appended as they run)."""
    seen: list[str] = []
    engine = client.app.state.ledger.engine  # type: ignore[attr-defined]

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _ledger_reads(statements: list[str]) -> list[str]:
    return [s for s in statements if any(f" {t}" in s for t in LEDGER_TABLES)]


def test_the_stored_figures_equal_the_direct_computation(client: TestClient) -> None:
    assert client.post("/v1/admin/jobs/dashboard:run", headers=ADMIN).status_code == 200
    ledger = client.app.state.ledger  # type: ignore[attr-defined]
    stored = read_snapshot(ledger.engine, FIGURES)
    assert isinstance(stored, Figures)
    assert asdict(stored) == asdict(compute_figures(ledger, now=NOW)) | {
        "seconds": stored.seconds,
        "computed_at": stored.computed_at,
    }
    direct = finish_report(effective_epsilon_basis(ledger, now=NOW), accountant=ledger.accountant)
    assert asdict(stored.report) == asdict(direct)
    policies = [p.name for p in client.app.state.ledger.policies.list()]  # type: ignore[attr-defined]
    assert [s.use_case for s in stored.series] == policies
    for s in stored.series:
        assert asdict(s) == asdict(cumulative_series(ledger, s.use_case, now=NOW))
    for name in policies:
        for scope in ("window", "lifetime"):
            spends = stored.spends_of(name, scope)
            assert spends is not None
            for bins in (1, 2, 7, 20, 200):
                expected = distribution(ledger, name, now=NOW, scope=scope, bins=bins)
                assert asdict(spends.distribution(bins)) == asdict(expected), (name, scope, bins)
    emoji = stored.spends_of("emoji", "window")
    assert emoji is not None and sum(emoji.counts) == 150
    activity = daily_activity(ledger.engine, now=NOW, days=14)
    assert asdict(stored.activity) == asdict(activity)
    assert stored.activity.accepted["emoji"][-1] == 150


def test_a_public_page_reads_the_stored_figures_not_the_ledger(client: TestClient) -> None:
    assert client.post("/v1/admin/jobs/dashboard:run", headers=ADMIN).status_code == 200
    first = client.get("/")
    assert first.status_code == 200 and "by the scheduled <code>dashboard</code> job" in first.text
    routes = [
        "/",
        "/v1/audit/effective-epsilon",
        "/v1/audit/use-cases/emoji/distribution?bins=7",
        "/v1/audit/use-cases/safari-energy-domains/distribution?scope=lifetime",
    ]
    for route in routes:
        client.get(route)  # each worker parses the stored row once
        with _statements(client) as seen:
            response = client.get(route)
        assert response.status_code == 200, (route, response.text)
        assert _ledger_reads(seen) == [], (route, seen)
        assert len(seen) <= 6, (route, seen)  # the book's revision, the rows' tokens, policies
    report = client.get("/v1/audit/effective-epsilon").json()
    line = next(u for u in report["use_cases"] if u["use_case"] == "emoji")
    assert line["spent_window"]["devices"] == 150
    # charges after the figures change nothing until the dashboard job runs again
    _send(client, "emoji", range(1000, 1040), seed=3)
    with _statements(client) as seen:
        again = client.get("/v1/audit/effective-epsilon").json()
    assert _ledger_reads(seen) == [], seen
    assert next(u for u in again["use_cases"] if u["use_case"] == "emoji") == line
    assert client.post("/v1/admin/jobs/dashboard:run", headers=ADMIN).status_code == 200
    after = client.get("/v1/audit/effective-epsilon").json()
    fresh = next(u for u in after["use_cases"] if u["use_case"] == "emoji")
    assert fresh["spent_window"]["devices"] == 190


def test_a_fresh_install_computes_its_figures_once(client: TestClient) -> None:
    ledger = client.app.state.ledger  # type: ignore[attr-defined]
    assert read_snapshot(ledger.engine, FIGURES) is None
    assert client.get("/").status_code == 200
    stored = read_snapshot(ledger.engine, FIGURES)
    assert isinstance(stored, Figures)
    for _ in range(3):
        client.get("/v1/audit/effective-epsilon")
        client.get("/")
    later = read_snapshot(ledger.engine, FIGURES)
    assert isinstance(later, Figures) and later == stored  # not computed again


def test_the_page_and_the_metrics_show_the_scheduled_verification(client: TestClient) -> None:
    page = client.get("/").text
    assert 'id="chain-status">not verified yet' in page
    job = client.post("/v1/admin/jobs/verify:run", headers=ADMIN)
    assert job.status_code == 200, job.text
    result = job.json()["result"]
    assert result["ok"] is True and result["entries"] > 0, result
    page = client.get("/").text
    assert '<span class="ok" id="chain-status">verified</span>' in page
    assert f'id="chain-entries">entries 1 to {result["entries"]:,d}</span>' in page
    metrics = client.get("/metrics", headers=ADMIN).text
    assert "dpgov_audit_verification_ok 1.0" in metrics
    assert 'dpgov_job_runs_total{job="verify",outcome="done"} 1.0' in metrics
    # another worker, which ran no verification, shows the recorded one
    settings = client.app.state.settings  # type: ignore[attr-defined]
    with TestClient(create_app(settings, clock=FixedClock(NOW))) as worker:
        metrics = worker.get("/metrics", headers=ADMIN).text
        assert "dpgov_audit_verification_ok 1.0" in metrics, metrics
        (at,) = [
            float(line.split()[1])
            for line in metrics.splitlines()
            if line.startswith("dpgov_audit_verification_timestamp_seconds ")
        ]
        assert at == NOW.timestamp()  # the job's time (the app's clock), not this worker's
        assert "verified</span>" in worker.get("/").text


def _page_entries(page: str) -> tuple[int, int] | None:
    """The span the page's chain line names (``None``: "no entry ...")."""
    text = page.split('id="chain-entries">', 1)[1].split("</span>", 1)[0]
    found = re.match(r"entries ([\d,]+) to ([\d,]+)", text)
    if found is None:
        assert text.startswith("no entry"), text
        return None
    first, last = (int(n.replace(",", "")) for n in found.groups())
    return first, last


def test_the_pages_entries_are_the_stored_verifications_json(client: TestClient) -> None:
    """Full, incremental and empty runs: the page says the entries the JSON's fields name."""
    assert client.post("/v1/admin/jobs/checkpoint:run", headers=ADMIN).status_code == 200
    ledger = client.app.state.ledger  # type: ignore[attr-defined]
    for step in range(3):
        if step == 1:
            _send(client, "emoji", range(500, 530), seed=4)  # new entries after the checkpoint
        assert client.post("/v1/admin/jobs/verify:run", headers=ADMIN).status_code == 200
        stored = read_snapshot(ledger.engine, VERIFICATION)
        assert isinstance(stored, Verified)
        json_view = AuditVerification(**stored.verification.to_dict()).model_dump()
        page = client.get("/", headers=ADMIN).text  # not the public page's cache (a fixed clock)
        first, last = json_view["from_seq"] + 1, json_view["from_seq"] + json_view["entries"]
        assert _page_entries(page) == (None if last < first else (first, last)), (step, json_view)
        assert json_view["ok"] and last in (json_view["head_seq"], json_view["from_seq"])
        note = escape(str(json_view["note"]))
        assert f'id="chain-note">note: {note}</span>' in page
        assert SEALED_OPENED in str(json_view["note"])  # the job opened the sealed rows
        if step == 1:
            assert json_view["from_seq"] > 0 and json_view["entries"] > 0  # incremental
    http = client.get("/v1/audit/verify", headers=ADMIN).json()  # the route: full, from 0
    assert http["ok"] and SEALED_OPENED in http["note"], http

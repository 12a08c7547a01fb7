"""Prometheus metrics of the operations an operator watches: job runs and audit verification."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from dp_governor.api._handles import ledger_engine
from dp_governor.api.app import create_app
from dp_governor.api.jobs import lease_of
from dp_governor.api.leases import acquire_lease
from tests.live import app_settings

TOKEN = "metrics-admin-token-metrics-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = app_settings(tmp_path, TOKEN)
    with TestClient(create_app(settings)) as c:
        yield c


def scrape(client: TestClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of ``/metrics``, parsed as Prometheus parses it."""
    answer = client.get("/metrics")
    assert answer.status_code == 200
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def test_job_runs_their_outcomes_and_last_success_are_scraped(client: TestClient) -> None:
    assert client.post("/v1/admin/jobs/checkpoint:run", headers=ADMIN).status_code == 200
    engine = ledger_engine(client.app.state.ledger)  # type: ignore[attr-defined]
    assert acquire_lease(engine, lease_of("purge"), "another-process", 3600.0) is not None
    assert client.post("/v1/admin/jobs/purge:run", headers=ADMIN).status_code == 409
    seen = scrape(client)
    checkpoint, purge = frozenset({("job", "checkpoint")}), frozenset({("job", "purge")})
    assert seen["dpgov_job_runs_total", checkpoint | {("outcome", "done")}] == 1
    assert seen["dpgov_job_runs_total", purge | {("outcome", "skipped")}] == 1
    assert seen["dpgov_job_duration_seconds_count", checkpoint] == 1
    assert seen["dpgov_job_last_success_timestamp_seconds", checkpoint] > 1.7e9
    assert ("dpgov_job_last_success_timestamp_seconds", purge) not in seen  # never succeeded
    assert ("dpgov_job_failures_total", checkpoint) not in seen


def test_the_audit_verification_result_and_age_are_scraped(client: TestClient) -> None:
    before = scrape(client)
    assert math.isnan(before["dpgov_audit_verification_ok", frozenset()])
    assert math.isnan(before["dpgov_audit_verification_age_seconds", frozenset()])
    verdict = client.get("/v1/audit/verify", headers=ADMIN)
    assert verdict.status_code == 200 and verdict.json()["ok"]
    after = scrape(client)
    assert after["dpgov_audit_verification_ok", frozenset()] == 1
    assert after["dpgov_audit_verification_timestamp_seconds", frozenset()] > 1.7e9
    assert 0 <= after["dpgov_audit_verification_age_seconds", frozenset()] < 3600
    assert client.get("/").status_code == 200  # the dashboard verifies too (cached)
    assert scrape(client)["dpgov_audit_verification_ok", frozenset()] == 1

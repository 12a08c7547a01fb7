"""HTTP methods: HEAD answered wherever GET is, 405 naming ``Allow``, a job run that waits."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from dp_governor.api._handles import ledger_engine
from dp_governor.api.app import create_app
from dp_governor.api.jobs import lease_of
from dp_governor.api.leases import acquire_lease, release_lease
from tests.live import app_settings

TOKEN = "methods-admin-token-methods-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = app_settings(tmp_path, TOKEN)
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.mark.parametrize(
    "path", ["/", "/healthz", "/metrics", "/docs", "/openapi.json", "/v1/use-cases/emoji"]
)
def test_head_is_answered_as_get_without_a_body(client: TestClient, path: str) -> None:
    get = client.get(path)
    head = client.head(path)
    assert get.status_code == head.status_code == 200
    assert head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    if path != "/metrics":  # its figures move between two requests
        assert head.headers["content-length"] == get.headers["content-length"]


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "/healthz", "GET, HEAD"),
        ("POST", "/", "GET, HEAD"),
        ("PUT", "/metrics", "GET, HEAD"),
        ("GET", "/v1/admin/jobs/aggregate:run", "POST"),
        ("HEAD", "/v1/admin/jobs/aggregate:run", "POST"),
        ("PATCH", "/v1/use-cases/emoji/reports", "POST"),
    ],
)
def test_405_names_the_allowed_methods(
    client: TestClient, method: str, path: str, allow: str
) -> None:
    answer = client.request(method, path)
    assert answer.status_code == 405
    assert answer.headers["allow"] == allow


def test_a_job_run_waits_for_another_process_holding_its_lease(client: TestClient) -> None:
    engine = ledger_engine(client.app.state.ledger)  # type: ignore[attr-defined]
    lease = lease_of("aggregate")
    token = acquire_lease(engine, lease, "another-process", 3600.0)
    assert token is not None
    busy = client.post("/v1/admin/jobs/aggregate:run", headers=ADMIN)
    assert busy.status_code == 409 and "wait=SECONDS" in busy.json()["detail"]
    # the other process's run ends while this one waits (up to 120 s: a slow machine passes)
    threading.Timer(0.5, release_lease, (engine, lease, "another-process", token)).start()
    ran = client.post("/v1/admin/jobs/aggregate:run", headers=ADMIN, params={"wait": 120})
    assert ran.status_code == 200 and ran.json()["job"] == "aggregate"
    too_long = client.post("/v1/admin/jobs/aggregate:run", headers=ADMIN, params={"wait": 601})
    assert too_long.status_code == 422 and too_long.json()["detail"][0]["field"] == "query.wait"

"""Faults inside the service: a failing report insert leaves no charge and no acceptance."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import Connection, text

from dp_governor.api.app import create_app
from dp_governor.api.settings import Settings
from dp_governor.budget import FixedClock
from dp_governor.pipeline.ingest import Ingestor

NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    calls = {"n": 0}
    real = Ingestor.store_reports

    def every_seventh_fails(self: Ingestor, conn: Connection, rows: list[Any]) -> None:
        calls["n"] += 1
        if calls["n"] % 7 == 0:
            raise OSError("injected: the report store failed")
        real(self, conn, rows)

    monkeypatch.setattr(Ingestor, "store_reports", every_seventh_fails)
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'faults.sqlite'}",
        secret_file=tmp_path / "secret",
        audit_key_file=tmp_path / "audit.key",
        admin_token=SecretStr("admin-secret-token-admin-secret-token"),
        scheduler=False,
        device_rate_per_minute=1000,
    )
    app = create_app(settings, clock=FixedClock(NOW))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _count(client: TestClient, sql: str) -> int:
    ledger = client.app.state.ledger  # type: ignore[attr-defined]
    with ledger.engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def test_a_failing_report_insert_is_a_5xx_with_nothing_charged(client: TestClient) -> None:
    statuses = []
    for i in range(70):
        r = client.post(
            "/v1/use-cases/safari-energy-domains/reports",
            json={"j": i % 1024, "l": 5, "bit": 1},
            headers={"X-Device-Id": f"device-{i}"},
        )
        statuses.append(r.status_code)
    assert statuses.count(500) == 10 and statuses.count(202) == 60, statuses
    accepted = statuses.count(202)
    assert _count(client, "SELECT COUNT(*) FROM charges") == accepted
    assert _count(client, "SELECT COUNT(*) FROM inbox") == accepted
    assert _count(client, "SELECT COUNT(*) FROM accounts WHERE count > 0") == accepted
    assert _count(client, "SELECT COALESCE(SUM(count), 0) FROM accounts") == accepted
    ledger = client.app.state.ledger  # type: ignore[attr-defined]
    charges = [orjson.loads(r[4]) for r in ledger.audit.rows() if r[3] == "charge"]
    assert len(charges) == accepted and all(c["data"]["accepted"] for c in charges)
    assert ledger.audit.verify().ok
    # a failed device may retry and is charged once
    failed = statuses.index(500)
    retry = client.post(
        "/v1/use-cases/safari-energy-domains/reports",
        json={"j": 1, "l": 5, "bit": 1},
        headers={"X-Device-Id": f"device-{failed}"},
    )
    assert retry.status_code in (202, 500)
    budget = client.get(
        f"/v1/devices/device-{failed}/budget", headers={"X-Device-Id": f"device-{failed}"}
    ).json()
    used = {u["use_case"]: u["reports_today"] for u in budget["use_cases"]}
    assert used["safari-energy-domains"] == (1 if retry.status_code == 202 else 0)

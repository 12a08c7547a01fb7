"""The service's verify: inbox and report store against the chain, and checkpoints kept outside."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from dp_governor.api.app import create_app
from dp_governor.api.cli import app as cli
from dp_governor.api.settings import Settings
from dp_governor.budget import FixedClock
from dp_governor.policies import PolicyCreate, mechanism_for
from tests.api.verdicts import recorded_verdicts

# a few devices publish: the pipeline here, not the defaults' batch minimums
pytestmark = pytest.mark.usefixtures("small_batches")

TOKEN = "verify-admin-token-verify-admin-token-0123"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[TestClient, Path]]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'service.sqlite'}",
        secret_file=tmp_path / "secret",
        audit_key_file=tmp_path / "audit.key",
        admin_token=SecretStr(TOKEN),
        scheduler=False,
        checkpoint_file=tmp_path / "kept" / "checkpoints.jsonl",
        flush_min_batch=1,  # move even ten reports to the store
    )
    with TestClient(create_app(settings, clock=FixedClock(NOW))) as client:
        body = client.get("/v1/use-cases/safari-energy-domains").json()
        fields = {k: v for k, v in body.items() if k in PolicyCreate.model_fields}
        mech = mechanism_for(PolicyCreate.model_validate(fields))
        for i in range(10):
            report = mech.privatize_one("a.example").to_dict()
            url = "/v1/use-cases/safari-energy-domains/reports"
            assert (
                client.post(url, json=report, headers={"X-Device-Id": f"d{i}"}).status_code == 202
            )
        yield client, tmp_path


def _sql(path: Path, statement: str) -> None:
    engine = create_engine(f"sqlite:///{path / 'service.sqlite'}")
    with engine.begin() as conn:
        conn.execute(text(statement))
    engine.dispose()


def test_an_emptied_inbox_or_store_fails_verify(service: tuple[TestClient, Path]) -> None:
    client, path = service
    clean = client.get("/v1/audit/verify", headers=ADMIN).json()
    assert clean["ok"] and clean["state_checked"], clean
    assert client.post("/v1/admin/jobs/flush-inbox:run", headers=ADMIN).status_code == 200
    assert client.get("/v1/audit/verify", headers=ADMIN).json()["ok"]
    _sql(path, "DELETE FROM reports WHERE id IN (SELECT id FROM reports LIMIT 3)")
    broken = client.get("/v1/audit/verify", headers=ADMIN).json()
    assert not broken["ok"] and "report store holds 7 reports" in broken["problem"]


def test_the_inbox_emptied_before_a_flush_fails_verify(service: tuple[TestClient, Path]) -> None:
    client, path = service
    _sql(path, "DELETE FROM inbox")
    broken = client.get("/v1/audit/verify", headers=ADMIN).json()
    assert not broken["ok"] and "records 10 charges" in broken["problem"]


def test_checkpoints_are_kept_outside_and_checked(
    service: tuple[TestClient, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, path = service
    assert client.post("/v1/admin/jobs/checkpoint:run", headers=ADMIN).status_code == 200
    kept = path / "kept" / "checkpoints.jsonl"
    assert kept.exists() and len(kept.read_text().splitlines()) == 1
    result = client.get("/v1/audit/verify", headers=ADMIN).json()
    assert result["ok"] and result["kept_checkpoints"] == 1
    monkeypatch.setenv("DPGOV_DATABASE_URL", f"sqlite:///{path / 'service.sqlite'}")
    monkeypatch.setenv("DPGOV_SECRET_FILE", str(path / "secret"))
    monkeypatch.setenv("DPGOV_AUDIT_KEY_FILE", str(path / "audit.key"))
    runner = CliRunner()
    copy = path / "elsewhere.jsonl"
    exported = runner.invoke(cli, ["audit", "checkpoints", "-o", str(copy)])
    assert exported.exit_code == 0, exported.output
    checked = runner.invoke(cli, ["audit", "verify", "--checkpoints", str(copy)])
    assert checked.exit_code == 0, checked.output
    copy.write_text(copy.read_text().replace('"hash":"', '"hash":"0', 1), encoding="utf-8")
    forged = runner.invoke(cli, ["audit", "verify", "--checkpoints", str(copy)])
    assert forged.exit_code == 1 and "signature" in forged.output
    missing = runner.invoke(cli, ["audit", "verify", "--checkpoints", str(path / "nope")])
    assert missing.exit_code == 2 and "no checkpoint file" in missing.output
    recorded = recorded_verdicts(path)
    for wrong in (path / "service.sqlite", path / "kept"):  # not checkpoints: a usage error
        refused = runner.invoke(cli, ["audit", "verify", "-q", "--checkpoints", str(wrong)])
        assert refused.exit_code == 2, refused.output
        assert refused.stderr.startswith(
            f"Error: --checkpoints: checkpoint file unreadable: {wrong}"
        )
        assert refused.stderr.count("\n") == 1, refused.stderr
    assert recorded_verdicts(path) == recorded  # nothing recorded: no failed audit


def test_the_job_and_the_command_start_at_the_last_verified_checkpoint(
    service: tuple[TestClient, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, path = service
    assert client.post("/v1/admin/jobs/checkpoint:run", headers=ADMIN).status_code == 200
    first = client.get("/v1/audit/verify", headers=ADMIN).json()  # full: records the start
    assert first["ok"] and first["from_seq"] == 0 and first["entries"] == first["head_seq"]
    start = first["latest_checkpoint_seq"]
    assert client.post("/v1/admin/jobs/verify:run", headers=ADMIN).status_code == 200
    with create_engine(f"sqlite:///{path / 'service.sqlite'}").connect() as conn:
        job = conn.execute(
            text("SELECT full, ok, from_seq FROM audit_verifications ORDER BY id DESC LIMIT 1")
        ).one()
    assert (bool(job.full), bool(job.ok), job.from_seq) == (False, True, start)
    monkeypatch.setenv("DPGOV_DATABASE_URL", f"sqlite:///{path / 'service.sqlite'}")
    monkeypatch.setenv("DPGOV_SECRET_FILE", str(path / "secret"))
    monkeypatch.setenv("DPGOV_AUDIT_KEY_FILE", str(path / "audit.key"))
    monkeypatch.setenv("DPGOV_CHECKPOINT_FILE", str(path / "kept" / "checkpoints.jsonl"))
    runner = CliRunner()
    incremental = runner.invoke(cli, ["audit", "verify", "--quiet"])
    assert incremental.exit_code == 0, incremental.output
    assert f'"from_seq": {start}' in incremental.output
    full = runner.invoke(cli, ["audit", "verify", "--quiet", "--full"])
    assert full.exit_code == 0 and '"from_seq": 0' in full.output, full.output

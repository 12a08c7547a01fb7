"""``dpgov audit archive`` and ``audit verify --archive`` on a service's database, and its readers.

The archive is written by the command, verified incrementally, in full from its boundary and in
full from the file; the service's own verification, a device's record and receipts in the
transparency log, and the export's recompute read on after it. Every refusal is one line, exit 2,
an ``--archive`` file that is not the log's archive included (no verdict is recorded).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import create_engine, text
from typer.testing import CliRunner, Result

from dp_governor.api.app import create_app
from dp_governor.api.cli import app as cli
from dp_governor.api.settings import Settings
from dp_governor.budget import FixedClock
from tests.api.verdicts import recorded_verdicts

pytestmark = pytest.mark.usefixtures("small_batches")

TOKEN = "archive-admin-token-archive-admin-token-0123"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)


@pytest.fixture
def service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TestClient, Path]]:
    """A service with ten accepted reports; the CLI's settings point at its database and keys."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'service.sqlite'}",
        secret_file=tmp_path / "secret",
        audit_key_file=tmp_path / "audit.key",
        shuffler_key_file=tmp_path / "shuffler.key",
        admin_token=SecretStr(TOKEN),
        scheduler=False,
        checkpoint_file=tmp_path / "checkpoints.jsonl",
    )
    for name, value in (
        ("DPGOV_DATABASE_URL", settings.database_url),
        ("DPGOV_SECRET_FILE", str(tmp_path / "secret")),
        ("DPGOV_AUDIT_KEY_FILE", str(tmp_path / "audit.key")),
        ("DPGOV_SHUFFLER_KEY_FILE", str(tmp_path / "shuffler.key")),
        ("DPGOV_CHECKPOINT_FILE", str(tmp_path / "checkpoints.jsonl")),
    ):
        monkeypatch.setenv(name, value)
    with TestClient(create_app(settings, clock=FixedClock(NOW))) as client:
        url = "/v1/use-cases/safari-energy-domains/reports"
        for i in range(10):
            report = {"j": 1, "l": 2, "bit": 1}
            assert (
                client.post(url, json=report, headers={"X-Device-Id": f"d{i}"}).status_code == 202
            )
        yield client, tmp_path


def _run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def _one_line_error(result: Result, code: int, words: str) -> None:
    assert result.exit_code == code, result.output
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1, result.stderr
    assert words in result.stderr, result.stderr


def _verified(client: TestClient) -> None:
    assert client.post("/v1/admin/jobs/checkpoint:run", headers=ADMIN).status_code == 200
    verify = _run("audit", "verify", "--quiet")
    assert verify.exit_code == 0, verify.output


def test_archive_and_verify_from_the_command_line(service: tuple[TestClient, Path]) -> None:
    client, path = service
    out = path / "audit-1.jsonl.gz"
    _one_line_error(
        _run("audit", "archive", "--through", "verified", "--out", str(out)),
        2,
        "no signed checkpoint yet: run `dpgov jobs run checkpoint`",
    )
    _verified(client)
    made = _run("audit", "archive", "--through", "verified", "--out", str(out))
    assert made.exit_code == 0, made.output
    assert "archived to" in made.stdout and out.exists()
    with create_engine(f"sqlite:///{path / 'service.sqlite'}").connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM audit_log")).scalar_one() == 1
    incremental = _run("audit", "verify", "--quiet")
    assert incremental.exit_code == 0 and json.loads(incremental.stdout)["ok"]
    full = json.loads(_run("audit", "verify", "--quiet", "--full").stdout)
    assert full["ok"] and "are archived and were not replayed" in full["note"], full
    replayed = _run("audit", "verify", "--quiet", "--full", "--archive", str(out))
    assert replayed.exit_code == 0, replayed.output
    result = json.loads(replayed.stdout)
    assert result["ok"] and result["from_seq"] == 0 and result["entries"] == result["head_seq"]
    service_verify = client.get("/v1/audit/verify", headers=ADMIN).json()  # the route's full
    assert service_verify["ok"], service_verify
    tampered = path / "tampered.jsonl.gz"
    tampered.write_bytes(gzip.compress(gzip.decompress(out.read_bytes()) + b"\n"))
    corrupt = path / "corrupt.jsonl.gz"
    corrupt.write_bytes(out.read_bytes()[:-9])
    recorded = recorded_verdicts(path)
    for wrong in (tampered, corrupt, path / "service.sqlite"):  # a usage error, not an audit
        _one_line_error(
            _run("audit", "verify", "--quiet", "--full", "--archive", str(wrong)),
            2,
            f"Error: --archive: {wrong} is none of the recorded archives",
        )
    assert recorded_verdicts(path) == recorded  # nothing recorded: no failed audit on the dashboard


def test_a_devices_record_and_the_export_read_on_after_an_archive(
    service: tuple[TestClient, Path],
) -> None:
    client, path = service
    _verified(client)
    assert (
        _run("audit", "archive", "--through", "verified", "-o", str(path / "a.gz")).exit_code == 0
    )
    record = client.get("/v1/devices/d3/tlog?day=2026-11-22", headers={"X-Device-Id": "d3"})
    assert record.status_code == 200, record.text
    body = record.json()
    assert body["covered"] and body["leaves"], body
    export = _run("audit", "export", "-o", str(path / "ledger.jsonl"))
    assert export.exit_code == 0, export.output
    recompute = _run("audit", "recompute", str(path / "ledger.jsonl"), "--json")
    assert recompute.exit_code == 0, recompute.output


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["audit", "archive", "--through", "abc", "--out", "{tmp}/a.gz"], "--through must be"),
        (["audit", "archive", "--through", "0", "--out", "{tmp}/a.gz"], "--through must be"),
        (["audit", "archive", "--through", "3", "--out", "{tmp}/service.sqlite"], "exists"),
        (["audit", "archive", "--through", "3", "--out", "{tmp}/no/a.gz"], "no folder"),
        (["audit", "archive", "--through", "3", "--out", "{tmp}/a.gz"], "no signed checkpoint"),
        (["audit", "verify", "--archive", "{tmp}/service.sqlite"], "--archive needs --full"),
        (["audit", "verify", "--full", "--archive", "{tmp}/none.gz"], "no archive file"),
    ],
)
def test_refusals_are_one_line_with_exit_2(
    service: tuple[TestClient, Path], args: list[str], words: str
) -> None:
    client, path = service
    _verified(client)
    _one_line_error(_run(*(a.replace("{tmp}", str(path)) for a in args)), 2, words)

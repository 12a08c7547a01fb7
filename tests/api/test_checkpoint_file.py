"""The checkpoint file kept outside the database: torn, unreadable or missing, never a 500.

A torn or unreadable file makes ``verify`` fail naming the file, and the dashboard, the verify
route and the checkpoint job answer; a file missing while the database holds signed
checkpoints fails ``verify`` too. The file and ``audit export``'s output are created 0600
whatever the umask.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from typer.testing import CliRunner

from dp_governor.api.app import create_app
from dp_governor.api.cli import app as cli
from dp_governor.api.settings import Settings
from dp_governor.budget import FixedClock

TOKEN = "kept-admin-token-kept-admin-token-kept-0123"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
REPORTS = "/v1/use-cases/safari-energy-domains/reports"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path


def _settings(folder: Path) -> Settings:
    return Settings(
        database_url=f"sqlite:///{folder / 'service.sqlite'}",
        secret_file=folder / "secret",
        audit_key_file=folder / "audit.key",
        admin_token=SecretStr(TOKEN),
        scheduler=False,
        checkpoint_file=folder / "kept" / "checkpoints.jsonl",
        report_cache_seconds=0,
    )


@pytest.fixture
def client(folder: Path) -> Iterator[TestClient]:
    with TestClient(create_app(_settings(folder), clock=FixedClock(NOW))) as c:
        for i in range(3):
            body = {"j": 1, "l": 2, "bit": 1}
            assert c.post(REPORTS, json=body, headers={"X-Device-Id": f"d{i}"}).status_code == 202
        assert c.post("/v1/admin/jobs/checkpoint:run", headers=ADMIN).status_code == 200
        yield c


def _kept(folder: Path) -> Path:
    return folder / "kept" / "checkpoints.jsonl"


def _torn(path: Path) -> None:
    """The file as a crash mid-append leaves it: a line cut short."""
    text = path.read_text(encoding="utf-8")
    path.write_text(text + text[: len(text) // 2].rstrip("\n"), encoding="utf-8")


def _not_utf8(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b'{"seq": \xff\xfe}\n')


def _a_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


@pytest.mark.parametrize("damage", [_torn, _not_utf8, _a_folder])
def test_an_unreadable_checkpoint_file_fails_verify_and_answers_everywhere(
    client: TestClient, folder: Path, damage: object
) -> None:
    assert client.get("/v1/audit/verify", headers=ADMIN).json()["ok"]
    damage(_kept(folder))  # type: ignore[operator]
    verify = client.get("/v1/audit/verify", headers=ADMIN)
    assert verify.status_code == 200, verify.text
    body = verify.json()
    assert not body["ok"] and body["problem"].startswith("checkpoint file unreadable: "), body
    assert str(_kept(folder)) in body["problem"]
    assert client.post("/v1/admin/jobs/verify:run", headers=ADMIN).status_code == 200
    page = client.get("/")  # the dashboard shows the scheduled verification's verdict
    assert page.status_code == 200 and "checkpoint file unreadable" in page.text
    job = client.post("/v1/admin/jobs/checkpoint:run", headers=ADMIN)
    assert job.status_code == 200, job.text
    assert job.json()["result"]["kept"]["problem"].startswith("checkpoint file unreadable: ")


def test_the_cli_verify_fails_on_an_unreadable_checkpoint_file(
    client: TestClient, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _torn(_kept(folder))
    _cli_env(folder, monkeypatch)
    result = CliRunner().invoke(cli, ["audit", "verify"])
    assert result.exit_code == 1, result.output
    assert "checkpoint file unreadable: " in result.output
    assert "Traceback" not in result.output


def test_a_missing_checkpoint_file_fails_verify_once_checkpoints_were_signed(
    client: TestClient, folder: Path
) -> None:
    _kept(folder).unlink()
    body = client.get("/v1/audit/verify", headers=ADMIN).json()
    assert not body["ok"] and "checkpoint file" in body["problem"], body
    assert "missing" in body["problem"] and str(_kept(folder)) in body["problem"]
    # the checkpoint job writes every signed checkpoint again: the file is back, verify passes
    assert client.post("/v1/admin/jobs/checkpoint:run", headers=ADMIN).status_code == 200
    assert client.get("/v1/audit/verify", headers=ADMIN).json()["ok"]


def test_no_checkpoint_file_is_needed_before_the_first_checkpoint(folder: Path) -> None:
    with TestClient(create_app(_settings(folder), clock=FixedClock(NOW))) as c:
        assert c.get("/v1/audit/verify", headers=ADMIN).json()["ok"]


def _cli_env(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPGOV_DATABASE_URL", f"sqlite:///{folder / 'service.sqlite'}")
    monkeypatch.setenv("DPGOV_SECRET_FILE", str(folder / "secret"))
    monkeypatch.setenv("DPGOV_AUDIT_KEY_FILE", str(folder / "audit.key"))
    monkeypatch.setenv("DPGOV_CHECKPOINT_FILE", str(_kept(folder)))


@pytest.fixture
def umask_000() -> Iterator[None]:
    before = os.umask(0)
    try:
        yield
    finally:
        os.umask(before)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("umask_000")
def test_the_checkpoint_file_and_exports_are_created_0600_whatever_the_umask(
    client: TestClient, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _kept(folder).unlink()
    assert client.post("/v1/admin/jobs/checkpoint:run", headers=ADMIN).status_code == 200
    assert _mode(_kept(folder)) == 0o600
    _cli_env(folder, monkeypatch)
    runner = CliRunner()
    copy = folder / "copies" / "checkpoints.jsonl"
    assert runner.invoke(cli, ["audit", "checkpoints", "-o", str(copy)]).exit_code == 0
    assert _mode(copy) == 0o600
    for fmt in ("jsonl", "csv"):
        out = folder / f"export.{fmt}"
        out.write_text("old", encoding="utf-8")
        out.chmod(0o666)  # a file it replaces is made private too
        result = runner.invoke(cli, ["audit", "export", "-o", str(out), "--format", fmt])
        assert result.exit_code == 0, result.output
        assert _mode(out) == 0o600, fmt
        fresh = folder / f"fresh.{fmt}"
        assert (
            runner.invoke(cli, ["audit", "export", "-o", str(fresh), "--format", fmt]).exit_code
            == 0
        )
        assert _mode(fresh) == 0o600, fmt

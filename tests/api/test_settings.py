"""Settings, the secret file, and the scheduler's start and stop inside the app's lifespan."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr, ValidationError
from typer.testing import CliRunner

from api.app import create_app
from api.cli import app as cli
from api.settings import Settings, load_or_create_secret


def test_production_refuses_generated_secrets() -> None:
    with pytest.raises(ValidationError, match="device_key_secret"):
        Settings(environment="production", admin_token=SecretStr("x" * 40))
    with pytest.raises(ValidationError, match="admin_token"):
        Settings(environment="production", device_key_secret=SecretStr("s" * 40))
    with pytest.raises(ValidationError, match="at least 32"):
        Settings(device_key_secret=SecretStr("short"))
    ok = Settings(
        environment="production",
        admin_token=SecretStr("x" * 40),
        device_key_secret=SecretStr("s" * 40),
    )
    assert load_or_create_secret(ok) == b"s" * 40


def test_secret_is_generated_once_with_private_permissions(tmp_path: Path) -> None:
    settings = Settings(secret_file=tmp_path / "secret")
    first = load_or_create_secret(settings)
    assert len(first) == 64 and load_or_create_secret(settings) == first
    mode = stat.S_IMODE(os.stat(tmp_path / "secret").st_mode)
    assert mode == 0o600


def test_env_prefix_and_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPGOV_PORT", "9001")
    assert Settings().port == 9001
    monkeypatch.setenv("DPGOV_PORT", "not-a-port")
    with pytest.raises(ValidationError, match="port"):
        Settings()


def test_cli_reports_bad_settings_and_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPGOV_MAX_BODY_BYTES", "12")
    result = CliRunner().invoke(cli, ["policies", "list"])
    assert result.exit_code == 2
    assert "max_body_bytes" in result.output


def test_lifespan_starts_and_stops_the_scheduler(tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'life.sqlite'}",
        secret_file=tmp_path / "secret",
        audit_key_file=tmp_path / "audit.key",
        scheduler=True,
        flush_seconds=3600,
        aggregate_seconds=3600,
    )
    app = create_app(settings)
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        assert app.state.runtime_key
    with TestClient(app) as client:  # a second start on the same database is clean
        assert client.get("/v1/use-cases").status_code == 200

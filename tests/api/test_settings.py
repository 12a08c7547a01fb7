"""Settings, the key files and their fingerprints, and the scheduler inside the app's lifespan."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr, ValidationError
from sqlalchemy import Engine, text
from typer.testing import CliRunner

from dp_governor.api._keys import service_keys
from dp_governor.api.app import create_app
from dp_governor.api.cli import app as cli
from dp_governor.api.database import init_service_db
from dp_governor.api.jobs import JOBS
from dp_governor.api.settings import JOB_NAMES, KeyRefused, Settings, default_secrets_dir
from dp_governor.budget import Ledger, create_db_engine
from dp_governor.budget.storage.db import key_fingerprint, stored_fingerprints


def test_production_refuses_generated_secrets(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'prod.sqlite'}"
    with pytest.raises(ValidationError, match="device_key_secret"):
        Settings(environment="production", admin_token=SecretStr("x" * 40), database_url=url)
    with pytest.raises(ValidationError, match="admin_token"):
        Settings(environment="production", device_key_secret=SecretStr("s" * 40), database_url=url)
    with pytest.raises(ValidationError, match="`database_url` must be set in production"):
        Settings(
            environment="production",
            device_key_secret=SecretStr("s" * 40),
            admin_token=SecretStr("x" * 40),
        )
    with pytest.raises(
        ValidationError,
        match="`device_key_secret` must be set in production; so must DPGOV_ADMIN_TOKEN,"
        " DPGOV_DATABASE_URL",
    ):
        Settings(environment="production")
    with pytest.raises(ValidationError, match="at least 32"):
        Settings(device_key_secret=SecretStr("short"))
    ok = Settings(
        environment="production",
        database_url=url,
        admin_token=SecretStr("x" * 40),
        device_key_secret=SecretStr("s" * 40),
        audit_key=SecretStr("a" * 40),
    )
    engine = create_db_engine(f"sqlite:///{tmp_path / 'prod.sqlite'}")
    init_service_db(engine)
    keys = service_keys(ok, engine, generate=True, record=True)
    assert keys.device_key_secret == b"s" * 40 and keys.audit_key == b"a" * 40
    assert keys.sources == ("DPGOV_DEVICE_KEY_SECRET", "DPGOV_AUDIT_KEY")
    engine.dispose()


def test_keys_are_generated_once_privately_and_fingerprinted(tmp_path: Path) -> None:
    settings = Settings(secrets_dir=tmp_path / "keys")
    engine = create_db_engine(f"sqlite:///{tmp_path / 'k.sqlite'}")
    init_service_db(engine)
    first = service_keys(settings, engine, generate=True, record=True)
    assert len(first.device_key_secret) == 64 and len(first.audit_key) == 64
    assert first.device_key_secret != first.audit_key
    assert first.sources[0] == f"{tmp_path / 'keys' / 'dpgov.secret'} (generated)"
    again = service_keys(settings, engine)  # a read: checks, generates and records nothing
    assert (again.device_key_secret, again.audit_key) == (first.device_key_secret, first.audit_key)
    assert stat.S_IMODE(os.stat(tmp_path / "keys").st_mode) == 0o700
    for name in ("dpgov.secret", "dpgov-audit.key", "dpgov-shuffler.key"):
        assert stat.S_IMODE(os.stat(tmp_path / "keys" / name).st_mode) == 0o600
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == [
        "dpgov-audit.key",
        "dpgov-shuffler.key",
        "dpgov.secret",
    ]  # no temporary file left behind
    (shuffler,) = first.shuffler_keys
    assert len({first.device_key_secret, first.audit_key, shuffler}) == 3
    assert again.shuffler_keys == ()  # a read opens no inbox row: it needs no shuffler key
    stored = stored_fingerprints(engine)
    assert stored == {
        "fingerprint.device_key_secret": key_fingerprint(first.device_key_secret),
        "fingerprint.audit_key": key_fingerprint(first.audit_key),
        "fingerprint.shuffler_key": key_fingerprint(shuffler),
    }
    assert first.device_key_secret.hex() not in str(stored)  # one-way: the key is not stored
    other = Settings(secrets_dir=tmp_path / "elsewhere")
    with pytest.raises(KeyRefused, match="DPGOV_DEVICE_KEY_SECRET or DPGOV_SECRET_FILE"):
        service_keys(other, engine, generate=True, record=True)  # the database has history
    assert not (tmp_path / "elsewhere").exists()
    engine.dispose()


def _history(tmp_path: Path) -> tuple[Settings, Engine]:
    """A database with an audit history and device and audit keys, but no shuffler key yet.

    As a database of the release before sealing, upgraded: its fingerprints record two keys.
    """
    settings = Settings(
        secret_file=tmp_path / "secret",
        audit_key_file=tmp_path / "audit.key",
        shuffler_key_file=tmp_path / "shuffler.key",
    )
    engine = create_db_engine(f"sqlite:///{tmp_path / 'h.sqlite'}")
    init_service_db(engine)
    keys = service_keys(settings, engine, generate=True, record=True)
    Ledger(engine, keys.device_key_secret, audit_key=keys.audit_key).policies.ensure_defaults()
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM dpgov_meta WHERE name = 'fingerprint.shuffler_key'"))
    (tmp_path / "shuffler.key").unlink()
    return settings, engine


def test_an_existing_database_gets_a_shuffler_key_at_its_next_start(tmp_path: Path) -> None:
    """The shuffler key is generated for a database with history (the others never are)."""
    settings, engine = _history(tmp_path)
    writing = service_keys(settings, engine, record=True)  # `dpgov jobs run`: nothing to seal
    assert writing.shuffler_keys == () and not (tmp_path / "shuffler.key").exists()
    started = service_keys(settings, engine, generate=True, record=True)  # `dpgov serve`
    assert started.shuffler_source == f"{tmp_path / 'shuffler.key'} (generated)"
    (key,) = started.shuffler_keys
    assert (stored_fingerprints(engine) or {})["fingerprint.shuffler_key"] == key_fingerprint(key)
    assert service_keys(settings, engine, record=True).shuffler_keys == (key,)
    (tmp_path / "shuffler.key").unlink()  # lost, or another host without it: refused
    with pytest.raises(KeyRefused, match=r"no shuffler key was given.*DPGOV_SHUFFLER_KEY_FILE"):
        service_keys(settings, engine, generate=True, record=True)
    assert not (tmp_path / "shuffler.key").exists()
    engine.dispose()


def test_the_shuffler_key_rotates_when_the_old_one_follows_the_new(tmp_path: Path) -> None:
    settings, engine = _history(tmp_path)
    old = service_keys(settings, engine, generate=True, record=True).shuffler_keys[0]
    new = b"n" * 64
    alone = settings.model_copy(update={"shuffler_key": SecretStr(new.decode())})
    with pytest.raises(KeyRefused, match=r"nor is any key after it.*DPGOV_SHUFFLER_KEY"):
        service_keys(alone, engine, record=True)  # another key alone: a misconfigured host
    two = f"{new.decode()} {old.decode()}"
    both = settings.model_copy(update={"shuffler_key": SecretStr(two)})
    assert service_keys(both, engine, record=True).shuffler_keys == (new, old)
    assert (stored_fingerprints(engine) or {})["fingerprint.shuffler_key"] == key_fingerprint(new)
    with pytest.raises(KeyRefused, match="shuffler key"):
        service_keys(settings, engine, record=True)  # the old key alone is refused from now on
    (tmp_path / "shuffler.key").write_text(f"{new.decode()}\n{old.decode()}\n")
    assert service_keys(settings, engine, record=True).shuffler_keys == (new, old)
    with pytest.raises(ValidationError, match="shuffler_key"):
        Settings(shuffler_key=SecretStr(f"{new.decode()} short"))
    engine.dispose()


def test_default_secrets_dir_is_the_users_not_the_current_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert default_secrets_dir() == tmp_path / "xdg" / "dp-governor"
    assert Settings().secret_path() == tmp_path / "xdg" / "dp-governor" / "dpgov.secret"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/ignored")  # the XDG spec: absolute only
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_secrets_dir() == tmp_path / "home" / ".config" / "dp-governor"
    settings = Settings(secrets_dir=tmp_path / "s", audit_key_file=tmp_path / "a.key")
    assert settings.secret_path() == tmp_path / "s" / "dpgov.secret"
    assert settings.audit_key_path() == tmp_path / "a.key"


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
    assert result.output.startswith("Error: invalid setting DPGOV_MAX_BODY_BYTES: "), result.output
    monkeypatch.delenv("DPGOV_MAX_BODY_BYTES")
    monkeypatch.setenv("DPGOV_JOB_NICE", "abc")  # named as the user set it, with the value
    result = CliRunner().invoke(cli, ["policies", "list"])
    assert result.exit_code == 2 and "DPGOV_JOB_NICE" in result.output and "'abc'" in result.output
    monkeypatch.delenv("DPGOV_JOB_NICE")
    monkeypatch.setenv("DPGOV_JOB_CPU", "fast")  # one of idle, nice
    result = CliRunner().invoke(cli, ["policies", "list"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Error: invalid setting DPGOV_JOB_CPU: "), result.output
    assert "'idle'" in result.output and "'nice'" in result.output, result.output


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("DPGOV_AUDIT_KEY", "short", "DPGOV_AUDIT_KEY: must be at least 32 characters"),
        ("DPGOV_ENVIRONMENT", "production", "DPGOV_DEVICE_KEY_SECRET: must be set in production"),
        ("DPGOV_WITNESSES", "not-json", "DPGOV_WITNESSES: not JSON (a list is JSON, e.g."),
        ("DPGOV_WITNESSES", '["x"]', 'DPGOV_WITNESSES: each entry is "<http(s) URL>'),
        (
            "DPGOV_SCHEDULED_JOBS",
            '["vacuum"]',
            "DPGOV_SCHEDULED_JOBS[0]: must be one of 'flush-inbox', 'aggregate', 'purge',",
        ),
        ("DPGOV_SCHEDULED_JOBS", "[]", "DPGOV_SCHEDULED_JOBS: List should have at least 1 item"),
        (
            "DPGOV_SCHEDULED_JOBS",
            "verify",
            "DPGOV_SCHEDULED_JOBS: not JSON (a list is JSON, e.g. '[\"checkpoint\"]')",
        ),
        ("DPGOV_SCHEDULED_JOBS", "null", "DPGOV_SCHEDULED_JOBS: null is not a list (unset it"),
        ("DPGOV_WITNESSES", " null", "DPGOV_WITNESSES: null is not a list (unset it"),
        (
            "DPGOV_SCHEDULED_JOBS",
            '["verify", "purge", "verify"]',
            "DPGOV_SCHEDULED_JOBS: each job at most once; named twice: verify",
        ),
    ],
)
def test_cli_names_the_setting_at_fault_in_one_line(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, said: str
) -> None:
    """A check of several settings, or a list that is not JSON, names the variable too."""
    monkeypatch.setenv(variable, value)
    result = CliRunner().invoke(cli, ["policies", "list"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith(f"Error: invalid setting {said}"), result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Value error" not in result.stderr


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


def test_the_scheduler_runs_the_jobs_the_setting_names(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The servers that take reports and a host for the population passes split the jobs."""
    assert JOB_NAMES == tuple(JOBS)  # the setting's names are the jobs there are
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'split.sqlite'}",
        secret_file=tmp_path / "secret",
        audit_key_file=tmp_path / "audit.key",
        scheduled_jobs=["flush-inbox", "aggregate", "checkpoint"],
    )
    app = create_app(settings)
    with caplog.at_level(logging.INFO, logger="dpgov.jobs"), TestClient(app):
        scheduled = {job.id for job in app.state.scheduler.get_jobs()}
        assert scheduled == {"flush-inbox", "aggregate", "checkpoint"}
    assert "scheduled here: " in caplog.text and "dashboard" not in caplog.text  # the log says
    app = create_app(settings.model_copy(update={"scheduled_jobs": ["dashboard", "verify"]}))
    with TestClient(app):
        assert {job.id for job in app.state.scheduler.get_jobs()} == {"dashboard", "verify"}
    assert Settings().scheduled_jobs == list(JOBS)  # by default every job
    off = create_app(settings.model_copy(update={"scheduler": False}))
    with caplog.at_level(logging.WARNING, logger="dpgov.api"), TestClient(off):
        assert off.state.scheduler is None
    assert "DPGOV_SCHEDULED_JOBS has no effect: DPGOV_SCHEDULER is false here" in caplog.text

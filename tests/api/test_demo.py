"""``dpgov demo`` end to end on a small fleet (the full one runs 20,000 devices)."""

from __future__ import annotations

import socket
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from typer.testing import CliRunner

from dp_governor.api.app import create_app
from dp_governor.api.cli import app
from dp_governor.api.demo.demo import demo_reports, run_demo
from dp_governor.api.jobs import lease_of
from dp_governor.api.leases import acquire_lease, release_lease
from dp_governor.api.settings import Settings
from dp_governor.budget import create_db_engine
from dp_governor.budget.reporting.activity import daily_activity
from dp_governor.policies import PolicyCreate


def test_demo_runs_the_whole_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DPGOV_REQUIRE_REPORT_FAMILY")  # the default: every report its family
    seen: list[tuple[int, int]] = []
    result = run_demo(3000, 2, seed=11, progress=lambda *p: seen.append(p), workdir=tmp_path)
    total = demo_reports(3000, 2)
    assert seen[-1] == (result.submitted, total) and total == (3000 * 2 + 30) * 2
    assert result.submitted == total and seen == sorted(seen)
    # one emoji and one word per device and day are accepted; 30 second emoji a day are not
    assert result.refused == 30 * 2 and result.accepted == 3000 * 2 * 2
    assert result.emoji_top[0]["item"] == "😂"  # the most popular emoji comes out first
    top = result.emoji_top[0]
    assert abs(top["count"] - result.emoji_truth["😂"]) < 4 * top["stderr"]
    assert result.words, "SFP discovered nothing"
    best = max(result.word_truth, key=lambda w: result.word_truth[w])
    assert best in {w["word"] for w in result.words}
    assert {s["use_case"]: s["epsilon_lifetime"] for s in result.spend} == {
        "emoji": 8.0,
        "quicktype": 16.0,
    }
    lines = {u["use_case"]: u for u in result.effective_epsilon["use_cases"]}
    assert lines["emoji"]["spent_window"]["max"] == 8.0  # 2 days x 4
    assert lines["emoji"]["spent_window"]["devices"] == 3000
    assert lines["quicktype"]["spent_lifetime"]["median"] == 16.0  # 2 days x one 8-report
    assert result.audit["ok"] and result.audit["latest_checkpoint_seq"] == result.audit["entries"]


def test_demo_cli_validates_its_options() -> None:
    bad = CliRunner().invoke(app, ["demo", "--devices", "5"])
    assert bad.exit_code != 0 and "--devices" in bad.output


def test_demo_fills_the_database_it_is_given_and_the_dashboard_shows_it(tmp_path: Path) -> None:
    """``dpgov demo --database-url``: the served database gets the days, charges and refusals."""
    url = f"sqlite:///{tmp_path / 'served.sqlite'}"
    env = {
        "DPGOV_SECRET_FILE": str(tmp_path / "secret"),
        "DPGOV_AUDIT_KEY_FILE": str(tmp_path / "audit.key"),
    }
    run = CliRunner().invoke(
        app, ["demo", "--devices", "400", "--days", "3", "--database-url", url], env=env
    )
    assert run.exit_code == 0, run.output
    assert "1,200 reports accepted" not in run.output and "12 refused by a cap" in run.output
    reports = demo_reports(400, 3)  # piped: plain progress lines on stderr
    assert f"demo: {reports:,d} of {reports:,d} reports (100%)" in run.stderr.splitlines()
    settings = Settings(
        database_url=url, secret_file=tmp_path / "secret", audit_key_file=tmp_path / "audit.key"
    )
    with TestClient(create_app(settings)) as client:  # a server on the same database and keys
        page = client.get("/")
        assert page.status_code == 200
        report = client.get("/v1/audit/effective-epsilon").json()
    lines = {u["use_case"]: u for u in report["use_cases"]}
    assert lines["emoji"]["spent_window"]["devices"] == 400
    assert lines["emoji"]["spent_window"]["max"] == 12.0  # 3 days x 4, charged like devices
    activity = daily_activity(create_db_engine(url), now=datetime.now(UTC), days=14)
    assert activity.accepted["emoji"][-3:] == [400, 400, 400]  # the last three days
    assert activity.refused["daily_cap"][-3:] == [4, 4, 4]
    assert 'id="refusals-trend"' in page.text and "daily_cap: 12" in page.text


def test_demo_names_a_database_it_cannot_open(tmp_path: Path) -> None:
    env = {"DPGOV_SECRET_FILE": str(tmp_path / "secret")}
    url = f"sqlite:///{tmp_path / 'missing' / 'x.sqlite'}"
    run = CliRunner().invoke(app, ["demo", "--devices", "100", "--database-url", url], env=env)
    assert run.exit_code != 0 and "Traceback" not in run.output
    assert "--database-url" in run.output


def _served(tmp_path: Path) -> Settings:
    """A served database (the one `dpgov serve` would use), with its defaults.

    Its operator publishes batches of 100 devices for emoji and QuickType, so that a small
    demo fleet gets estimates.
    """
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'served.sqlite'}",
        secret_file=tmp_path / "secret",
        audit_key_file=tmp_path / "audit.key",
        shuffler_key_file=tmp_path / "shuffler.key",
    )
    token = "served-admin-token-served-admin-token"
    admin = settings.model_copy(update={"admin_token": SecretStr(token), "scheduler": False})
    with TestClient(create_app(admin)) as client:
        for name in ("emoji", "quicktype"):
            policy = client.get(f"/v1/use-cases/{name}").json()
            body = {k: v for k, v in policy.items() if k in PolicyCreate.model_fields}
            answer = client.put(
                f"/v1/use-cases/{name}",
                params={"allow_loosen": "true"},
                json={**body, "min_batch_devices": 100},
                headers={"Authorization": f"Bearer {token}"},
            )
            assert answer.status_code == 200, answer.text
    return settings


def test_demo_into_a_served_database_waits_for_the_servers_job(tmp_path: Path) -> None:
    """The served server's aggregate holds the inbox lease: the demo waits, never a 409."""
    settings = _served(tmp_path)
    engine = create_db_engine(settings.database_url)
    # the served process's aggregate run, under way when the demo asks for its own
    token = acquire_lease(engine, lease_of("aggregate"), "served-process", 3600.0)
    assert token is not None
    released = threading.Event()

    def progress(done: int, total: int) -> None:
        if done == total and not released.is_set():  # the demo's last batch is in
            released.set()
            # the served run ends a moment later: the demo's aggregate meets the lease held
            threading.Timer(
                1.0, release_lease, (engine, lease_of("aggregate"), "served-process", token)
            ).start()

    result = run_demo(100, 1, seed=3, progress=progress, workdir=tmp_path, settings=settings)
    assert released.is_set()
    assert result.accepted == 2 * 100 and result.refused == 1
    assert result.audit["ok"]
    engine.dispose()


def test_demo_run_again_completes_an_interrupted_fleet(tmp_path: Path) -> None:
    """A demo stopped half-way and run again: the fleet ends whole, once, estimates calibrated."""
    settings = _served(tmp_path)

    class Crash(Exception):
        """The demo's process dying after its first batch."""

    def crash(done: int, total: int) -> None:
        raise Crash

    with pytest.raises(Crash):  # after the emoji batch of the first day, before QuickType's
        run_demo(200, 2, seed=5, progress=crash, workdir=tmp_path, settings=settings)
    result = run_demo(200, 2, seed=5, workdir=tmp_path, settings=settings)
    assert result.replayed == 200 + 2  # the first batch: 200 devices and 2 second reports
    assert result.accepted == 2 * 200 * 2 and result.refused == 2 * 2
    assert result.others == 0 and len(result.emoji_top) >= 3
    lines = {u["use_case"]: u for u in result.effective_epsilon["use_cases"]}
    assert lines["emoji"]["spent_window"]["devices"] == 200
    assert lines["emoji"]["spent_window"]["max"] == 8.0  # 2 days x 4: charged once a day
    for row in result.emoji_top:  # the counts of the one fleet, within 5 standard errors
        assert abs(row["count"] - result.emoji_truth[row["item"]]) < 5 * row["stderr"], row
    activity = daily_activity(create_db_engine(settings.database_url), now=datetime.now(UTC))
    assert activity.accepted["emoji"][-2:] == [200, 200]


def test_demo_refuses_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        run = CliRunner().invoke(app, ["demo", "--devices", "100", "--port", str(port)])
    assert run.exit_code == 2 and "Traceback" not in run.output
    assert f"--port: 127.0.0.1:{port} is in use" in run.output

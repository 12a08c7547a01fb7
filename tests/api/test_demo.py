"""``dpgov demo`` end to end on a small fleet (the full one runs 20,000 devices)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from dp_governor.api.app import create_app
from dp_governor.api.cli import app
from dp_governor.api.demo.demo import demo_reports, run_demo
from dp_governor.api.settings import Settings
from dp_governor.budget import create_db_engine
from dp_governor.budget.reporting.activity import daily_activity


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

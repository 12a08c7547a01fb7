"""The audit log through the service: every report is an entry, verify by API and CLI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import text
from typer.testing import CliRunner

from dp_governor.api.app import create_app
from dp_governor.api.cli import app as cli
from dp_governor.api.settings import Settings
from dp_governor.budget import FixedClock

# a few devices publish: the pipeline here, not the defaults' batch minimums
pytestmark = pytest.mark.usefixtures("small_batches")

ADMIN = {"Authorization": "Bearer admin-secret-token-admin-secret-token"}
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
runner = CliRunner()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        database_url=f"sqlite:///{tmp_path / 'service.sqlite'}",
        secret_file=tmp_path / "secret",
        audit_key_file=tmp_path / "audit.key",
        admin_token=SecretStr("admin-secret-token-admin-secret-token"),
        scheduler=False,
    )


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings, clock=FixedClock(NOW))) as c:
        yield c


def _submit(client: TestClient, n: int) -> None:
    for i in range(n):
        r = client.post(
            "/v1/use-cases/safari-energy-domains/reports",
            json={"j": 1, "l": 2, "bit": 1},
            headers={"X-Device-Id": f"d{i % 3}"},
        )
        assert r.status_code in (202, 429), r.text


def test_reports_refusals_and_checkpoints_verify(client: TestClient) -> None:
    _submit(client, 9)  # 3 devices x 2/day accepted, 3 refused
    ran = client.post("/v1/admin/jobs/checkpoint:run", headers=ADMIN).json()
    assert ran["result"]["signed"]["seq"] == 7 + 9  # the default policies, then the reports
    r = client.get("/v1/audit/verify", headers=ADMIN)
    assert r.status_code == 200
    body = r.json()
    assert body["ok"] and body["entries"] == 16 and body["checkpoints"] == 1, body
    assert body["latest_checkpoint_seq"] == 16 and body["first_bad"] is None
    assert client.get("/v1/audit/verify").status_code == 401
    assert client.get("/v1/audit/verify", headers={"X-Device-Id": "d0"}).status_code == 401
    bad = client.get("/v1/audit/verify", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 403


def test_cli_verify_and_checkpoint_then_catch_a_rewrite(
    client: TestClient, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    _submit(client, 4)
    monkeypatch.setenv("DPGOV_SECRET_FILE", str(settings.secret_file))
    monkeypatch.setenv("DPGOV_AUDIT_KEY_FILE", str(settings.audit_key_file))
    url = ["--database-url", settings.database_url]
    assert runner.invoke(cli, ["jobs", "run", "checkpoint", *url]).exit_code == 0
    ok = runner.invoke(cli, ["audit", "verify", *url])
    assert ok.exit_code == 0, ok.output
    assert '"ok": true' in ok.output
    ledger = client.app.state.ledger  # type: ignore[attr-defined]
    with ledger.engine.begin() as conn:
        conn.execute(text("DROP TRIGGER audit_log_no_update"))
        conn.execute(
            text("UPDATE audit_log SET body = replace(body, 'true', 'false') WHERE seq = 9")
        )
    # entry 9 lies before the checkpoint the last verification reached: the incremental run
    # does not read it (docs/audit.md), the full replay catches it
    assert runner.invoke(cli, ["audit", "verify", *url]).exit_code == 0
    bad = runner.invoke(cli, ["audit", "verify", "--full", *url])
    assert bad.exit_code == 1
    assert "fails at entry 9" in bad.output
    other_key = runner.invoke(
        cli, ["audit", "verify", *url], env={"DPGOV_AUDIT_KEY_FILE": str(settings.secret_file)}
    )
    assert other_key.exit_code == 2  # refused: not the audit key the database records
    assert "DPGOV_AUDIT_KEY_FILE" in other_key.output


def test_cli_jobs_report_their_progress_when_piped(
    client: TestClient, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    _submit(client, 4)  # 4 reports accepted, waiting in the inbox
    monkeypatch.setenv("DPGOV_SECRET_FILE", str(settings.secret_file))
    monkeypatch.setenv("DPGOV_AUDIT_KEY_FILE", str(settings.audit_key_file))
    monkeypatch.setenv("DPGOV_FLUSH_MIN_BATCH", "1")
    ran = runner.invoke(cli, ["jobs", "run", "aggregate", "--database-url", settings.database_url])
    assert ran.exit_code == 0, ran.output
    assert json.loads(ran.stdout)["result"]["folded"] == 4
    assert ran.stderr.splitlines() == [
        "jobs run aggregate: flush-inbox, reports checked: 4 of 4 reports (100%)",
        "jobs run aggregate: aggregate: 0 of 4 reports (0%)",
        "jobs run aggregate: aggregate: 4 of 4 reports (100%)",
    ]


def test_effective_epsilon_is_public_and_computed_from_the_ledger(client: TestClient) -> None:
    _submit(client, 9)
    r = client.get("/v1/audit/effective-epsilon")
    assert r.status_code == 200, r.text
    body = r.json()
    lines = {line["use_case"]: line for line in body["use_cases"]}
    safari = lines["safari-energy-domains"]
    assert safari["epsilon_per_day"] == 8.0
    assert safari["shares_budget_with"] == ["safari-crash-domains"]
    spent = safari["spent_window"]
    assert (spent["devices"], spent["max"], spent["p99"], spent["median"]) == (3, 8.0, 8.0, 8.0)
    assert (spent["bound"], spent["kind"]) == ("basic sum", "running total")
    assert body["totals"]["allowed_per_day"]["epsilon_basic"] == 54.0
    assert body["provenance"]["delta"] == 1e-9
    assert client.get("/v1/audit/effective-epsilon?delta=0").status_code == 422
    assert client.get("/v1/audit/effective-epsilon?delta=nan").status_code == 422
    tighter = client.get("/v1/audit/effective-epsilon?delta=1e-6", headers=ADMIN).json()
    assert tighter["provenance"]["delta"] == 1e-6
    public = client.get("/v1/audit/effective-epsilon?delta=1e-6")  # it would read the ledger
    assert public.status_code == 401 and "`delta`" in public.json()["detail"]


def test_cli_report_export_and_offline_recompute(
    client: TestClient, settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _submit(client, 6)
    monkeypatch.setenv("DPGOV_SECRET_FILE", str(settings.secret_file))
    monkeypatch.setenv("DPGOV_AUDIT_KEY_FILE", str(settings.audit_key_file))
    url = ["--database-url", settings.database_url]
    table = runner.invoke(cli, ["audit", "report", *url])
    assert table.exit_code == 0, table.output
    assert "safari-energy-domains" in table.output and "nothing bounds" in table.output
    live = runner.invoke(cli, ["audit", "report", "--json", *url])
    out = tmp_path / "ledger.csv"
    exported = runner.invoke(cli, ["audit", "export", "--format", "csv", "-o", str(out), *url])
    assert exported.exit_code == 0, exported.output
    lines = len(out.read_text().splitlines())  # piped: the count written, on stderr
    assert exported.stderr.splitlines()[-1] == f"audit export: {lines:,d} lines"
    again = runner.invoke(cli, ["audit", "recompute", "--json", str(out)])
    assert again.exit_code == 0, again.output
    a, b = (json.loads(x.stdout) for x in (live, again))  # stderr: the progress
    assert a.pop("computed_at") <= b.pop("computed_at")  # the export is read after the report
    assert a == b  # both as of today (the CLI reads the wall clock)
    bad = runner.invoke(cli, ["audit", "export", "--format", "xml", "-o", str(out), *url])
    assert bad.exit_code == 2 and "--format" in bad.output
    missing = runner.invoke(cli, ["audit", "recompute", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 2 and "cannot read the export" in missing.output
    (tmp_path / "notes.txt").write_text("not an export\n", encoding="utf-8")
    other = runner.invoke(cli, ["audit", "recompute", str(tmp_path / "notes.txt")])
    assert other.exit_code == 2 and "is not a ledger export" in other.output, other.output
    assert "Traceback" not in other.output


def test_cli_report_from_its_summary_equals_the_full_pass(
    client: TestClient, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPGOV_SECRET_FILE", str(settings.secret_file))
    monkeypatch.setenv("DPGOV_AUDIT_KEY_FILE", str(settings.audit_key_file))
    url = ["--database-url", settings.database_url, "--json", "--quiet"]
    _submit(client, 2)
    first = runner.invoke(cli, ["audit", "report", *url])  # every account read; stored
    assert first.exit_code == 0, first.output
    _submit(client, 6)  # more devices charged: the next report starts from the summary
    reports = [runner.invoke(cli, ["audit", "report", *url, *full]) for full in ([], ["--full"])]
    assert [r.exit_code for r in reports] == [0, 0], [r.output for r in reports]
    incremental, full = (json.loads(r.stdout) for r in reports)
    assert incremental.pop("computed_at") <= full.pop("computed_at")
    assert incremental == full
    spent = {line["use_case"]: line for line in full["use_cases"]}["safari-energy-domains"]
    assert spent["spent_window"]["devices"] == 3


def test_device_timeline_distribution_and_what_if_routes(client: TestClient) -> None:
    _submit(client, 9)
    mine = client.get("/v1/audit/devices/d0", headers={"X-Device-Id": "d0"})
    assert mine.status_code == 200, mine.text
    body = mine.json()
    assert body["days"] == ["2026-11-22"]
    assert body["use_cases"]["safari-energy-domains"]["reports"] == [2]
    assert body["total"]["lifetime"] == [8.0]
    assert body["loss"]["lifetime_total"]["epsilon_basic"] == 8.0
    assert client.get("/v1/audit/devices/d0", headers=ADMIN).status_code == 200
    other = client.get("/v1/audit/devices/d0", headers={"X-Device-Id": "d1"})
    assert other.status_code == 403
    assert client.get("/v1/audit/devices/d0").status_code == 401

    dist = client.get("/v1/audit/use-cases/safari-energy-domains/distribution?bins=2").json()
    assert dist["devices"] == 3 and dist["quantiles"]["max"] == 8.0
    assert client.get("/v1/audit/use-cases/nope/distribution").status_code == 404
    bad = client.get("/v1/audit/use-cases/emoji/distribution?scope=day")
    assert bad.status_code == 422 and "scope" in bad.text

    url = "/v1/use-cases/safari-energy-domains/what-if"
    halve: dict[str, int | None] = {"max_reports_per_day": 1}
    # its budget group (with safari-crash-domains) would refuse that, so what-if does too
    refused = client.post(url, json=halve, headers=ADMIN)
    assert refused.status_code == 409, refused.text
    assert refused.json()["field"] == "max_reports_per_day"
    # out of the group and halved: its own history goes with it (two reports today each)
    halve = {"max_reports_per_day": 1, "budget_group": None}
    r = client.post(url, json=halve, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["refused_next_report_today"] == {"current": 3, "proposed": 3}
    assert r.json()["effective_epsilon"]["epsilon_per_day"] == {"current": 8.0, "proposed": 4.0}
    assert client.get("/v1/use-cases/safari-energy-domains").json()["version"] == 1
    assert client.post(url, json=halve).status_code == 401
    bad_eps = client.post(url, json={"epsilon_per_report": "4"}, headers=ADMIN)
    assert bad_eps.status_code == 422 and "epsilon_per_report" in bad_eps.text
    wrong = client.post(url, json={"name": "emoji"}, headers=ADMIN)
    assert wrong.status_code == 422 and "name" in wrong.text


def _safari(**fields: object) -> dict[str, object]:
    """The default safari-energy-domains policy with ``fields`` changed."""
    base: dict[str, object] = {
        "mechanism": "hcms",
        "k": 1024,
        "m": 32768,
        "epsilon_per_report": 4.0,
        "max_reports_per_day": 2,
        "budget_group": "safari-domains",
    }
    return {**base, **fields}


AUDIT_ROUTES = [
    "/v1/audit/effective-epsilon",
    "/v1/audit/effective-epsilon?delta=0.9999999999999999",
    "/v1/audit/effective-epsilon?delta=1e-300",
    "/",
    "/v1/audit/devices/d0",
    "/v1/audit/use-cases/safari-energy-domains/distribution",
    "/v1/devices/d0/budget",
]


@pytest.mark.parametrize(
    "policy",
    [
        {"epsilon_per_report": 8.0, "group_size": 89},  # the OverflowError in exp
        {"epsilon_per_report": 20.0, "group_size": 1000, "delta": 0.999999},
    ],
    ids=["group-89-eps-8", "eps-20-group-1000"],
)
def test_an_extreme_accepted_policy_keeps_every_audit_route_up(
    client: TestClient, policy: dict[str, object]
) -> None:
    put = client.put(
        "/v1/use-cases/safari-energy-domains",
        json=_safari(**policy),
        params={"allow_loosen": "true"},
        headers=ADMIN,
    )
    assert put.status_code == 200, put.text
    _submit(client, 3)
    for url in AUDIT_ROUTES:
        r = client.get(url, headers={**ADMIN, "X-Device-Id": "d0"})
        assert r.status_code == 200, (url, r.text)
    what_if = client.post(
        "/v1/use-cases/safari-energy-domains/what-if",
        json={"group_size": 1000, "epsilon_per_report": 20.0},
        headers=ADMIN,
    )
    assert what_if.status_code == 200, what_if.text
    body = client.get("/v1/audit/effective-epsilon").json()
    loss = body["totals"]["device_bound_lifetime"]
    assert loss["devices"] == 3 and loss["kind"] == "running total"


def test_group_members_with_their_own_epsilon_count_over_http(client: TestClient) -> None:
    put = client.put(
        "/v1/use-cases/safari-energy-domains",
        json=_safari(epsilon_per_report=8.0),
        params={"allow_loosen": "true"},
        headers=ADMIN,
    )
    assert put.status_code == 200, put.text
    body = client.get("/v1/audit/effective-epsilon").json()
    assert body["totals"]["allowed_per_day"]["epsilon_basic"] == 62.0  # was 54
    page = client.get("/").text
    assert "tight" not in page and "basic sum" in page and "fixed in advance" in page


def test_any_delta_is_answered_from_one_reading_of_the_ledger(settings: Settings) -> None:
    slow = settings.model_copy(update={"report_cache_seconds": 86_400.0})
    with TestClient(create_app(slow, clock=FixedClock(NOW))) as client:
        _submit(client, 6)
        first = client.get("/v1/audit/effective-epsilon?delta=0.9999999999999999", headers=ADMIN)
        assert first.status_code == 200, first.text
        assert first.json()["provenance"]["delta"] == 0.9999999999999999
        spent = first.json()["totals"]["spent_window"]
        r = client.post(
            "/v1/use-cases/safari-energy-domains/reports",
            json={"j": 1, "l": 2, "bit": 1},
            headers={"X-Device-Id": "a-new-device"},
        )
        assert r.status_code == 202, r.text  # counted at the next reading, not in this one
        reports = client.app.state.caches.reports  # type: ignore[attr-defined]
        for i in range(34):
            r = client.get(f"/v1/audit/effective-epsilon?delta={(i + 1) / 1000}", headers=ADMIN)
            assert r.status_code == 200, r.text
            assert r.json()["totals"]["spent_window"] == spent  # the same reading of the ledger
        assert len(reports) == 32  # an LRU: bounded whatever deltas are asked
        for bad in ("1", "0", "-1e-9", "nan", "inf", "x"):
            r = client.get(f"/v1/audit/effective-epsilon?delta={bad}")
            assert r.status_code == 422 and "delta" in r.text, bad

"""``dpgov audit report --shard URL ...``: a service's ledger split over shard files, merged.

The service's database is copied once per shard and each copy keeps the devices the routing
rule of docs/scaling.md sends to it, so the shards carry the service's keys and policies.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Mapping
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner, Result

from dp_governor.api.app import create_app
from dp_governor.api.cli import app
from dp_governor.budget.reporting.sharded import shard_of
from tests.live import app_settings

TOKEN = "shards-admin-token-shards-0123456789ab"
SHARDS = 3
runner = CliRunner()


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        "DPGOV_DATABASE_URL": f"sqlite:///{tmp_path / 'service.sqlite'}",
        "DPGOV_SECRET_FILE": str(tmp_path / "secret"),
        "DPGOV_AUDIT_KEY_FILE": str(tmp_path / "audit.key"),
        "DPGOV_SHUFFLER_KEY_FILE": str(tmp_path / "shuffler.key"),
    }


def _shard_files(tmp_path: Path) -> list[str]:
    """The service's database split by device key into :data:`SHARDS` files; their URLs."""
    urls = []
    with sqlite3.connect(tmp_path / "service.sqlite") as source:
        for shard in range(SHARDS):
            path = tmp_path / f"shard{shard}.sqlite"
            with sqlite3.connect(path) as copy:
                source.backup(copy)
                copy.create_function("shard_of", 2, shard_of, deterministic=True)
                for table in ("accounts", "charges", "idempotency"):
                    copy.execute(
                        f"DELETE FROM {table} WHERE shard_of(device_key, ?) != ?",
                        (SHARDS, shard),
                    )
            urls.append(f"sqlite:///{path}")
    return urls


def _report(args: list[str], env: Mapping[str, str]) -> Result:
    return runner.invoke(app, ["audit", "report", "-q", *args], env=dict(env))


@pytest.fixture
def service(tmp_path: Path) -> tuple[dict[str, str], list[str]]:
    """A service whose 60 devices each sent one report, and its ledger split into shards."""
    with TestClient(create_app(app_settings(tmp_path, TOKEN))) as client:
        items = [{"device_id": f"d{i}", "report": {"j": 1, "l": 2, "bit": 1}} for i in range(60)]
        r = client.post(
            "/v1/use-cases/safari-energy-domains/reports:batch",
            json={"items": items},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert r.json()["accepted"] == 60, r.text
    return _env(tmp_path), _shard_files(tmp_path)


def test_the_shards_report_as_the_one_database(service: tuple[dict[str, str], list[str]]) -> None:
    env, urls = service
    single = _report(["--json"], env)
    assert single.exit_code == 0, single.output
    shards = [arg for url in urls for arg in ("--shard", url)]
    merged = _report(["--json", *shards, "--partitions", "2", "--workers", "2"], env)
    assert merged.exit_code == 0, merged.output
    one, other = json.loads(single.stdout), json.loads(merged.stdout)
    one.pop("computed_at"), other.pop("computed_at")  # the instant each run read the ledger
    covered = other["provenance"].pop("shards")
    assert one == other
    assert covered["shards"] == SHARDS and covered["devices"] == 60
    assert all(n > 0 for n in covered["devices_per_shard"])
    text = _report(shards, env)
    assert text.exit_code == 0, text.output
    assert f"Over {SHARDS} shards, 60 devices (" in text.stdout


def test_a_shard_with_other_policies_is_named(service: tuple[dict[str, str], list[str]]) -> None:
    env, urls = service
    with sqlite3.connect(urls[1].removeprefix("sqlite:///")) as shard:
        shard.execute("UPDATE policies SET max_reports_per_day = 9 WHERE name = 'emoji'")
    refused = _report([arg for url in urls for arg in ("--shard", url)], env)
    assert refused.exit_code == 2, refused.output
    assert refused.stdout == ""
    (line,) = refused.stderr.splitlines()
    assert line.startswith("Error: --shard 1 (") and "other policies than --shard 0" in line


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("postgresql+psycopg://postgres:hunter2@127.0.0.1:1/nowhere", "127.0.0.1:1"),
        ("sqlite:////nonexistent/folder/shard.sqlite", "/nonexistent/folder/shard.sqlite"),
        ("mysql://somewhere/db", "mysql://somewhere/db"),
    ],
)
def test_an_unusable_shard_is_one_line_naming_it(
    service: tuple[dict[str, str], list[str]], url: str, named: str
) -> None:
    env, urls = service
    refused = _report(["--shard", urls[0], "--shard", url], env)
    assert refused.exit_code == 2, refused.output
    (line,) = refused.stderr.splitlines()
    assert line.startswith("Error: --shard 1 (") and named in line, line
    assert "hunter2" not in line and "Traceback" not in refused.output


def test_shard_options_that_cannot_hold_are_refused(
    service: tuple[dict[str, str], list[str]],
) -> None:
    env, urls = service
    twice = _report(["--shard", urls[0], "--shard", urls[0]], env)
    assert twice.exit_code == 2 and "is given twice" in twice.stderr
    both = _report(["--shard", urls[0], "--database-url", urls[1]], env)
    assert both.exit_code == 2 and "--shard URLs or --database-url" in both.stderr
    one = _report(["--shard", urls[0]], env)
    assert one.exit_code == 2 and one.stdout == "", one.output
    assert one.stderr.strip().splitlines() == [
        "Error: --shard needs every shard's database URL, two or more"
        " (one database: --database-url)"
    ]


def test_a_dry_run_over_shards_counts_every_shards_devices(
    service: tuple[dict[str, str], list[str]], tmp_path: Path
) -> None:
    env, urls = service
    exported = runner.invoke(app, ["policies", "export"], env=env)
    assert exported.exit_code == 0, exported.output
    edit = tmp_path / "edit.yaml"
    edit.write_text(
        exported.stdout.replace("max_reports_per_day: 2", "max_reports_per_day: 1", 1),
        encoding="utf-8",
    )
    single = runner.invoke(app, ["policies", "apply", "--dry-run", str(edit)], env=env)
    assert single.exit_code == 0, single.output
    shards = [arg for url in urls for arg in ("--shard", url)]
    merged = runner.invoke(
        app, ["policies", "apply", "--dry-run", str(edit), *shards, "--workers", "2"], env=env
    )
    assert merged.exit_code == 0, merged.output
    *review, last = merged.stdout.splitlines()
    assert review == single.stdout.splitlines()[:-1] and "version" in merged.stdout
    assert last == f"dry run over {SHARDS} shards: 1 change(s), nothing written"
    for args in (["--full"], [*shards, "--full"]):  # every device read: the same review
        full = runner.invoke(app, ["policies", "apply", "--dry-run", str(edit), *args], env=env)
        assert full.exit_code == 0, full.output
        assert full.stdout.splitlines()[:-1] == review
    written = runner.invoke(app, ["policies", "apply", str(edit), *shards], env=env)
    assert written.exit_code == 2 and "--shard needs --dry-run" in written.stderr
    alone = runner.invoke(
        app, ["policies", "apply", "--dry-run", str(edit), "--workers", "2"], env=env
    )
    assert alone.exit_code == 2 and "--workers needs --shard" in alone.stderr
    one = runner.invoke(
        app, ["policies", "apply", "--dry-run", str(edit), "--shard", urls[0]], env=env
    )
    assert one.exit_code == 2 and one.stdout == "" and "two or more" in one.stderr, one.output


def _misrouted_line(result: Result) -> str:
    """The refusal's one line; it names counts and shards, never a device key."""
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert "routes to other shards" in line and "Traceback" not in result.output
    assert re.search(r"[0-9a-f]{32}", line) is None, line
    return line


def test_shards_out_of_routing_order_are_refused(
    service: tuple[dict[str, str], list[str]], tmp_path: Path
) -> None:
    """Swapped, or one shard's database twice under another path: the shard is named."""
    env, urls = service
    swapped = _report([arg for url in urls[::-1] for arg in ("--shard", url)], env)
    line = _misrouted_line(swapped)
    assert line.startswith(f"Error: --shard 0 ({urls[2]}) holds "), line
    assert "(one to --shard 2" in line
    link = tmp_path / "same-as-shard0.sqlite"
    link.symlink_to(urls[0].removeprefix("sqlite:///"))
    twice = _report(["--shard", urls[0], "--shard", f"sqlite:///{link}", "--shard", urls[2]], env)
    assert _misrouted_line(twice).startswith(f"Error: --shard 1 (sqlite:///{link}) holds ")


def test_a_dry_run_refuses_a_shard_holding_another_shards_device(
    service: tuple[dict[str, str], list[str]], tmp_path: Path
) -> None:
    """One account copied into the wrong shard: the what-if's read names it, nothing printed."""
    env, urls = service
    with sqlite3.connect(urls[0].removeprefix("sqlite:///")) as shard0:
        row = shard0.execute("SELECT * FROM accounts LIMIT 1").fetchone()
    with sqlite3.connect(urls[1].removeprefix("sqlite:///")) as shard1:
        shard1.execute(f"INSERT INTO accounts VALUES ({', '.join('?' * len(row))})", row)
    exported = runner.invoke(app, ["policies", "export"], env=env)
    edit = tmp_path / "edit.yaml"
    edit.write_text(
        exported.stdout.replace("max_reports_per_day: 2", "max_reports_per_day: 1", 1),
        encoding="utf-8",
    )
    shards = [arg for url in urls for arg in ("--shard", url)]
    refused = runner.invoke(app, ["policies", "apply", "--dry-run", str(edit), *shards], env=env)
    line = _misrouted_line(refused)
    assert line.startswith(f"Error: --shard 1 ({urls[1]}) holds 1 device(s) "), line
    assert "(one to --shard 0)" in line


def test_shards_signed_under_their_own_origins_report_together(
    service: tuple[dict[str, str], list[str]],
) -> None:
    """Each shard's log signs under its own origin; the report reads every shard all the same."""
    env, urls = service
    for shard, url in enumerate(urls):
        own = {**env, "DPGOV_DATABASE_URL": url, "DPGOV_TLOG_ORIGIN": f"dpgov.example/shard{shard}"}
        signed = runner.invoke(app, ["jobs", "run", "checkpoint"], env=own)
        assert signed.exit_code == 0, signed.output
    alone = _report(["--database-url", urls[1]], env)  # one log under another origin: refused
    assert alone.exit_code == 2 and "dpgov.example/shard1" in alone.stderr, alone.output
    merged = _report(["--json", *(arg for url in urls for arg in ("--shard", url))], env)
    assert merged.exit_code == 0, merged.output
    assert json.loads(merged.stdout)["provenance"]["shards"]["devices"] == 60


def test_a_refusal_from_summaries_gives_lower_bounds_and_full_counts_all(
    service: tuple[dict[str, str], list[str]],
) -> None:
    """A refusal from stored summaries says "at least"; ``--full`` counts every device.

    From summaries only the changed devices and each shard's key ends are read.
    """
    env, urls = service
    in_order = [arg for url in urls for arg in ("--shard", url)]
    assert _report(in_order, env).exit_code == 0  # every shard's summary stored
    swapped = [arg for url in urls[::-1] for arg in ("--shard", url)]
    partial = _misrouted_line(_report(swapped, env))
    assert "holds at least " in partial and "--full counts every device" in partial, partial
    whole = _misrouted_line(_report([*swapped, "--full"], env))
    assert "at least" not in whole and "--full" not in whole, whole
    found = [re.search(r"holds (?:at least )?(\d+)", x) for x in (partial, whole)]
    counts = [int(m[1]) for m in found if m is not None]
    assert len(counts) == 2 and counts[0] <= counts[1], (partial, whole)

"""``dpgov policies apply`` through the CLI on a real SQLite file.

Complete files only, the diff and what-if of each change, a dry run that writes nothing, and
loosening only when asked for.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import tomli_w
import yaml
from sqlalchemy import text
from typer.testing import CliRunner, Result

from dp_governor.api.cli import app as cli
from dp_governor.budget import Ledger, create_db_engine
from dp_governor.budget.reporting.views import what_if
from dp_governor.policies import PolicyCreate

# a few devices publish: the pipeline here, not the defaults' batch minimums
pytestmark = pytest.mark.usefixtures("small_batches")

runner = CliRunner()


class Database:
    """A service database made by ``dpgov db init``; ``device-1`` spent 4 on emoji twice."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.env = {
            "DPGOV_DATABASE_URL": f"sqlite:///{tmp_path / 'dpgov.sqlite'}",
            "DPGOV_SECRETS_DIR": str(tmp_path / "keys"),
        }
        made = self.cli(["db", "init"])
        assert made.exit_code == 0, made.output
        ledger = self.ledger()
        for days_ago in (2, 1):
            now = datetime.now(UTC) - timedelta(days=days_ago)
            assert ledger.charge("device-1", "emoji", now=now).accepted
        ledger.engine.dispose()

    def cli(self, args: list[str]) -> Result:
        """The real command line, in-process, with this database's settings."""
        return runner.invoke(cli, args, env=self.env)

    def ledger(self) -> Ledger:
        """The same ledger, opened in-process with the generated keys."""
        keys = self.tmp / "keys"
        return Ledger(
            create_db_engine(self.env["DPGOV_DATABASE_URL"]),
            (keys / "dpgov.secret").read_text().strip().encode(),
            audit_key=(keys / "dpgov-audit.key").read_text().strip().encode(),
        )

    def emoji(self) -> dict[str, Any]:
        """The stored emoji policy as a complete file entry (from ``policies export``)."""
        out = self.cli(["policies", "export"])
        assert out.exit_code == 0, out.output
        return next(p for p in yaml.safe_load(out.stdout)["policies"] if p["name"] == "emoji")

    def write(self, *policies: dict[str, Any], name: str = "p.yaml") -> str:
        """A policy file holding ``policies``; its path."""
        path = self.tmp / name
        path.write_text(yaml.safe_dump({"policies": list(policies)}), encoding="utf-8")
        return str(path)

    def state(self) -> tuple[int, int]:
        """(policy versions, audit entries): unchanged if nothing was written."""
        engine = create_db_engine(self.env["DPGOV_DATABASE_URL"])
        with engine.connect() as conn:
            versions = conn.execute(text("SELECT count(*) FROM policies")).scalar_one()
            entries = conn.execute(text("SELECT count(*) FROM audit_log")).scalar_one()
        engine.dispose()
        return int(versions), int(entries)


@pytest.fixture
def db(tmp_path: Path) -> Database:
    database = Database(tmp_path)
    emoji = database.emoji()
    emoji["window_epsilon_cap"] = 120.0
    applied = database.cli(["policies", "apply", database.write(emoji)])  # a tightening
    assert applied.exit_code == 0, applied.output
    return database


def test_a_partial_file_is_refused_listing_every_problem(db: Database) -> None:
    before = db.state()
    partial = {  # the file: m 1000, and no retention or window cap
        "name": "emoji",
        "mechanism": "cms",
        "k": 65536,
        "m": 1000,
        "epsilon_per_report": 4.0,
        "max_reports_per_day": 1,
    }
    bad_hcms = {**db.emoji(), "name": "other", "mechanism": "hcms", "m": 1000}
    result = db.cli(["policies", "apply", db.write(partial, bad_hcms)])
    assert result.exit_code == 2
    message = result.output.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in message
    for field in ("retention_days", "window_epsilon_cap", "lifetime_epsilon_cap", "description"):
        assert f"policies[0] `{field}`: missing" in message
    assert "policies[1] `policy`: `m` must be a power of 2 for hcms, got 1000" in message
    assert "Value error" not in message
    assert "write null" in message
    assert db.state() == before
    assert db.emoji()["window_epsilon_cap"] == 120.0 and db.emoji()["m"] == 1024


def test_an_unknown_mechanism_is_refused_naming_the_value_and_the_allowed_ones(
    db: Database,
) -> None:
    """The reported file: ``mechanism: nope`` among missing fields; exit 2, one line."""
    before = db.state()
    partial = {"name": "emoji", "mechanism": "nope", "k": 1, "m": 64}
    result = db.cli(["policies", "apply", "--dry-run", db.write(partial)])
    assert result.exit_code == 2
    message = result.output.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in message
    assert "policies[0] `mechanism`: must be one of 'cms', 'hcms' or 'sfp', got 'nope'" in message
    assert "policies[0] `epsilon_per_report`: missing" in message
    assert db.state() == before


def test_apply_prints_the_diff_and_the_what_if_and_dry_run_writes_nothing(db: Database) -> None:
    emoji = db.emoji()
    emoji["window_epsilon_cap"] = 4.0  # device-1 has spent 8 in the window
    emoji["description"] = "tighter"
    path = db.write(emoji)
    before = db.state()
    dry = db.cli(["policies", "apply", "--dry-run", path])
    assert dry.exit_code == 0, dry.output
    assert db.state() == before
    assert "emoji: version 2 -> 3" in dry.stdout
    assert "  window_epsilon_cap: 120 -> 4\n" in dry.stdout
    assert "  description: Emoji usage by keyboard locale (CMS). -> tighter\n" in dry.stdout
    assert "dry run: 1 change(s), nothing written" in dry.stdout
    ledger = db.ledger()  # the figures are budget.reporting.views.what_if's, rendered
    expected = what_if(ledger, "emoji", PolicyCreate.model_validate(emoji), now=datetime.now(UTC))
    ledger.engine.dispose()
    assert expected.over_window_cap == {"current": 0, "proposed": 1}
    assert "    over_window_cap: 0 -> 1\n" in dry.stdout
    per_window = expected.effective_epsilon["epsilon_per_window"]
    assert f"epsilon_per_window: {per_window['current']:g} -> {per_window['proposed']:g}" in (
        dry.stdout
    )
    applied = db.cli(["policies", "apply", path])
    assert applied.exit_code == 0, applied.output
    assert (
        "over_window_cap: 0 -> 1" in applied.stdout and "emoji: version 3 written" in applied.stdout
    )
    assert db.state() == (before[0] + 1, before[1] + 1)  # one version, its audit entry
    again = db.cli(["policies", "apply", path])
    assert "emoji: unchanged (version 3)" in again.stdout and "nothing written" in again.stdout


SPEND = "what one device may spend on budget 'emoji' rises: "
LOOSENINGS = [
    ({"max_reports_per_day": 2}, SPEND + "a day 4 -> 8"),
    ({"window_epsilon_cap": 200.0}, SPEND + "any 90 days 120 -> 200"),
    ({"window_epsilon_cap": None}, SPEND + "any 90 days 120 -> 360"),
    ({"lifetime_epsilon_cap": None}, None),  # there was none: not a loosening
    ({"epsilon_per_report": 5.0}, "`epsilon_per_report` raised from 4 to 5"),
    ({"retention_days": 30}, SPEND + "any 90 days 120 -> 360"),  # the window cap renews sooner
    ({"group_size": 1}, None),  # it was 1
    ({"min_batch_devices": 1}, None),
    ({"delta": 1e-6}, "`delta` raised from 1e-09 to 1e-06"),
    ({"description": "only words"}, None),
]


@pytest.mark.parametrize(("change", "named"), LOOSENINGS)
def test_loosening_needs_allow_loosen(
    db: Database, change: dict[str, Any], named: str | None
) -> None:
    path = db.write({**db.emoji(), **change})
    before = db.state()
    result = db.cli(["policies", "apply", path])
    if named is None:
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == 1
    assert "need --allow-loosen" in result.output and f"emoji: {named}" in result.output
    assert "this change loosens:" in result.stdout  # with the diff
    assert db.state() == before
    allowed = db.cli(["policies", "apply", "--allow-loosen", path])
    assert allowed.exit_code == 0, allowed.output
    assert db.state()[0] == before[0] + 1


FILTER = {"lifetime_filter_epsilon": 40.0, "lifetime_filter_delta": 1e-9}
FILTER_LOOSENINGS = [
    ({"lifetime_filter_epsilon": 50.0}, "the lifetime filter's target raised from (40, 1e-09)"),
    (
        {"lifetime_filter_delta": 1e-6},
        "the lifetime filter's target raised from (40, 1e-09) to (40, 1e-06)",
    ),
    (
        {"lifetime_filter_epsilon": None, "lifetime_filter_delta": None},
        "the lifetime filter removed",
    ),
    ({"lifetime_filter_epsilon": 30.0}, None),  # tightened
    ({"window_filter_epsilon": 8.0, "window_filter_delta": 1e-9}, None),  # a new target
]


@pytest.mark.parametrize(("change", "named"), FILTER_LOOSENINGS)
def test_raising_or_removing_a_filter_target_needs_allow_loosen(
    db: Database, change: dict[str, Any], named: str | None
) -> None:
    added = db.cli(["policies", "apply", db.write({**db.emoji(), **FILTER})])
    assert added.exit_code == 0, added.output  # a new target tightens: no flag
    before = db.state()
    result = db.cli(["policies", "apply", db.write({**db.emoji(), **change})])
    if named is None:
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == 1 and f"emoji: {named}" in result.output
    assert db.state() == before


def test_tightening_and_toml_round_trip_need_no_flag(db: Database) -> None:
    emoji = {**db.emoji(), "lifetime_epsilon_cap": 400.0, "window_epsilon_cap": 100.0}
    tighter = db.cli(["policies", "apply", db.write(emoji)])
    assert tighter.exit_code == 0, tighter.output
    exported = db.cli(["policies", "export", "--format", "toml"])
    assert 'unset = [\n    "window_filter_epsilon",' in exported.stdout
    path = db.tmp / "all.toml"
    path.write_text(exported.stdout, encoding="utf-8")
    before = db.state()
    same = db.cli(["policies", "apply", str(path)])
    assert same.exit_code == 0, same.output
    assert "0 change(s), nothing written" in same.stdout and db.state() == before


def test_the_console_script_refuses_a_loosening_in_a_real_process(db: Database) -> None:
    path = db.write({**db.emoji(), "retention_days": 30})
    base = {k: v for k, v in os.environ.items() if not k.startswith("DPGOV_")}
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("dpgov")), "policies", "apply", "--dry-run", path],
        env={**base, **db.env},
        cwd=db.tmp,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "retention_days: 90 -> 30\n" in proc.stdout
    assert f"this change loosens:\n  emoji: {SPEND}any 90 days 120 -> 360" in proc.stdout
    assert "window cap's window shortens from 90 to 30 days" in proc.stdout
    assert proc.stderr.strip().endswith("2 loosening(s) above need --allow-loosen")


def test_the_device_budget_section_is_applied_and_audited(db: Database) -> None:
    path = db.tmp / "device.yaml"
    body = {"policies": [db.emoji()], "device_budget": {"lifetime_epsilon": 10.0}}
    path.write_text(yaml.safe_dump(body), encoding="utf-8")
    first = db.cli(["policies", "apply", str(path)])
    assert first.exit_code == 0, first.output
    assert "device_budget: version 1 written" in first.stdout
    ledger = db.ledger()
    assert ledger.device_wide("device-1", now=datetime.now(UTC)) is not None
    ledger.engine.dispose()
    body["device_budget"] = {"lifetime_epsilon": 20.0}
    path.write_text(yaml.safe_dump(body), encoding="utf-8")
    looser = db.cli(["policies", "apply", str(path)])
    assert looser.exit_code == 1
    assert "device_budget.lifetime_epsilon 10.0 -> 20.0" in looser.output
    allowed = db.cli(["policies", "apply", "--allow-loosen", str(path)])
    assert allowed.exit_code == 0 and "version 2 written" in allowed.stdout
    engine = create_db_engine(db.env["DPGOV_DATABASE_URL"])
    with engine.connect() as conn:
        audited = conn.execute(
            text("SELECT body FROM audit_log WHERE action = 'device_budget.update' ORDER BY seq")
        ).scalars()
        bodies = list(audited)
    engine.dispose()
    assert len(bodies) == 2 and '"lifetime_epsilon":20.0' in bodies[1]


@pytest.mark.parametrize("suffix", [".yaml", ".toml"])
def test_a_file_that_is_not_utf8_is_one_line_and_exit_2(db: Database, suffix: str) -> None:
    """Like every file with problems (exit 2), not a traceback."""
    path = db.tmp / f"latin1{suffix}"
    path.write_bytes(b"policies: []\n# caf\xe9\n")
    for args in (["policies", "apply", str(path)], ["policies", "apply", "--dry-run", str(path)]):
        result = db.cli(args)
        assert result.exit_code == 2, result.output
        assert isinstance(result.exception, SystemExit)
        assert "not UTF-8" in result.output and str(path) in result.output
        assert "Traceback" not in result.output


def test_dry_run_shows_the_epsilon_advisor_and_warns_on_waste(db: Database) -> None:
    emoji = db.emoji()
    hcms = {**emoji, "name": "emoji-hcms", "mechanism": "hcms", "description": "HCMS at 4."}
    dry = db.cli(["policies", "apply", "--dry-run", db.write(emoji, hcms)])
    assert dry.exit_code == 0, dry.output
    assert "epsilon advisor (against optimized local hashing" in dry.stdout
    assert "  emoji: report cms at 4: variance 2.4x the best known oracle's" in dry.stdout
    assert "  WARNING emoji-hcms: report hcms at 4: variance 14.2x" in dry.stdout
    assert "57% of epsilon 4 wasted (would do: 1.71)" in dry.stdout


@pytest.mark.parametrize(
    ("nan", "suffix"), [(".nan", ".yaml"), (".NaN", ".yaml"), ("nan", ".toml")]
)
def test_a_nan_in_a_file_is_refused_in_the_projects_words(
    db: Database, nan: str, suffix: str
) -> None:
    """YAML's ``.nan`` or TOML's ``nan``: "must be a finite number", as the HTTP routes say."""
    before = db.state()
    emoji = db.emoji()
    if suffix == ".yaml":
        text = Path(db.write(emoji)).read_text(encoding="utf-8")
    else:
        policy = {k: v for k, v in emoji.items() if v is not None}
        text = tomli_w.dumps({"policies": [{**policy, "unset": sorted(set(emoji) - set(policy))}]})
    assert text.count("epsilon_per_report") == 1
    text = re.sub(r"epsilon_per_report(: | = )4\.0", rf"epsilon_per_report\g<1>{nan}", text)
    assert f"epsilon_per_report: {nan}" in text or f"epsilon_per_report = {nan}" in text
    path = db.tmp / f"nan{suffix}"
    path.write_text(text, encoding="utf-8")
    result = db.cli(["policies", "apply", str(path)])
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in message
    assert "policies[0] `epsilon_per_report`: must be a finite number, got nan" in message
    assert "Input should be" not in message
    assert db.state() == before


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (
            "policies:\n  - name: emoji\n    k: [1,\n",
            "p.yaml:4:1: not valid YAML: expected the node",
        ),
        ("policies:\n  - name: emoji\n   k: 1\n", "p.yaml:3:4: not valid YAML:"),
        ("rules: []\n", "with a list (and may hold `device_budget`); it holds `rules`"),
        ("policies:\n  - null\n", "policies[0]: must be a table of fields, got null"),
    ],
)
def test_a_file_that_does_not_parse_is_one_line_at_its_line_and_column(
    db: Database, content: str, said: str
) -> None:
    """``FILE:LINE:COLUMN: not valid YAML: <the parser's reason>``, exit 2, no parser dump."""
    path = db.tmp / "p.yaml"
    path.write_text(content, encoding="utf-8")
    for args in (["policies", "apply", str(path)], ["policies", "apply", "--dry-run", str(path)]):
        result = db.cli(args)
        assert result.exit_code == 2, result.output
        assert result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stderr
        assert result.stderr.startswith(f"Error: {path}") and said in result.stderr
        assert "unicode string" not in result.stderr and "^" not in result.stderr


def test_a_null_value_and_an_unknown_key_are_said_in_the_files_words(db: Database) -> None:
    before = db.state()
    path = db.tmp / "p.yaml"
    body = {"policies": [{**db.emoji(), "k": None}], "device_budget": {"lifetime_epsilo": 10.0}}
    path.write_text(yaml.safe_dump(body), encoding="utf-8")
    result = db.cli(["policies", "apply", str(path)])
    assert result.exit_code == 2 and "policies[0] `k`: must be a valid integer, got null" in (
        result.stderr
    )
    body["policies"] = [db.emoji()]
    path.write_text(yaml.safe_dump(body), encoding="utf-8")
    result = db.cli(["policies", "apply", "--dry-run", str(path)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (
        f"Error: {path}: device_budget `lifetime_epsilo`: is not a field (the fields of"
        " `device_budget`: epsilon_per_day, window_days, window_epsilon, lifetime_epsilon,"
        " window_filter_epsilon, window_filter_delta, lifetime_filter_epsilon,"
        " lifetime_filter_delta, quotas)"
    )
    body = {"policies": [{**db.emoji(), "retention": 30}]}
    path.write_text(yaml.safe_dump(body), encoding="utf-8")
    result = db.cli(["policies", "apply", str(path)])
    assert result.exit_code == 2, result.output
    assert "policies[0] `retention`: is not a field" in result.stderr
    assert "(a policy's fields: name, description, mechanism," in result.stderr
    assert "Extra inputs" not in result.stderr and db.state() == before


def test_show_and_export_refuse_what_they_are_given_with_exit_2(db: Database) -> None:
    unknown = db.cli(["policies", "show", "emoj"])
    assert unknown.exit_code == 2 and unknown.stdout == ""
    assert unknown.stderr.startswith("Error: unknown use case 'emoj'"), unknown.stderr
    bad = db.cli(["policies", "export", "--format", "json"])
    assert bad.exit_code == 2 and "--format must be yaml or toml, got 'json'" in bad.stderr


def test_a_group_conflict_names_the_file_and_the_policy_at_fault(db: Database) -> None:
    """Joining a budget group on other terms is refused naming the file, its entry and the rule."""
    emoji = db.emoji()
    emoji["budget_group"] = "safari-domains"  # its members allow 2 reports a day, emoji 1
    path = db.write(emoji)
    before = db.state()
    out = db.cli(["policies", "apply", "--dry-run", path])
    assert out.exit_code == 1
    assert db.state() == before
    line = out.output.strip().splitlines()[-1]
    assert line.startswith(f"Error: {path}: policies[0] (emoji) `max_reports_per_day` of 'emoji'")
    assert "as in 'safari-" in line and "share one budget" in line


def test_a_file_that_leaves_out_a_use_case_says_it_stays_as_it_is(db: Database) -> None:
    """A file need not list every use case; the review says which it leaves unchanged."""
    out = db.cli(["policies", "apply", "--dry-run", db.write(db.emoji())])
    assert out.exit_code == 0, out.output
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("not in the file")]
    assert "emoji" not in line and "safari-energy-domains" in line

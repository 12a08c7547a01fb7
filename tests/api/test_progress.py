"""The command line's progress: rich's bar on a terminal, a line per tenth in a log."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

from fastapi.testclient import TestClient
from typer.testing import CliRunner

from dp_governor.api._verdict_text import REPLAY_HINT, SEALED_COUNTED
from dp_governor.api.app import create_app
from dp_governor.api.cli import app
from dp_governor.api.cli.common import Progress
from tests.live import app_settings

TOKEN = "progress-admin-token-progress-admin-0123"


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_log_gets_a_line_per_tenth_and_the_final_count() -> None:
    log = io.StringIO()
    with Progress("job", "reports", stream=log, clock=Clock()) as progress:
        for done in range(0, 1001):
            progress(done, 1000)
    lines = log.getvalue().splitlines()
    assert lines[0] == "job: 0 of 1,000 reports (0%)"
    assert lines[-1] == "job: 1,000 of 1,000 reports (100%)" and len(lines) == 11


def test_a_slow_tenth_still_shows_a_line_every_interval() -> None:
    log, clock = io.StringIO(), Clock()
    with Progress("slow", "files", stream=log, clock=clock, interval=10) as progress:
        progress(1, 1000)
        clock.now = 5.0
        progress(2, 1000)  # neither a new tenth nor 10 s since the last line
        clock.now = 10.5
        progress(3, 1000)
    assert log.getvalue().splitlines() == [
        "slow: 1 of 1,000 files (0%)",
        "slow: 3 of 1,000 files (0%)",  # also the final count: not written twice
    ]


def test_an_unknown_total_shows_counts_by_interval_and_at_the_end() -> None:
    log, clock = io.StringIO(), Clock()
    with Progress("export", "lines", stream=log, clock=clock, interval=10) as progress:
        for done in range(1, 150):
            clock.now = done / 10
            progress(done)
    assert log.getvalue().splitlines() == ["export: 100 lines", "export: 149 lines"]


def test_steps_each_count_under_their_own_name() -> None:
    log = io.StringIO()
    progress = Progress("jobs run aggregate", "reports", stream=log, clock=Clock())
    progress.step("flush")(4, 4)
    progress.step("fold")(0, 4)
    progress.step("fold")(4, 4)
    progress.close()
    assert log.getvalue().splitlines() == [
        "flush: 4 of 4 reports (100%)",
        "fold: 0 of 4 reports (0%)",
        "fold: 4 of 4 reports (100%)",
    ]


def test_a_terminal_gets_richs_bar_redrawn_in_place_one_row_per_step() -> None:
    screen, clock = Terminal(), Clock()
    with Progress("demo", "reports", stream=screen, clock=clock) as progress:
        for done in range(0, 101, 10):
            clock.now += 1
            progress(done, 100)
        progress.step("fold")(3, 4)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())  # the colours and moves
    last = text.rstrip("\n").rsplit("\r", 1)[-1].splitlines()  # the final frame
    assert len(last) == 2 and text.endswith("\n")  # two rows, ended once
    assert last[0].startswith("demo ━") and "100 of 100 reports (100%)" in last[0]
    assert last[1].startswith("fold ━") and "3 of 4 reports (75%)" in last[1]
    assert text.split("fold", 1)[0].count("\n") == 1  # one row redrawn in place until the step


def test_audit_verify_and_report_count_entries_and_devices_on_stderr(tmp_path: Path) -> None:
    """Per-entry progress (a line per tenth in a log), then the later parts; none with -q."""
    env = {
        "DPGOV_DATABASE_URL": f"sqlite:///{tmp_path / 'service.sqlite'}",
        "DPGOV_SECRET_FILE": str(tmp_path / "secret"),
        "DPGOV_AUDIT_KEY_FILE": str(tmp_path / "audit.key"),
        "DPGOV_SHUFFLER_KEY_FILE": str(tmp_path / "shuffler.key"),
        "DPGOV_CHECKPOINT_FILE": str(tmp_path / "checkpoints.jsonl"),
    }
    settings = app_settings(tmp_path, TOKEN).model_copy(
        update={"checkpoint_file": tmp_path / "checkpoints.jsonl"}
    )
    with TestClient(create_app(settings)) as client:
        items = [{"device_id": f"d{i}", "report": {"j": 1, "l": 2, "bit": 1}} for i in range(40)]
        r = client.post(
            "/v1/use-cases/safari-energy-domains/reports:batch",
            json={"items": items},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert r.json()["accepted"] == 40, r.text
        entries = client.app.state.ledger.audit.head()[0]  # type: ignore[attr-defined]
    runner = CliRunner()
    verify = runner.invoke(app, ["audit", "verify"], env=env)
    assert verify.exit_code == 0, verify.output
    assert json.loads(verify.stdout)["ok"]  # stdout stays the result
    lines = verify.stderr.splitlines()
    assert lines[0] == f"audit verify: the chain: 0 of {entries:,d} entries (0%)", lines
    assert f"audit verify: the chain: {entries:,d} of {entries:,d} entries (100%)" in lines
    assert (
        "audit verify: the inbox, the report store and the sketches against the charges..." in lines
    )
    assert re.search(r"^audit verify: the inbox, .*: \d+\.\d s$", verify.stderr, re.M)
    report = runner.invoke(app, ["audit", "report", "--json"], env=env)
    assert report.exit_code == 0, report.output
    assert json.loads(report.stdout)["use_cases"]
    lines = report.stderr.splitlines()
    assert lines[0] == "audit report: every device's spend: 0 of 40 devices (0%)", lines
    assert "audit report: every device's spend: 40 of 40 devices (100%)" in lines
    assert "audit report: the bounds of every policy..." in lines
    signed = runner.invoke(app, ["jobs", "run", "checkpoint"], env=env)
    assert signed.exit_code == 0, signed.output
    for _ in range(2):  # from the last accepted run: the entries since, then none
        again = runner.invoke(app, ["audit", "verify"], env=env)
        assert again.exit_code == 0, again.output
        result = json.loads(again.stdout)
        n = result["entries"]  # the count on stderr is the result's
        assert f"audit verify: the chain: {n:,d} of {n:,d} entries (100%)" in again.stderr
        # the verdict's line: the entries after `from_seq`, and the note, as the dashboard says
        start = result["from_seq"]
        span = (
            f"entries {start + 1:,d} to {start + n:,d}"
            if n
            else f"no new entries since the last verified checkpoint at entry {start:,d}"
            f"{REPLAY_HINT}"  # not "no entry checked": the run before checked them
        )
        line = again.stderr.splitlines()[-1]
        assert line.startswith(f"audit verify: accepted: {span}"), line
        assert line.endswith(f"; note: {result['note']}") and SEALED_COUNTED in line, line
    assert n == 0, again.stderr
    for command in (["audit", "verify", "--quiet"], ["audit", "report", "-q"]):
        quiet = runner.invoke(app, command, env=env)
        assert quiet.exit_code == 0 and quiet.stderr == "", quiet.stderr

"""``dpgov jobs``: a job's name checked before anything loads; what a flush did, said."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from dp_governor.api.app import create_app
from dp_governor.api.cli import app
from dp_governor.api.cli.jobs import JOB_NAMES
from dp_governor.api.jobs import JOBS
from tests.live import app_settings

TOKEN = "jobs-cli-admin-token-jobs-cli-admin-token"


def test_the_commands_job_names_are_the_schedulers() -> None:
    assert JOB_NAMES == tuple(JOBS)


def test_an_unknown_job_is_refused_before_the_job_modules_or_the_database_load(
    tmp_path: Path,
) -> None:
    script = (
        "import sys\n"
        "from dp_governor.api.cli import app\n"
        "try:\n"
        "    app(['jobs', sys.argv[1], 'bogus'])\n"
        "except SystemExit as exc:\n"
        "    print(exc.code, 'dp_governor.api.jobs' in sys.modules)\n"
    )
    for command in ("run", "release"):
        run = subprocess.run(
            [sys.executable, "-c", script, command],
            env={"PATH": "", "DPGOV_JOB_NICE": "not-a-number"},  # a bad value: not loaded
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert run.stdout.strip() == "2 False", run.stdout + run.stderr
        assert run.stderr.strip() == (
            "Error: unknown job 'bogus'; jobs: flush-inbox, aggregate, purge, checkpoint,"
            " dashboard, verify"
        )


def test_a_flush_that_moves_nothing_says_what_it_checked_and_left_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reports below a batch's minimum devices: checked (100%), none moved, all waiting."""
    settings = app_settings(tmp_path, TOKEN)
    with TestClient(create_app(settings)) as client:
        for i in range(4):  # Safari's batches need 1,000 distinct devices (its default policy)
            sent = client.post(
                "/v1/use-cases/safari-energy-domains/reports",
                json={"j": 1, "l": 2, "bit": 1},
                headers={"X-Device-Id": f"d{i}"},
            )
            assert sent.status_code == 202, sent.text
    for name in ("secret_file", "audit_key_file", "shuffler_key_file"):
        monkeypatch.setenv(f"DPGOV_{name.upper()}", str(getattr(settings, name)))
    monkeypatch.setenv("DPGOV_FLUSH_MIN_BATCH", "1")
    ran = CliRunner().invoke(
        app, ["jobs", "run", "flush-inbox", "--database-url", settings.database_url]
    )
    assert ran.exit_code == 0, ran.output
    assert json.loads(ran.stdout)["result"] == {"moved": 0, "waiting": 4}
    assert ran.stderr.splitlines() == [
        "jobs run flush-inbox: flush-inbox, reports checked: 4 of 4 reports (100%)"
    ]

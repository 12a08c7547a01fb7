"""``dpgov serve``: its workers see the settings its command line decided."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from dp_governor.api.server import free_port, report_start_failure
from tests.live import START, serve, server_env

REPOSITORY = Path(__file__).resolve().parents[2]


def test_every_option_overrides_its_variable_for_the_workers_too(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'chosen.sqlite'}"
    bad = {"port": "abc", "host": "", "log_format": "xml", "database_url": "nowhere://x"}
    options = ["--host", "127.0.0.1", "--log-format", "json", "--database-url", url]
    with serve(tmp_path, *options, **bad) as served:
        assert httpx.get(served.base + "/healthz").status_code == 200
    log = served.log.read_text(errors="replace")
    assert "Traceback" not in log and '"logger": "dpgov.serve"' in log, log
    assert (tmp_path / "chosen.sqlite").exists()


def refusing_app() -> None:
    """An app factory whose workers cannot start, each saying why (as a bad database would)."""
    report_start_failure("the database is gone")
    raise RuntimeError("the database is gone")


def test_a_worker_that_cannot_start_stops_the_server_with_its_reason(tmp_path: Path) -> None:
    script = (
        "import sys; from dp_governor.api.server import run_server; "
        "print(run_server('tests.api.test_serve:refusing_app', 2, host='127.0.0.1',"
        " port=int(sys.argv[1])))"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, str(free_port())],
        env=server_env(tmp_path),
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=START,
        check=False,
    )
    assert run.stdout.strip().splitlines()[-1] == "the database is gone", run.stderr
    assert "died" not in run.stderr  # stopped, not restarted

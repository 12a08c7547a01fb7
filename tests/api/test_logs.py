"""``dpgov serve`` for operators: JSON lines, a taken port refused, no WARNING for a skipped run."""

from __future__ import annotations

import inspect
import json
import logging
import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from dp_governor.api.client import Client
from dp_governor.api.logs import SkippedRun, log_config
from tests.live import ADMIN_TOKEN, START, serve, server_env

DEVICE = "device-7f3a-logs-must-not-name-me"


def test_json_logs_have_one_line_a_request_and_a_job_and_no_device_or_address(
    tmp_path: Path,
) -> None:
    with serve(tmp_path, log_format="json") as served:
        with Client(served.base) as device:
            mech = device.randomizer("emoji")
            device.submit("emoji", DEVICE, mech.privatize_one("😂"))
        own = httpx.get(
            f"{served.base}/v1/devices/{DEVICE}/budget", headers={"X-Device-Id": DEVICE}
        )
        assert own.status_code == 200
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        ran = httpx.post(f"{served.base}/v1/admin/jobs/flush-inbox:run", headers=admin, timeout=60)
        assert ran.status_code == 200
        assert httpx.head(f"{served.base}/healthz").status_code == 200
    text = served.log.read_text(encoding="utf-8")  # standard error and output: every line
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert lines and all({"time", "level", "logger", "message"} <= set(x) for x in lines)
    assert DEVICE not in text
    # the only address is the server's own, announced at start; no access log, no client
    assert not [x for x in lines if x["logger"] == "uvicorn.access"]
    assert not [
        x for x in lines if "127.0.0.1" in json.dumps(x) and "running on" not in x["message"]
    ]
    requests = [x for x in lines if x["logger"] == "dpgov.requests"]
    routes = {(x["method"], x["route"], x["status"]) for x in requests}
    assert ("POST", "/v1/use-cases/{name}/reports", 202) in routes
    assert ("GET", "/v1/devices/{device_id}/budget", 200) in routes
    assert ("HEAD", "/healthz", 200) in routes  # answered as its GET, logged as what it was
    banner = [x for x in lines if x["logger"] == "dpgov.serve"]
    assert [x["message"] for x in banner][-1].startswith("dp-governor running on http://")
    assert {"secret_source", "audit_key_source", "shuffler_key_source"} <= set(banner[0])
    assert all(isinstance(x["duration_ms"], float | int) for x in requests)
    jobs = [x for x in lines if x.get("job") == "flush-inbox"]
    assert jobs and jobs[-1]["outcome"] == "done" and "duration_ms" in jobs[-1]


def test_serve_refuses_a_port_in_use_before_its_banner(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        run = subprocess.run(
            [sys.executable, "-m", "dp_governor.api.cli", "serve", "--port", str(port)],
            env=server_env(tmp_path),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=START,
            check=False,
        )
    assert run.returncode == 1 and run.stdout == ""  # no banner, no key files announced
    assert run.stderr.strip() == (
        f"Error: cannot serve: 127.0.0.1:{port} is in use by another process"
        " (--host, --port: DPGOV_HOST, DPGOV_PORT)"
    )
    assert not list(tmp_path.glob("*.sqlite")), "a database was made where nothing can serve"


def test_a_skipped_run_is_a_debug_line_of_dpgov_and_apschedulers_errors_stay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The serve config filters apscheduler's warning for a run skipped while one is under way."""
    from apscheduler.schedulers import base

    source = re.sub(r"""['"]\s+['"]""", "", inspect.getsource(base))  # its strings joined
    assert SkippedRun.MESSAGE in source  # the words apscheduler logs
    assert log_config("text")["loggers"]["apscheduler.scheduler"]["filters"] == ["skipped_run"]
    skipped = logging.LogRecord(
        "apscheduler.scheduler",
        logging.WARNING,
        __file__,
        1,
        'Execution of job "%s" skipped: maximum number of running instances reached (%d)',
        ("checkpoint", 1),
        None,
    )
    with caplog.at_level(logging.DEBUG, logger="dpgov.jobs"):
        assert not SkippedRun().filter(skipped)
    assert [(r.name, r.levelno) for r in caplog.records] == [("dpgov.jobs", logging.DEBUG)]
    assert caplog.records[0].getMessage().startswith('Execution of job "checkpoint" skipped')
    failed = logging.LogRecord(
        "apscheduler.scheduler", logging.ERROR, __file__, 1, "Job raised", (), None
    )
    assert SkippedRun().filter(failed)

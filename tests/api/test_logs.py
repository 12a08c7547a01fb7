"""``--log-format json`` over a real server: every line is JSON, naming no device and no client."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from dp_governor.api.client import Client
from tests.live import ADMIN_TOKEN, serve

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
    text = served.log.read_text(encoding="utf-8")
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
    assert all(isinstance(x["duration_ms"], float | int) for x in requests)
    jobs = [x for x in lines if x.get("job") == "flush-inbox"]
    assert jobs and jobs[-1]["outcome"] == "done" and "duration_ms" in jobs[-1]

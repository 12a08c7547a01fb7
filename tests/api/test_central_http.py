"""Over HTTP, a real server: a batch below ``min_batch_devices`` publishes nothing until complete.

Then its sizes and central epsilon appear in the effective-epsilon report, the device audit
and the dashboard.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np

from dp_governor.budget.privacy.amplification import shuffle_epsilon
from dp_governor.policies import PolicyCreate, mechanism_for
from tests.live import ADMIN_TOKEN, serve

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
POLICY: dict[str, Any] = {
    "mechanism": "cms",
    "k": 16,
    "m": 64,
    "epsilon_per_report": 1.0,
    "max_reports_per_day": 1,
    "retention_days": 30,
    "min_batch_devices": 3000,
}


def _relay(client: httpx.Client, devices: range) -> None:
    mech = mechanism_for(PolicyCreate.model_validate({"name": "held", **POLICY}))
    bodies = mech.privatize(["a"] * len(devices), rng=np.random.default_rng(devices.start))
    for start in range(0, len(devices), 1000):
        items = [
            {"device_id": f"device-{d}", "report": body}
            for d, body in zip(
                devices[start : start + 1000], bodies.to_dicts()[start : start + 1000], strict=True
            )
        ]
        r = client.post("/v1/use-cases/held/reports:batch", json={"items": items}, headers=ADMIN)
        assert r.status_code == 200, r.text
        assert r.json()["accepted"] == len(items), r.text[:300]


def _flush(client: httpx.Client) -> int:
    r = client.post("/v1/admin/jobs/flush-inbox:run", headers=ADMIN)
    assert r.status_code == 200, r.text
    return int(r.json()["result"]["moved"])


def test_held_batch_publishes_when_complete_then_reports_central_epsilon(tmp_path: Path) -> None:
    with (
        serve(tmp_path, flush_min_batch="1", report_cache_seconds="0") as served,
        httpx.Client(base_url=served.base, timeout=300) as client,
    ):
        r = client.put("/v1/use-cases/held", json=POLICY, headers=ADMIN)
        assert r.status_code in (200, 201), r.text
        assert r.json()["min_batch_devices"] == 3000
        bad = client.put(
            "/v1/use-cases/held", json={**POLICY, "min_batch_devices": 0}, headers=ADMIN
        )
        assert bad.status_code == 422 and "min_batch_devices" in bad.text

        _relay(client, range(2000))
        assert _flush(client) == 0
        report = client.get("/v1/audit/effective-epsilon").json()
        assert [line["use_case"] for line in report["central"]] == []
        assert _flush(client) == 0  # still short: the tail waits, never published short

        _relay(client, range(2000, 3000))
        assert _flush(client) == 3000
        # the public figures are the dashboard job's: its next run shows the batch
        job = client.post("/v1/admin/jobs/dashboard:run", headers=ADMIN)
        assert job.status_code == 200, job.text
        report = client.get("/v1/audit/effective-epsilon").json()
        (line,) = report["central"]
        assert line["use_case"] == "held" and line["min_batch_devices"] == 3000
        (day,) = line["days"]
        (batch,) = day["batches"]
        assert (batch["devices"], batch["reports"], batch["max_per_device"]) == (3000, 3000, 1)
        assert batch["epsilon_per_report"] == 1.0
        expected = shuffle_epsilon(1.0, 3000, 1e-9).epsilon
        central = batch["central"]
        assert central["delta"] == 1e-9
        assert expected <= central["epsilon"] < 1.05 * expected < 1.0  # grid rounds n down
        assert line["window"]["epsilon"] == day["composed"]["epsilon"] == central["epsilon"]
        assert "PLD" in line["window"]["method"] or "FMT21" in line["window"]["method"]
        assert "honest" in line["preconditions"]

        audit = client.get("/v1/audit/devices/device-7", headers={"X-Device-Id": "device-7"})
        assert audit.status_code == 200, audit.text
        (mine,) = audit.json()["central"]
        assert mine["use_case"] == "held" and mine["window"]["reports_per_device"] == 1

        page = client.get("/")
        assert page.status_code == 200
        assert 'id="central"' in page.text and "3000 / 3000 / 1" in page.text

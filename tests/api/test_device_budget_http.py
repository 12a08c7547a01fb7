"""Over real HTTP: the device-wide budget refuses with its name, and the device view shows it first.

A real ``dpgov serve`` on a SQLite file; the device-wide budget is written into the same file
through the library while the server runs (the gate re-reads the book when its revision moves).
"""

from __future__ import annotations

from pathlib import Path

import httpx

from dp_governor.budget import create_db_engine
from dp_governor.policies.device import DeviceBudgetCreate, write_device_budget
from tests.api.test_truth_http import AUDIT_KEY, SECRET, T, _report, _submit
from tests.live import ADMIN_TOKEN, serve

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def test_a_device_wide_refusal_names_its_budget(tmp_path: Path) -> None:
    with serve(tmp_path, device_key_secret=SECRET, audit_key=AUDIT_KEY) as served:
        base = served.base
        eps = httpx.get(f"{base}/v1/use-cases/emoji", timeout=T).json()["epsilon_per_report"]
        assert (
            httpx.get(f"{base}/v1/use-cases/lookup-hints", timeout=T).json()["max_reports_per_day"]
            >= 2
        )
        engine = create_db_engine(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
        try:
            write_device_budget(
                engine, DeviceBudgetCreate(epsilon_per_day=eps, lifetime_epsilon=100 * eps)
            )
        finally:
            engine.dispose()
        assert _submit(base, "phone", "emoji") == 202
        # lookup-hints allows 2 reports a day; the device-wide day is spent
        response = httpx.post(
            f"{base}/v1/use-cases/lookup-hints/reports",
            json=_report(base, "lookup-hints"),
            headers={"X-Device-Id": "phone"},
            timeout=T,
        )
        assert response.status_code == 429
        body = response.json()
        assert body["refused_by"] == "device" and body["reason"] == "daily_cap"
        assert response.headers["X-Refused-By"] == "device"
        assert "device-wide budget" in body["detail"]
        assert int(response.headers["Retry-After"]) >= 1
        view = httpx.get(f"{base}/v1/devices/phone/budget", headers=ADMIN, timeout=T).json()
        assert list(view)[:2] == ["device_id", "device"] and view["odometer"]["reports"] == 1
        device = view["device"]
        assert device["epsilon_today"] == eps and device["today_remaining"] == 0.0
        assert device["lifetime_remaining"] == 99 * eps
        # public, as the policies are: a device plans by the limits it draws from
        versions = httpx.get(f"{base}/v1/device-budget", timeout=T).json()
        assert [v["version"] for v in versions] == [1]
        assert versions[0]["epsilon_per_day"] == eps and versions[0]["quotas"] == {}

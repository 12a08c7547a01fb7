"""Over real HTTP: the policy edits after which the service once enforced or showed false figures.

A real ``dpgov serve`` on a SQLite file; history older than today is written into the same file
beforehand through the library (the server keeps the wall clock), with the server's secrets.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from dp_governor.budget import Ledger, create_db_engine, init_db
from dp_governor.budget.storage.db import key_fingerprint, record_fingerprints
from dp_governor.policies import PolicyCreate, mechanism_for
from tests.live import ADMIN_TOKEN, serve

SECRET = "truth-device-secret-truth-device-secret-0123"
AUDIT_KEY = "truth-audit-key-truth-audit-key-truth-audit-0123"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
T = 120.0  # a busy machine computes the first report slowly; no test depends on speed


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path


def _ledger(folder: Path) -> Ledger:
    engine = create_db_engine(f"sqlite:///{folder / 'ledger.sqlite'}")
    init_db(engine)
    keys = {"device_key_secret": SECRET.encode(), "audit_key": AUDIT_KEY.encode()}
    # as a new database's first start records them: the server then adopts no secret unchecked
    record_fingerprints(engine, {f"fingerprint.{k}": key_fingerprint(v) for k, v in keys.items()})
    ledger = Ledger(engine, SECRET.encode(), audit_key=AUDIT_KEY.encode())
    ledger.policies.ensure_defaults()
    return ledger


@pytest.fixture
def server(folder: Path) -> Iterator[str]:
    with serve(folder, device_key_secret=SECRET, audit_key=AUDIT_KEY) as served:
        yield served.base


def _report(base: str, use_case: str) -> dict[str, Any]:
    policy = httpx.get(f"{base}/v1/use-cases/{use_case}", timeout=T).json()
    fields = {k: policy[k] for k in PolicyCreate.model_fields if k in policy}
    return mechanism_for(PolicyCreate.model_validate(fields)).privatize_one("x").to_dict()


def _submit(base: str, device: str, use_case: str) -> int:
    response = httpx.post(
        f"{base}/v1/use-cases/{use_case}/reports",
        json=_report(base, use_case),
        headers={"X-Device-Id": device},
        timeout=T,
    )
    return response.status_code


def _put(base: str, use_case: str, *, loosen: bool = False, **changes: Any) -> None:
    policy = httpx.get(f"{base}/v1/use-cases/{use_case}", timeout=T).json()
    body = {k: policy[k] for k in PolicyCreate.model_fields if k in policy} | changes
    params = {"allow_loosen": "true"} if loosen else {}
    response = httpx.put(
        f"{base}/v1/use-cases/{use_case}", json=body, params=params, headers=ADMIN, timeout=T
    )
    assert response.status_code == 200, response.text


def _budget(base: str, device: str, use_case: str) -> dict[str, Any]:
    found = httpx.get(f"{base}/v1/devices/{device}/budget", headers=ADMIN, timeout=T).json()
    return next(u for u in found["use_cases"] if u["use_case"] == use_case)


def test_a_group_move_resets_no_cap(server: str) -> None:
    _put(server, "emoji", lifetime_epsilon_cap=4.0)
    assert _submit(server, "dev", "emoji") == 202
    assert _submit(server, "dev", "emoji") == 429
    _put(server, "emoji", budget_group="keyboard")
    assert _submit(server, "dev", "emoji") == 429
    emoji = _budget(server, "dev", "emoji")
    assert emoji["budget"] == "keyboard"
    assert emoji["epsilon_lifetime"] == 4.0 and emoji["lifetime_remaining"] == 0.0
    report = httpx.get(f"{server}/v1/audit/effective-epsilon", headers=ADMIN, timeout=T).json()
    line = next(u for u in report["use_cases"] if u["use_case"] == "emoji")
    assert line["spent_lifetime"]["max"] == 4.0 and "at 4" in line["lifetime_note"]


def test_group_size_edits_are_not_retroactive(server: str) -> None:
    _put(server, "emoji", group_size=5)
    assert _submit(server, "dev", "emoji") == 202
    _put(server, "emoji", group_size=1, loosen=True)
    audit = httpx.get(f"{server}/v1/audit/devices/dev", headers=ADMIN, timeout=T).json()
    assert audit["loss"]["lifetime"]["emoji"]["epsilon_basic"] == 20.0


def test_retiring_a_use_case_keeps_the_population_figures(server: str) -> None:
    for device in ("a", "b"):
        assert _submit(server, device, "quicktype") == 202
    report = f"{server}/v1/audit/effective-epsilon"
    before = httpx.get(report, headers=ADMIN, timeout=T).json()["totals"]
    gone = httpx.delete(f"{server}/v1/use-cases/quicktype", headers=ADMIN, timeout=T)
    assert gone.status_code == 200
    after = httpx.get(report, headers=ADMIN, timeout=T).json()["totals"]
    assert after["spent_lifetime"] == before["spent_lifetime"]
    assert after["spent_lifetime"]["max"] == 8.0


def test_lowering_then_raising_retention_keeps_the_true_window(folder: Path) -> None:
    ledger = _ledger(folder)
    now = datetime.now(UTC)
    for back in range(89, 0, -1):  # 89 earlier days of lookup-hints, 2 a day, in date order
        for _ in range(2):
            assert ledger.charge("dev", "lookup-hints", now=now - timedelta(days=back)).accepted
    ledger.engine.dispose()
    with serve(folder, device_key_secret=SECRET, audit_key=AUDIT_KEY) as (base, _, _):
        assert _budget(base, "dev", "lookup-hints")["epsilon_window"] == 712.0
        _put(base, "lookup-hints", retention_days=30)
        run = httpx.post(f"{base}/v1/admin/jobs/purge:run", headers=ADMIN, timeout=T)
        assert run.status_code == 200, run.text
        assert _budget(base, "dev", "lookup-hints")["epsilon_window"] == 29 * 8.0
        _put(base, "lookup-hints", retention_days=90)
        assert _budget(base, "dev", "lookup-hints")["epsilon_window"] == 712.0

"""Hostile-client regressions, on SQLite and PostgreSQL.

Admin credentials, the dashboard's estimates, metric labels, the device limiter's table,
duplicated headers and undecodable JSON.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr, ValidationError
from sqlalchemy import text

from dp_governor.api.app import create_app
from dp_governor.api.settings import Settings
from dp_governor.budget import FixedClock
from dp_governor.budget.storage.db import scratch_schema
from dp_governor.mechanisms import HCMS
from dp_governor.policies import PolicyCreate, mechanism_for
from tests.conftest import BACKENDS

TOKEN = "security-admin-token-security-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
SAFARI = "/v1/use-cases/safari-energy-domains/reports"
Make = Callable[..., TestClient]


@pytest.fixture(params=BACKENDS)
def make_client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Make]:
    """Start the app on a fresh database of the backend with these setting overrides."""
    with ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / 'security.sqlite'}"
        else:
            pg = os.environ["DPGOV_TEST_DATABASE_URL"]
            url = stack.enter_context(scratch_schema(pg, "security"))

        def make(**overrides: Any) -> TestClient:
            values: dict[str, Any] = {
                "database_url": url,
                "secret_file": tmp_path / "secret",
                "audit_key_file": tmp_path / "audit.key",
                "admin_token": SecretStr(TOKEN),
                "scheduler": False,
                **overrides,
            }
            app = create_app(Settings(**values), clock=FixedClock(NOW))
            return stack.enter_context(TestClient(app))

        yield make


def count(client: TestClient, table: str) -> int:
    ledger = client.app.state.ledger  # type: ignore[attr-defined]
    with ledger.engine.connect() as conn:
        return int(conn.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar_one())


def safari(client: TestClient) -> HCMS:
    body = client.get("/v1/use-cases/safari-energy-domains").json()
    fields = {k: v for k, v in body.items() if k in PolicyCreate.model_fields}
    mech = mechanism_for(PolicyCreate.model_validate(fields))
    assert isinstance(mech, HCMS)
    return mech


# -- the admin token ------------------------------------------------------------------------------


@pytest.mark.parametrize("token", ["", " ", "x", "y" * 31])
def test_settings_refuse_an_empty_or_short_admin_token(
    token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValidationError, match="admin_token") as caught:
        Settings(admin_token=SecretStr(token))
    assert "at least 32 characters" in str(caught.value)
    monkeypatch.setenv("DPGOV_ADMIN_TOKEN", token)  # `DPGOV_ADMIN_TOKEN=` in an env file
    with pytest.raises(ValidationError, match="admin_token"):
        Settings()
    assert Settings(admin_token=SecretStr("z" * 32)).admin_token is not None


@pytest.mark.parametrize(
    "token",
    [" " * 40, "\t" * 40, " " + "a" * 40, "a" * 40 + " ", "a" * 20 + "\n" + "a" * 20, "é" * 40],
)
def test_settings_refuse_an_admin_token_no_request_could_carry(token: str) -> None:
    """A token a header cannot carry would pass the length check and never match.

    Whitespace at either end is stripped from the header; control and non-ASCII characters do
    not survive it unchanged.
    """
    with pytest.raises(ValidationError, match="admin_token") as caught:
        Settings(admin_token=SecretStr(token))
    assert "printable ASCII" in str(caught.value)
    inner = "correct horse battery staple, twice: correct horse"  # inner spaces are carried
    assert Settings(admin_token=SecretStr(inner)).admin_token is not None


def test_a_non_string_device_id_in_a_relay_batch_is_422_under_min_batch_devices(
    make_client: Make,
) -> None:
    """The inbox pseudonym (counted for ``min_batch_devices``) never sees an unchecked id."""
    client = make_client()
    policy = {
        "mechanism": "cms",
        "k": 16,
        "m": 64,
        "epsilon_per_report": 1.0,
        "max_reports_per_day": 5,
        "min_batch_devices": 2,
    }
    assert client.put("/v1/use-cases/counted", json=policy, headers=ADMIN).status_code in (200, 201)
    mech = mechanism_for(PolicyCreate.model_validate({"name": "counted", **policy}))
    body = mech.privatize(["a"], rng=np.random.default_rng(1)).to_dicts()[0]
    bad_ids: list[Any] = [7, None, ["d"], {"d": 1}, 1.5]
    items: list[dict[str, Any]] = [{"device_id": bad, "report": body} for bad in bad_ids]
    items.append({"device_id": "fine", "report": body})
    r = client.post("/v1/use-cases/counted/reports:batch", json={"items": items}, headers=ADMIN)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["status"] for x in results] == [422] * 5 + [202], results
    assert all(x["field"] == f"items[{i}].device_id" for i, x in enumerate(results[:5]))
    assert count(client, "inbox") == 1


ADMIN_ROUTES: list[tuple[str, str, Any]] = [
    ("PUT", "/v1/use-cases/emoji", {}),
    ("DELETE", "/v1/use-cases/emoji", None),
    ("POST", "/v1/use-cases/emoji/reports:batch", {"items": []}),
    ("GET", "/v1/use-cases/emoji/estimates?candidates=a", None),
    ("POST", "/v1/use-cases/emoji/estimates:query", {"candidates": ["a"]}),
    ("GET", "/v1/use-cases/quicktype/discoveries", None),
    ("GET", "/v1/audit/verify", None),
    ("POST", "/v1/use-cases/emoji/what-if", {}),
    ("POST", "/v1/admin/jobs/purge:run", None),
    ("GET", "/v1/devices/someone/budget", None),
    ("GET", "/v1/audit/devices/someone", None),
    ("GET", "/?estimate=emoji&candidates=a", None),
]


def _call(client: TestClient, method: str, path: str, body: Any, headers: Any) -> int:
    return int(client.request(method, path, json=body, headers=headers).status_code)


@pytest.mark.parametrize("authorization", ["Bearer", "Bearer ", "Bearer    ", "bearer"])
def test_a_bearer_without_a_token_is_401_on_every_admin_route(
    make_client: Make, authorization: str
) -> None:
    client = make_client()
    for method, path, body in ADMIN_ROUTES:
        status = _call(client, method, path, body, {"Authorization": authorization})
        assert status == 401, (method, path, status)
    assert client.get("/?estimate=emoji&candidates=a", headers=ADMIN).status_code == 200


def test_without_an_admin_token_every_admin_route_refuses_and_start_warns(
    make_client: Make, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="dpgov.api"):
        client = make_client(admin_token=None)
    assert any("DPGOV_ADMIN_TOKEN" in r.getMessage() for r in caplog.records)
    for authorization in ["Bearer ", "Bearer x", f"Bearer {TOKEN}", "Basic abc"]:
        for method, path, body in ADMIN_ROUTES:
            status = _call(client, method, path, body, {"Authorization": authorization})
            assert status in (401, 403), (authorization, method, path, status)
    refused = client.get("/v1/audit/verify", headers=ADMIN).json()["detail"]
    assert "DPGOV_ADMIN_TOKEN" in refused


@pytest.mark.parametrize("path", ["/v1/devices/me/budget", "/v1/audit/devices/me"])
def test_the_device_routes_count_bad_admin_tokens_like_every_admin_check(
    make_client: Make, path: str
) -> None:
    client = make_client(admin_failures_per_minute=3)
    guess = {"Authorization": "Bearer " + "g" * 40, "X-Device-Id": "me"}
    codes = [client.get(path, headers=guess).status_code for _ in range(6)]
    assert codes == [403, 403, 403, 429, 429, 429]
    limited = client.get(path, headers=ADMIN)  # the right token waits out the limit too
    assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1
    assert client.put("/v1/use-cases/emoji", json={}, headers=ADMIN).status_code == 429
    assert client.get(path, headers={"X-Device-Id": "me"}).status_code == 200  # no token


def test_the_admin_failure_limiter_counts_per_worker_as_documented(make_client: Make) -> None:
    """Two workers over one database: each counts the failures it saw (docs/operations.md)."""
    first = make_client(admin_failures_per_minute=2)
    second = make_client(admin_failures_per_minute=2)
    guess = {"Authorization": "Bearer " + "g" * 40}
    assert [first.get("/v1/audit/verify", headers=guess).status_code for _ in range(3)] == [
        403,
        403,
        429,
    ]
    assert second.get("/v1/audit/verify", headers=guess).status_code == 403
    assert second.get("/v1/audit/verify", headers=ADMIN).status_code == 200
    operations = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    assert "**per client address and per worker**" in operations


# -- the dashboard --------------------------------------------------------------------------------


def test_the_dashboard_shows_estimates_to_admins_only(make_client: Make) -> None:
    client = make_client()
    mech = safari(client)
    values = ["popular.example"] * 400 + ["rare.example"] * 100
    reports = mech.privatize(values, rng=np.random.default_rng(11)).to_dicts()
    items = [{"device_id": f"dev-{i}", "report": r} for i, r in enumerate(reports)]
    batch = client.post(
        "/v1/use-cases/safari-energy-domains/reports:batch", json={"items": items}, headers=ADMIN
    )
    assert batch.status_code == 200 and batch.json()["accepted"] == 500
    assert client.post("/v1/admin/jobs/aggregate:run", headers=ADMIN).status_code == 200
    query = "/?estimate=safari-energy-domains&candidates=popular.example"
    estimates = "/v1/use-cases/safari-energy-domains/estimates?candidates=popular.example"
    assert client.get(estimates).status_code == 401
    refused = client.get(query)
    assert refused.status_code == 401 and "admin token" in refused.json()["detail"]
    assert client.get("/?candidates=popular.example").status_code == 401
    public = client.get("/")
    assert public.status_code == 200 and "popular.example" not in public.text
    assert ": discovered words" not in public.text and 'id="effective-epsilon"' in public.text
    assert client.get("/?anything=else").text == public.text  # one cached page
    shown = client.get(query, headers=ADMIN)
    assert shown.status_code == 200 and "popular.example" in shown.text
    assert client.get("/?estimate=nope&candidates=a", headers=ADMIN).status_code == 404


# -- metric labels and the device limiter ---------------------------------------------------------


def _series(client: TestClient, metric: str) -> set[str]:
    text_ = client.get("/metrics").text
    return {line.split(" ")[0] for line in text_.splitlines() if line.startswith(metric + "{")}


def test_unknown_use_cases_reach_neither_the_metrics_nor_the_device_limiter(
    make_client: Make,
) -> None:
    client = make_client(device_rate_per_minute=1)
    body = safari(client).privatize_one("a.example").to_dict()
    assert client.post(SAFARI, json=body, headers={"X-Device-Id": "flood"}).status_code == 202
    assert client.post(SAFARI, json=body, headers={"X-Device-Id": "flood"}).status_code == 429
    before = _series(client, "dpgov_reports_total")
    rng = np.random.default_rng(5)
    for i in range(300):
        name = f"uc-{rng.integers(1 << 60):x}"
        device = "flood" if i % 2 else f"rotating-{i}"
        for content_type in ("application/json", "application/x-report+json"):
            r = client.post(
                f"/v1/use-cases/{name}/reports",
                content=json.dumps(body),
                headers={"X-Device-Id": device, "Content-Type": content_type},
            )
            assert r.status_code == 404, r.text
    for method in ("BREW", "PROPFIND", "X-RANDOM-1", "X-RANDOM-2"):
        assert client.request(method, "/healthz").status_code in (400, 405)
    unknown = 'dpgov_reports_total{outcome="unknown_use_case",use_case="unknown"}'
    assert _series(client, "dpgov_reports_total") == before | {unknown}
    assert f"{unknown} 600.0" in client.get("/metrics").text
    methods = set(re.findall(r'method="([^"]+)"', client.get("/metrics").text))
    assert methods <= {"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "other"}
    assert len(client.app.state.device_limit) == 1  # type: ignore[attr-defined]


def test_the_device_limiter_forgets_rather_than_grows(make_client: Make) -> None:
    client = make_client(rate_limit_keys=20)
    body = safari(client).privatize_one("a.example").to_dict()
    for i in range(120):
        r = client.post(SAFARI, json=body, headers={"X-Device-Id": f"rotating-{i}"})
        assert r.status_code == 202
    assert len(client.app.state.device_limit) == 20  # type: ignore[attr-defined]
    assert count(client, "charges") == 120  # the budget caps never depend on the limiter


# -- headers and bodies ---------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["application/json", "application/x-report+json"])
@pytest.mark.parametrize("header", ["X-Device-Id", "Idempotency-Key"])
def test_a_repeated_device_or_idempotency_header_is_400_everywhere(
    make_client: Make, content_type: str, header: str
) -> None:
    client = make_client()
    body = json.dumps(safari(client).privatize_one("a.example").to_dict())
    headers = [("X-Device-Id", "first"), ("Content-Type", content_type)]
    headers += [(header, "one"), (header, "two")]
    r = client.post(SAFARI, content=body, headers=headers)
    assert r.status_code == 400, r.text
    assert r.json() == {"detail": f"`{header}` is sent more than once", "field": header}
    assert count(client, "charges") == 0
    for path in ("/v1/devices/first/budget", "/v1/audit/devices/first"):
        assert client.get(path, headers=[(header, "first"), (header, "x")]).status_code == 400


BAD_JSON = {
    "1,000 deep": b"[" * 1000 + b"]" * 1000,
    "5,000 deep": b"[" * 5000 + b"]" * 5000,
    "deep in a field": b'{"j": ' + b"[" * 900 + b"]" * 900 + b', "l": 2, "bit": 1}',
    "20 deep in a field": b'{"j": ' + b"[" * 20 + b"]" * 20 + b', "l": 2, "bit": 1}',
    "lone surrogate": b'"\\ud800"',
    "lone surrogate value": b'{"j": 1, "l": 2, "bit": "\\ud800"}',
    "lone surrogate key": b'{"\\udc00": 1, "j": 1, "l": 2, "bit": 1}',
    "lone surrogate in bits": b'{"j": 1, "bits": "AA\\ud800"}',
}


@pytest.mark.parametrize("name", sorted(BAD_JSON))
@pytest.mark.parametrize("use_case", ["safari-energy-domains", "emoji"])
def test_undecodable_json_is_422_naming_the_body(
    make_client: Make, name: str, use_case: str
) -> None:
    client = make_client()
    for content_type in ("application/json", "application/x-report+json"):
        r = client.post(
            f"/v1/use-cases/{use_case}/reports",
            content=BAD_JSON[name],
            headers={"X-Device-Id": "d", "Content-Type": content_type},
        )
        assert r.status_code == 422, (content_type, r.text)
        (error,) = r.json()["detail"]
        assert error["field"] == "body"
        assert "nests deeper" in error["msg"] or "lone surrogate" in error["msg"]
    assert count(client, "charges") == 0

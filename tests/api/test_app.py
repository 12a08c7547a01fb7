"""Every route through FastAPI's TestClient: answers, auth matrix, bad inputs, atomicity."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import text

from dp_governor.api.app import create_app
from dp_governor.api.jobs import lease_of
from dp_governor.api.leases import acquire_lease
from dp_governor.api.settings import Settings
from dp_governor.budget import FixedClock
from dp_governor.mechanisms import CMS, HCMS, SFP, SfpSketch, from_published
from dp_governor.policies import PolicyCreate, mechanism_for
from dp_governor.policies.model import default_hash_seed

# a few devices publish: the pipeline here, not the defaults' batch minimums
pytestmark = pytest.mark.usefixtures("small_batches")

ADMIN = {"Authorization": "Bearer admin-secret-token-admin-secret-token"}
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'service.sqlite'}",
        secret_file=tmp_path / "secret",
        audit_key_file=tmp_path / "audit.key",
        admin_token=SecretStr("admin-secret-token-admin-secret-token"),
        scheduler=False,
        max_body_bytes=64 * 1024,
        max_batch_items=100,
        flush_min_batch=1,  # these tests read estimates of a few reports at once
    )
    with TestClient(create_app(settings, clock=FixedClock(NOW))) as c:
        yield c


def mech(client: TestClient, name: str) -> CMS | HCMS | SFP:
    body = client.get(f"/v1/use-cases/{name}").json()
    fields = {k: v for k, v in body.items() if k in PolicyCreate.model_fields}
    return mechanism_for(PolicyCreate.model_validate(fields))


def count(client: TestClient, table: str) -> int:
    ledger = client.app.state.ledger  # type: ignore[attr-defined]
    with ledger.engine.connect() as conn:
        return int(conn.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar_one())


def test_defaults_are_served(client: TestClient) -> None:
    names = [p["name"] for p in client.get("/v1/use-cases").json()]
    assert names == sorted(
        [
            "emoji",
            "health-types",
            "lookup-hints",
            "quicktype",
            "safari-autoplay",
            "safari-crash-domains",
            "safari-energy-domains",
        ]
    )
    emoji = client.get("/v1/use-cases/emoji").json()
    assert emoji["epsilon_per_day"] == 4.0 and emoji["version"] == 1
    assert client.get("/healthz").json() == {"status": "ok"}


@pytest.mark.parametrize("use_case", ["emoji", "safari-energy-domains", "quicktype"])
def test_submit_each_mechanism_and_hit_the_cap(client: TestClient, use_case: str) -> None:
    m = mech(client, use_case)
    body = m.privatize_one("value").to_dict()
    cap = client.get(f"/v1/use-cases/{use_case}").json()["max_reports_per_day"]
    for _ in range(cap):
        r = client.post(
            f"/v1/use-cases/{use_case}/reports", json=body, headers={"X-Device-Id": "d"}
        )
        assert r.status_code == 202, r.text
        assert set(r.json()) == {
            "receipt",
            "use_case",
            "policy_version",
            "epsilon",
            "day",
            "reports_left_today",
            "replayed",
        }
    refused = client.post(
        f"/v1/use-cases/{use_case}/reports", json=body, headers={"X-Device-Id": "d"}
    )
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == str(12 * 3600)
    assert refused.json()["reason"] == "daily_cap"
    assert count(client, "charges") == cap and count(client, "inbox") == cap


def test_idempotency_key(client: TestClient) -> None:
    body = mech(client, "emoji").privatize_one("😂").to_dict()
    h = {"X-Device-Id": "d", "Idempotency-Key": "once"}
    first = client.post("/v1/use-cases/emoji/reports", json=body, headers=h)
    again = client.post("/v1/use-cases/emoji/reports", json=body, headers=h)
    assert first.status_code == again.status_code == 202
    assert again.json()["replayed"] and again.json()["receipt"] == first.json()["receipt"]
    other = mech(client, "emoji").privatize_one("❤").to_dict()
    conflict = client.post("/v1/use-cases/emoji/reports", json=other, headers=h)
    assert conflict.status_code == 409
    assert count(client, "charges") == 1 and count(client, "inbox") == 1


@pytest.mark.parametrize("key", ["", "k" * 256])
def test_an_empty_or_overlong_idempotency_key_is_422(client: TestClient, key: str) -> None:
    body = mech(client, "emoji").privatize_one("😂").to_dict()
    h = {"X-Device-Id": "d", "Idempotency-Key": key}
    refused = client.post("/v1/use-cases/emoji/reports", json=body, headers=h)
    assert refused.status_code == 422 and "Idempotency-Key" in refused.text
    assert count(client, "charges") == 0 and count(client, "inbox") == 0


GOOD_HCMS = {"j": 1, "l": 2, "bit": 1}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"j": 1024, "l": 0, "bit": 1}, "j"),
        ({"j": -1, "l": 0, "bit": 1}, "j"),
        ({"j": 1, "l": 32768, "bit": 1}, "l"),
        ({"j": 1, "l": 0, "bit": 0}, "bit"),
        ({"j": 1, "l": 0, "bit": True}, "bit"),
        ({"j": "1", "l": 0, "bit": 1}, "j"),
        ({"j": 1.5, "l": 0, "bit": 1}, "j"),
        ({**GOOD_HCMS, "epsilon": 0.1}, "epsilon"),
        ({**GOOD_HCMS, "k": 1}, "k"),
        ({"l": 0, "bit": 1}, "j"),
        ([1, 2, 3], "report"),
        ("text", "report"),
    ],
)
def test_bad_hcms_bodies_are_422_naming_the_field(
    client: TestClient, body: Any, field: str
) -> None:
    r = client.post(
        "/v1/use-cases/safari-energy-domains/reports", json=body, headers={"X-Device-Id": "d"}
    )
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == field
    assert count(client, "charges") == 0 and count(client, "inbox") == 0


@pytest.mark.parametrize(
    "raw",
    [
        b'{"j": NaN, "l": 0, "bit": 1}',
        b'{"j": Infinity, "l": 0, "bit": 1}',
        b'{"j": -Infinity, "l": 0, "bit": 1}',
        b'{"j": 1e309, "l": 0, "bit": 1}',
        b'{"j": 1, "l": 0, "bit": 1',
        b"",
    ],
)
def test_malformed_and_non_finite_json_is_4xx_never_5xx(client: TestClient, raw: bytes) -> None:
    r = client.post(
        "/v1/use-cases/safari-energy-domains/reports",
        content=raw,
        headers={"X-Device-Id": "d", "Content-Type": "application/json"},
    )
    assert 400 <= r.status_code < 500, r.text
    json.loads(r.text)  # the error body is valid JSON (no bare NaN)
    assert count(client, "charges") == 0


def test_cms_vector_length_and_sfp_position(client: TestClient) -> None:
    short = {"j": 0, "bits": base64.b64encode(b"\x00" * 127).decode()}
    r = client.post("/v1/use-cases/emoji/reports", json=short, headers={"X-Device-Id": "d"})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "bits"
    good = mech(client, "quicktype").privatize_one("bruh").to_dict()
    r = client.post(
        "/v1/use-cases/quicktype/reports",
        json={**good, "position": 3},
        headers={"X-Device-Id": "d"},
    )
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "position"


def test_headers_and_unknown_use_case(client: TestClient) -> None:
    missing = client.post("/v1/use-cases/emoji/reports", json=GOOD_HCMS)
    assert missing.status_code == 422 and "X-Device-Id" in missing.text
    unknown = client.post(
        "/v1/use-cases/nope/reports", json=GOOD_HCMS, headers={"X-Device-Id": "d"}
    )
    assert unknown.status_code == 404
    bad_name = client.post(
        "/v1/use-cases/NOPE!/reports", json=GOOD_HCMS, headers={"X-Device-Id": "d"}
    )
    assert bad_name.status_code == 422


def test_oversized_bodies_are_413(client: TestClient) -> None:
    big = b"x" * (10 * 1024 * 1024)
    r = client.post("/v1/use-cases/emoji/reports", content=big, headers={"X-Device-Id": "d"})
    assert r.status_code == 413

    def chunks() -> Iterator[bytes]:
        for _ in range(100):
            yield b"y" * 4096

    r = client.post("/v1/use-cases/emoji/reports", content=chunks(), headers={"X-Device-Id": "d"})
    assert r.status_code == 413
    assert count(client, "charges") == 0


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 403),
        ({"Authorization": "Basic admin-secret-token-admin-secret-token"}, 403),
        ({"X-Device-Id": "d"}, 401),
        (ADMIN, 200),
    ],
)
def test_admin_auth_matrix(client: TestClient, headers: dict[str, str], status: int) -> None:
    body = client.get("/v1/use-cases/emoji").json()
    policy = {k: v for k, v in body.items() if k in PolicyCreate.model_fields}
    policy["max_reports_per_day"] = 3
    r = client.put(
        "/v1/use-cases/emoji", json=policy, params={"allow_loosen": "true"}, headers=headers
    )
    assert r.status_code == status, r.text
    assert client.post("/v1/admin/jobs/purge:run", headers=headers).status_code == status


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"X-Device-Id": "other"}, 403),
        ({"Authorization": "Bearer wrong"}, 403),
        ({"X-Device-Id": "me"}, 200),
        (ADMIN, 200),
    ],
)
def test_budget_auth_matrix(client: TestClient, headers: dict[str, str], status: int) -> None:
    r = client.get("/v1/devices/me/budget", headers=headers)
    assert r.status_code == status, r.text
    if status == 200:
        assert len(r.json()["use_cases"]) == 7


def test_policy_lifecycle_over_http(client: TestClient) -> None:
    body = client.get("/v1/use-cases/emoji").json()
    policy = {k: v for k, v in body.items() if k in PolicyCreate.model_fields}
    looser = {**policy, "max_reports_per_day": 2}
    refused = client.put("/v1/use-cases/emoji", json=looser, headers=ADMIN)
    assert refused.status_code == 409 and refused.json()["field"] == "allow_loosen"
    assert "emoji: what one device may spend on budget 'emoji' rises" in refused.json()["detail"]
    updated = client.put(
        "/v1/use-cases/emoji", json=looser, params={"allow_loosen": "true"}, headers=ADMIN
    )
    assert updated.status_code == 200 and updated.json()["version"] == 2
    bad = client.put(
        "/v1/use-cases/emoji", json={**policy, "epsilon_per_report": "4"}, headers=ADMIN
    )
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "epsilon_per_report"
    nan = client.put(
        "/v1/use-cases/emoji",
        content=json.dumps({**policy, "epsilon_per_report": float("nan")}).encode(),
        headers={**ADMIN, "Content-Type": "application/json"},
    )
    assert nan.status_code == 422
    json.loads(nan.text)
    renamed = client.put("/v1/use-cases/emoji", json={**policy, "name": "other"}, headers=ADMIN)
    assert renamed.status_code == 422
    group = client.put(
        "/v1/use-cases/safari-crash-domains",
        json={
            **{
                k: v
                for k, v in client.get("/v1/use-cases/safari-crash-domains").json().items()
                if k in PolicyCreate.model_fields
            },
            "max_reports_per_day": 5,
        },
        headers=ADMIN,
    )
    assert group.status_code == 409 and group.json()["field"] == "max_reports_per_day"
    assert "PUT /v1/budget-groups/{name}" in group.json()["detail"]
    terms = client.get("/v1/budget-groups/safari-domains").json()
    assert terms["members"] == ["safari-crash-domains", "safari-energy-domains"]
    tighter = {**terms["terms"], "max_reports_per_day": 1}
    both = client.put("/v1/budget-groups/safari-domains", json=tighter, headers=ADMIN)
    assert both.status_code == 200 and both.json()["terms"]["max_reports_per_day"] == 1
    for member in terms["members"]:
        assert client.get(f"/v1/use-cases/{member}").json()["max_reports_per_day"] == 1
    back = client.put("/v1/budget-groups/safari-domains", json=terms["terms"], headers=ADMIN)
    assert back.status_code == 409 and back.json()["field"] == "allow_loosen"
    partial = client.put(
        "/v1/budget-groups/safari-domains", json={"max_reports_per_day": 1}, headers=ADMIN
    )
    assert partial.status_code == 422
    assert client.get("/v1/budget-groups/nobody").status_code == 404
    versions = client.get("/v1/use-cases/emoji/versions").json()
    assert [v["version"] for v in versions] == [1, 2]
    assert client.delete("/v1/use-cases/emoji", headers=ADMIN).json()["active"] is False
    assert client.get("/v1/use-cases/emoji").status_code == 404


def test_the_published_policy_names_the_seed_in_force_only(client: TestClient) -> None:
    # A top-level `hash_seed` of null once sent device developers to seed 0; the public view
    # carries the seed only where it is always filled: randomizer.hash_family.seed.
    body = client.get("/v1/use-cases/emoji").json()
    assert "hash_seed" not in body
    derived = int(default_hash_seed("emoji"), 16)
    assert body["randomizer"]["hash_family"]["seed"] == format(derived, "064x")
    policy = {k: v for k, v in body.items() if k in PolicyCreate.model_fields}
    assert "hash_seed" not in policy  # a PUT built from a GET keeps the derived seed
    pinned = client.put("/v1/use-cases/emoji", json={**policy, "hash_seed": "5eed"}, headers=ADMIN)
    assert pinned.status_code == 200, pinned.text
    assert "hash_seed" not in pinned.json()
    # published fixed-width: the key's 32 bytes as 64 hex digits, leading zeros kept
    assert pinned.json()["randomizer"]["hash_family"]["seed"] == "5eed".zfill(64)
    ledger = client.app.state.ledger  # type: ignore[attr-defined]
    stored = ledger.policies.get("emoji")
    assert stored.hash_seed == "5eed"  # the override is kept where operators set it
    assert from_published(pinned.json()) == mechanism_for(stored)


def test_batch_relay(client: TestClient) -> None:
    m = mech(client, "safari-energy-domains")
    reports = m.privatize(["a.com", "b.com", "c.com"], rng=np.random.default_rng(0)).to_dicts()
    items = [
        {"device_id": "r1", "report": reports[0]},
        {"device_id": "r1", "report": reports[1]},
        {"device_id": "r1", "report": reports[2]},
        {"device_id": "r2", "report": {"j": 99999, "l": 0, "bit": 1}},
        {"device_id": "", "report": reports[0]},
        {"report": reports[0], "extra": 1},
    ]
    r = client.post(
        "/v1/use-cases/safari-energy-domains/reports:batch", json={"items": items}, headers=ADMIN
    )
    assert r.status_code == 200, r.text
    statuses = [x["status"] for x in r.json()["results"]]
    assert statuses == [202, 202, 429, 422, 422, 422]
    assert r.json()["results"][3]["field"] == "items[3].report.j"
    assert r.json()["accepted"] == 2 and count(client, "inbox") == 2
    too_many = client.post(
        "/v1/use-cases/safari-energy-domains/reports:batch",
        json={"items": [items[0]] * 101},
        headers=ADMIN,
    )
    assert too_many.status_code == 413
    no_auth = client.post("/v1/use-cases/safari-energy-domains/reports:batch", json={"items": []})
    assert no_auth.status_code == 401


def test_pipeline_estimates_and_metrics(client: TestClient) -> None:
    m = mech(client, "safari-energy-domains")
    values = ["popular.com"] * 300 + ["rare.com"] * 20
    reports = m.privatize(values, rng=np.random.default_rng(1)).to_dicts()
    for i, body in enumerate(reports):
        assert (
            client.post(
                "/v1/use-cases/safari-energy-domains/reports",
                json=body,
                headers={"X-Device-Id": f"d{i}"},
            ).status_code
            == 202
        )
    result = client.post("/v1/admin/jobs/aggregate:run", headers=ADMIN).json()["result"]
    assert result == {"moved": 320, "folded": 320, "sketches": 1, "failed": {}}
    assert count(client, "inbox") == 0 and count(client, "reports") == 320
    again = client.post("/v1/admin/jobs/aggregate:run", headers=ADMIN).json()["result"]
    assert again["folded"] == 0  # idempotent
    est = client.get(
        "/v1/use-cases/safari-energy-domains/estimates",
        params={"candidates": ["popular.com", "rare.com"]},
        headers=ADMIN,
    ).json()
    assert est["n"] == 320 and est["days"] == ["2026-11-22"]
    top = est["estimates"][0]
    assert top["item"] == "popular.com" and abs(top["count"] - 300) < 5 * top["stderr"]
    metrics = client.get("/metrics").text
    assert (
        'dpgov_reports_total{outcome="accepted",use_case="safari-energy-domains"} 320.0' in metrics
    )
    assert "dpgov_inbox_depth 0.0" in metrics
    assert client.post("/v1/admin/jobs/nope:run", headers=ADMIN).status_code == 404
    assert client.get("/v1/use-cases/emoji/discoveries", headers=ADMIN).status_code == 422


def test_store_has_no_device_column_and_logs_carry_no_identifiers(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    body = mech(client, "emoji").privatize_one("😂").to_dict()
    client.post(
        "/v1/use-cases/emoji/reports",
        json=body,
        headers={"X-Device-Id": "secret-device-42", "Idempotency-Key": "secret-key-7"},
    )
    client.post("/v1/admin/jobs/aggregate:run", headers=ADMIN)
    for record in caplog.records:
        message = record.getMessage()
        assert "secret-device-42" not in message and "secret-key-7" not in message
        assert str(body["bits"]) not in message
    ledger = client.app.state.ledger  # type: ignore[attr-defined]
    with ledger.engine.connect() as conn:
        columns = [r[1] for r in conn.execute(text("PRAGMA table_info(reports)"))]
    # ``tag``: a keyed tag over the row's own fields (budget.audit.row_tags), nothing of a device
    assert columns == ["id", "use_case", "params", "day", "payload", "batch", "tag"]


def test_device_rate_limit_answers_429_without_charging(tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'rl.sqlite'}",
        secret_file=tmp_path / "secret",
        audit_key_file=tmp_path / "audit.key",
        admin_token=SecretStr("admin-secret-token-admin-secret-token"),
        scheduler=False,
        device_rate_per_minute=3,
        admin_failures_per_minute=2,
    )
    with TestClient(create_app(settings, clock=FixedClock(NOW))) as c:
        body = {"j": 1, "l": 2, "bit": 1}
        codes = [
            c.post(
                "/v1/use-cases/safari-energy-domains/reports",
                json=body,
                headers={"X-Device-Id": "spammy"},
            ).status_code
            for _ in range(5)
        ]
        assert codes == [202, 202, 429, 429, 429]  # the third is the daily cap, then the limiter
        limited = c.post(
            "/v1/use-cases/emoji/reports", json=body, headers={"X-Device-Id": "spammy"}
        )
        assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1
        assert "too many requests" in limited.json()["detail"]
        assert count(c, "charges") == 2
        bad = [
            c.delete("/v1/use-cases/emoji", headers={"Authorization": "Bearer nope"}).status_code
            for _ in range(4)
        ]
        assert bad == [403, 403, 429, 429]


def test_openapi_documents_every_operation(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    operations = [
        (path, method, op)
        for path, methods in spec["paths"].items()
        for method, op in methods.items()
    ]
    assert len(operations) >= 14
    for path, method, op in operations:
        assert op.get("description") or op.get("summary"), (path, method)
    put = spec["paths"]["/v1/use-cases/{name}"]["put"]
    examples = put["requestBody"]["content"]["application/json"]["examples"]
    assert "new words (SFP)" in examples
    report = spec["paths"]["/v1/use-cases/{name}/reports"]["post"]
    assert {"202", "404", "409", "422", "429"} <= set(report["responses"])


@pytest.mark.parametrize(
    "body",
    [
        {"j": 1024, "l": 0, "bit": 1},
        {"j": 1, "l": 0, "bit": 0},
        {**GOOD_HCMS, "epsilon": 0.1},
        [1, 2],
        "text",
        {"j": float("nan"), "l": 0, "bit": 1},
    ],
)
def test_fast_lane_and_documented_route_answer_alike(client: TestClient, body: Any) -> None:
    # application/json is served by the fast lane; a +json type goes through FastAPI's route.
    raw = json.dumps(body).encode()
    answers = []
    for content_type in ("application/json", "application/x-report+json"):
        r = client.post(
            "/v1/use-cases/safari-energy-domains/reports",
            content=raw,
            headers={"X-Device-Id": "same", "Content-Type": content_type},
        )
        answers.append((r.status_code, r.json()))
    assert answers[0] == answers[1]
    unknown = [
        client.post(
            "/v1/use-cases/nope/reports",
            content=b"{}",
            headers={"X-Device-Id": "d", "Content-Type": ct},
        ).json()
        for ct in ("application/json", "application/x-report+json")
    ]
    assert unknown[0] == unknown[1]


def test_fast_lane_receipts_match_the_route(client: TestClient) -> None:
    body = json.dumps(GOOD_HCMS).encode()
    lane = client.post(
        "/v1/use-cases/safari-energy-domains/reports",
        content=body,
        headers={"X-Device-Id": "a", "Content-Type": "application/json"},
    )
    route = client.post(
        "/v1/use-cases/safari-energy-domains/reports",
        content=body,
        headers={"X-Device-Id": "b", "Content-Type": "application/x-report+json"},
    )
    assert lane.status_code == route.status_code == 202
    assert set(lane.json()) == set(route.json())
    assert {k: v for k, v in lane.json().items() if k != "receipt"} == {
        k: v for k, v in route.json().items() if k != "receipt"
    }


def test_discoveries_are_computed_once_per_sketch_state(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    fields = {
        k: v
        for k, v in client.get("/v1/use-cases/quicktype").json().items()
        if k in PolicyCreate.model_fields
    }
    small = {**fields, "k": 16, "m": 64, "k_fragment": 16, "m_fragment": 64}
    assert client.put("/v1/use-cases/quicktype", json=small, headers=ADMIN).status_code == 200
    calls: list[int] = []
    discover = SfpSketch.discover_detailed

    def counted(self: SfpSketch, *args: Any, **kwargs: Any) -> Any:
        calls.append(self.n)
        return discover(self, *args, **kwargs)

    monkeypatch.setattr(SfpSketch, "discover_detailed", counted)
    m = mech(client, "quicktype")

    def submit(words: list[str], prefix: str) -> None:
        for i, body in enumerate(
            m.privatize(words, rng=np.random.default_rng(len(prefix))).to_dicts()
        ):
            r = client.post(
                "/v1/use-cases/quicktype/reports",
                json=body,
                headers={"X-Device-Id": f"{prefix}{i}"},
            )
            assert r.status_code == 202, r.text
        client.post("/v1/admin/jobs/aggregate:run", headers=ADMIN)

    submit(["hello"] * 30, "a")
    first = client.get("/v1/use-cases/quicktype/discoveries", headers=ADMIN)
    second = client.get("/v1/use-cases/quicktype/discoveries", headers=ADMIN)
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json() and first.json()["n"] == 30
    sfp = mech(client, "quicktype")
    assert isinstance(sfp, SFP)
    floor = 4 * math.sqrt(sfp.word_cms.variance(30, 0.0, 0.0))
    assert first.json()["threshold"] == pytest.approx(floor)  # the noise floor, said
    assert calls == [30]  # the second answer came from the cache
    submit(["world"] * 10, "bb")  # the sketch changed: computed again
    assert client.get("/v1/use-cases/quicktype/discoveries", headers=ADMIN).json()["n"] == 40
    assert calls == [30, 40]


def test_admin_routes_override_a_crashed_processs_lease(client: TestClient) -> None:
    engine = client.app.state.ledger.engine  # type: ignore[attr-defined]
    assert acquire_lease(engine, lease_of("aggregate"), "crashed-host:1:dead", 3600)
    refused = client.post("/v1/admin/jobs/flush-inbox:run", headers=ADMIN)
    assert refused.status_code == 409 and "force=true" in refused.json()["detail"]
    forced = client.post("/v1/admin/jobs/flush-inbox:run?force=true", headers=ADMIN)
    assert forced.status_code == 200 and forced.json()["result"]["moved"] == 0

    assert acquire_lease(engine, lease_of("aggregate"), "crashed-host:1:dead", 3600)
    released = client.post("/v1/admin/jobs/aggregate:release", headers=ADMIN)
    assert released.json() == {"job": "aggregate", "lease": "inbox:run", "released": True}
    assert client.post("/v1/admin/jobs/aggregate:run", headers=ADMIN).status_code == 200
    assert client.post("/v1/admin/jobs/nope:release", headers=ADMIN).status_code == 404
    assert client.post("/v1/admin/jobs/aggregate:release").status_code == 401


def test_a_policy_body_is_refused_in_the_projects_words(client: TestClient) -> None:
    """422 bodies carry the validators' own messages, without pydantic's words in front."""
    body = client.get("/v1/use-cases/emoji").json()
    policy = {k: v for k, v in body.items() if k in PolicyCreate.model_fields}
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"mechanism": "hcms", "m": 1000}, "m", "`m` must be a power of 2 for hcms, got 1000"),
        ({"k": None}, "k", "must be a valid integer, got null"),
        ({"bogus": 1}, "bogus", "is not a field"),
    ]
    for change, field, said in cases:
        r = client.put("/v1/use-cases/emoji", json={**policy, **change}, headers=ADMIN)
        assert r.status_code == 422, r.text
        (error,) = r.json()["detail"]
        assert (error["field"], error["msg"]) == (field, said), error

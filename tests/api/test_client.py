"""The typed client against a real server: published randomizers, family checks, retries."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from dp_governor.api.client import (
    AsyncClient,
    BadRequest,
    Client,
    RateLimited,
    Receipt,
    Refusal,
    RelayItem,
    Retry,
    Unavailable,
)
from dp_governor.api.demo.simulation import zipf_indices
from dp_governor.mechanisms import HCMS, family_id
from tests.live import ADMIN_TOKEN, serve

SAFARI = "safari-energy-domains"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serve(tmp_path_factory.mktemp("client")) as served:
        yield served.base


def test_zipf_reports_built_from_the_published_policy_estimate_the_truth(base: str) -> None:
    # The device side as the README tells it: the randomizer comes from the published policy.
    # 20,000 Zipf reports through the relay; before the family was published, the top items'
    # estimates were about 160 where the truth was about 4,300.
    rng = np.random.default_rng(20)
    domains = [f"site{i}.example" for i in range(200)]
    n = 20_000
    index = zipf_indices(len(domains), n, 1.1, rng=rng)
    with Client(base, admin_token=ADMIN_TOKEN, timeout=600) as client:
        mech = client.randomizer(SAFARI)
        assert isinstance(mech, HCMS)
        reports = mech.privatize([domains[i] for i in index], rng=rng)
        bodies = reports.to_dicts()
        accepted = 0
        for s in range(0, n, 5_000):
            items = [RelayItem(f"zipf-{i}", bodies[i]) for i in range(s, s + 5_000)]
            accepted += client.relay(SAFARI, items).accepted
        assert accepted == n
        assert client.run_job("aggregate").result["folded"] >= n
        est = client.estimates(SAFARI, domains)
    truth = np.bincount(index, minlength=len(domains))
    by_item = {e.item: e for e in est.estimates}
    assert est.n == n
    for i in np.argsort(-truth)[:10]:
        e = by_item[domains[i]]
        # 4.5 standard errors: a false failure among 10 items has probability under 1e-4.
        assert abs(e.count - truth[i]) < 4.5 * e.stderr, (domains[i], e, int(truth[i]))
    assert by_item[domains[int(np.argmax(truth))]].count > 0.8 * truth.max()


def test_a_report_built_under_another_family_is_refused_naming_the_field(base: str) -> None:
    readme_of_old = HCMS(epsilon=4.0, k=1024, m=32768)  # seed 0: not the use case's family
    body: dict[str, Any] = readme_of_old.privatize_one("www.example.com").to_dict()
    body["family"] = family_id(readme_of_old)
    with Client(base, admin_token=ADMIN_TOKEN) as client:
        published = client.policy(SAFARI).randomizer.family_id
        assert published != body["family"]
        with pytest.raises(BadRequest) as raised:
            client.submit(SAFARI, "wrong-family", body)
        assert raised.value.status == 422 and raised.value.field == "family"
        assert published in raised.value.detail
        batch = client.relay(SAFARI, [RelayItem("wrong-family-2", body)])
        assert batch.accepted == 0
        assert batch.results[0].status == 422
        assert batch.results[0].field == "items[0].report.family"
        # Nothing was charged for either.
        spent = [u for u in client.budget("wrong-family").use_cases if u.use_case == SAFARI]
        assert spent[0].reports_today == 0


def test_the_client_adds_the_family_and_a_stale_one_is_refused(base: str) -> None:
    with Client(base, admin_token=ADMIN_TOKEN) as client:
        mech = client.randomizer("health-types")
        first = client.submit("health-types", "fam-1", mech.privatize_one("HKQuantityType"))
        assert isinstance(first, Receipt) and first.accepted
        # The policy changes its parameters: the family the client holds is stale.
        policy = client.policy("health-types")
        changed = policy.model_dump(
            include={"mechanism", "k", "m", "max_reports_per_day", "min_batch_devices"}
        )
        changed |= {"epsilon_per_report": policy.epsilon_per_report, "m": policy.m // 2}
        put = httpx.put(
            f"{base}/v1/use-cases/health-types",
            json=changed,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        assert put.status_code == 200, put.text
        stale: dict[str, Any] = mech.privatize_one("HKQuantityType").to_dict()
        stale["family"] = mech_family = family_id(mech)
        with pytest.raises(BadRequest) as raised:
            client.submit("health-types", "fam-2", stale)
        assert raised.value.field == "family" and mech_family in raised.value.detail
        fresh = client.randomizer("health-types")
        again = client.submit("health-types", "fam-2", fresh.privatize_one("HKQuantityType"))
        assert isinstance(again, Receipt)


def test_a_cap_refusal_is_an_answer_and_a_replay_returns_the_first(base: str) -> None:
    with Client(base) as device:
        mech = device.randomizer("emoji")
        report = mech.privatize_one("😂")
        first = device.submit("emoji", "cap-1", report, idempotency_key="k-1")
        replay = device.submit("emoji", "cap-1", report, idempotency_key="k-1")
        assert isinstance(first, Receipt) and isinstance(replay, Receipt)
        assert replay.replayed and replay.receipt == first.receipt
        refused = device.submit("emoji", "cap-1", mech.privatize_one("😂"))
        assert isinstance(refused, Refusal)
        assert refused.reason == "daily_cap" and refused.retry_at is not None
        budget = device.budget("cap-1")
        emoji = [u for u in budget.use_cases if u.use_case == "emoji"]
        assert emoji[0].reports_left_today == 0


def test_operator_calls_return_typed_results(base: str) -> None:
    with Client(base, admin_token=ADMIN_TOKEN) as operator:
        report = operator.effective_epsilon()
        assert {u.use_case for u in report.use_cases} >= {"emoji", SAFARI}
        what = operator.what_if("emoji", max_reports_per_day=2)
        assert what.use_case == "emoji" and what.current_version >= 1
        policies = operator.policies()
        assert all(p.randomizer.family_id.startswith("f1-") for p in policies)
    with Client(base) as anonymous, pytest.raises(Exception) as raised:
        anonymous.what_if("emoji", max_reports_per_day=2)
    assert getattr(raised.value, "status", None) == 401


def test_the_async_client_builds_submits_and_reads(base: str) -> None:
    async def run() -> tuple[Receipt | Refusal, int]:
        async with AsyncClient(base, admin_token=ADMIN_TOKEN) as client:
            mech = await client.randomizer("lookup-hints")
            result = await client.submit("lookup-hints", "async-1", mech.privatize_one("bae"))
            batch = await client.relay(
                "lookup-hints",
                [RelayItem(f"async-{i}", mech.privatize_one("bae")) for i in range(2, 6)],
            )
            budget = await client.budget("async-1", as_device=False)
            left = [u for u in budget.use_cases if u.use_case == "lookup-hints"]
            assert batch.accepted == 4
            return result, left[0].reports_left_today

    result, left = asyncio.run(run())
    assert isinstance(result, Receipt) and left == result.reports_left_today


# -- retries, against a real local HTTP server with a script of answers --------------------------


class _Script(ThreadingHTTPServer):
    """Answers POSTs from a script of (status, headers, body); records each request's headers."""

    def __init__(self, script: list[tuple[int, dict[str, str], object]]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = list(script)
        self.seen: list[dict[str, str]] = []


class _Handler(BaseHTTPRequestHandler):
    server: _Script

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.seen.append(dict(self.headers))
        status, headers, body = self.server.script.pop(0)
        raw = json.dumps(body).encode()
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", **headers}.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[_Script]:
    server = _Script([])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


RECEIPT = {
    "receipt": "ab",
    "use_case": "emoji",
    "policy_version": 1,
    "epsilon": 4.0,
    "day": "2026-11-23",
    "reports_left_today": 0,
    "replayed": False,
}


def _url(server: _Script) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_retries_honour_retry_after_and_keep_the_idempotency_key(scripted: _Script) -> None:
    scripted.script[:] = [
        (503, {"Retry-After": "2"}, {"detail": "starting"}),
        (429, {"Retry-After": "1"}, {"detail": "too many requests from this device"}),
        (202, {}, RECEIPT),
    ]
    waits: list[float] = []
    with Client(_url(scripted), sleep=waits.append) as client:
        result = client.submit("emoji", "d", {"j": 1, "bits": "AA=="})
    assert isinstance(result, Receipt)
    assert waits == [2.0, 1.0]
    keys = {h["Idempotency-Key"] for h in scripted.seen}
    assert len(scripted.seen) == 3 and len(keys) == 1


def test_5xx_backs_off_exponentially_then_raises_with_the_body(scripted: _Script) -> None:
    scripted.script[:] = [(500, {}, {"detail": f"boom {i}"}) for i in range(4)]
    waits: list[float] = []
    retry = Retry(attempts=4, backoff=0.25, max_backoff=0.75)
    with Client(_url(scripted), retry=retry, sleep=waits.append) as client:
        with pytest.raises(Unavailable) as raised:
            client.submit("emoji", "d", {"j": 1, "bits": "AA=="})
    assert waits == [0.25, 0.5, 0.75]
    assert raised.value.status == 500 and raised.value.body == {"detail": "boom 3"}


def test_a_retry_after_over_the_bound_is_not_waited_for(scripted: _Script) -> None:
    scripted.script[:] = [(429, {"Retry-After": "3600"}, {"detail": "too many requests"})]
    waits: list[float] = []
    with Client(_url(scripted), sleep=waits.append) as client:
        with pytest.raises(RateLimited) as raised:
            client.submit("emoji", "d", {"j": 1, "bits": "AA=="})
    assert waits == [] and raised.value.retry_after == 3600.0


def test_the_async_client_retries_too(scripted: _Script) -> None:
    scripted.script[:] = [(503, {"Retry-After": "1"}, {"detail": "busy"}), (202, {}, RECEIPT)]
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    async def run() -> Receipt | Refusal:
        async with AsyncClient(_url(scripted), sleep=record) as client:
            return await client.submit("emoji", "d", {"j": 1, "bits": "AA=="})

    assert isinstance(asyncio.run(run()), Receipt)
    assert waits == [1.0] and len({h["Idempotency-Key"] for h in scripted.seen}) == 1


def test_a_real_rate_limit_is_retried_after_its_retry_after(tmp_path: Path) -> None:
    with serve(tmp_path, device_rate_per_minute="1") as served:
        waits: list[float] = []
        with Client(served.base, retry=Retry(attempts=3), sleep=waits.append) as device:
            mech = device.randomizer("lookup-hints")
            first = device.submit("lookup-hints", "rl-1", mech.privatize_one("a"))
            assert isinstance(first, Receipt)
            with pytest.raises(RateLimited) as raised:
                device.submit("lookup-hints", "rl-1", mech.privatize_one("a"))
    # Each 429 said how long to wait; the client waited that (its sleep recorded it), twice.
    assert len(waits) == 2 and all(0 < w <= 60 for w in waits)
    assert raised.value.retry_after is not None and raised.value.status == 429


def test_the_readme_client_example_runs_as_written(
    base: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    tour = readme.split("## A short tour", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", tour, flags=re.S)
    monkeypatch.setenv("DPGOV_ADMIN_TOKEN", ADMIN_TOKEN)
    exec(compile(code.replace("http://127.0.0.1:8000", base), "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("receipt=") and printed[0].endswith("accepted=True")
    assert printed[1] == "3" and printed[2].startswith("use_case=")


def test_a_server_refuses_a_body_without_the_family_by_default(tmp_path: Path) -> None:
    readme_of_old = HCMS(epsilon=4.0, k=1024, m=32768)  # no family: cannot be checked
    body = readme_of_old.privatize_one("www.example.com").to_dict()
    with (
        serve(tmp_path, require_report_family=None) as served,  # the default: required
        Client(served.base, admin_token=ADMIN_TOKEN) as client,
    ):
        with pytest.raises(BadRequest) as raised:
            client.submit(SAFARI, "strict-1", body)
        assert raised.value.field == "family" and "required" in raised.value.detail
        batch = client.relay(SAFARI, [RelayItem("strict-2", body)])
        assert batch.results[0].field == "items[0].report.family"
        mech = client.randomizer(SAFARI)  # the client now sends the family it fetched
        assert isinstance(
            client.submit(SAFARI, "strict-1", mech.privatize_one("a.example")), Receipt
        )


def test_the_client_answers_every_refusal_the_rule_can_give() -> None:
    from dp_governor.api.client import CAP_REASONS
    from dp_governor.budget.rule.refusal import REFUSALS

    assert frozenset(REFUSALS) == CAP_REASONS  # a filter's 429 is an answer, not a rate limit


def test_the_client_imports_no_server_code() -> None:
    """A device or relay needs neither SQLAlchemy nor the server (a fresh interpreter)."""
    import subprocess
    import sys

    server = ("sqlalchemy", "sqlmodel", "fastapi", "starlette", "alembic", "apscheduler")
    layers = ("dp_governor.budget", "dp_governor.pipeline", "dp_governor.policies")
    code = (
        "import sys, dp_governor.client; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {server!r}"
        f" or m.startswith(tuple(p + '.' for p in {layers!r})) or m in {layers!r}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]", proc.stdout

"""The public distribution route reads the stored figures, whoever asks.

Twenty concurrent callers over real HTTP, asking for every bin count and both scopes of a
ledger with no stored figures yet, make one population pass (the figures computed once, every
use case's distributions taken from the report's passes: no scan of their own), and get exactly
the figures the uncached function computes; once stored, no caller reads the ledger at all. The
pass count is what a flood of callers used to multiply (one scan each: at 50,000 devices, 7 s at
the median and twice the memory).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
from pydantic import SecretStr

import dp_governor.api._snapshots as snapshots
import dp_governor.api.app as app_module
import dp_governor.budget.reporting.loss as loss
import dp_governor.budget.reporting.views as views
from dp_governor.api.app import create_app
from dp_governor.api.server import free_port
from dp_governor.api.settings import Settings
from dp_governor.budget import FixedClock
from dp_governor.budget.reporting.views import distribution
from dp_governor.policies import PolicyCreate, mechanism_for
from tests.api.worker_double import InProcessWorker

TOKEN = "distribution-admin-token-distribution-0123"
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)


@pytest.fixture
def served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, Any, Counter[Any]]]:
    """A real server with 300 devices' reports; yields its URL, app and the passes it made."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'dist.sqlite'}",
        secret_file=tmp_path / "secret",
        audit_key_file=tmp_path / "audit.key",
        admin_token=SecretStr(TOKEN),
        scheduler=False,
        report_cache_seconds=3600,
    )
    scans: Counter[Any] = Counter()
    spends, passes = views._spends, loss.effective_epsilon_passes

    def counted(ledger: Any, use_case: str, scope: str, now: datetime) -> dict[str, int]:
        scans[(use_case, scope)] += 1
        return spends(ledger, use_case, scope, now)

    def counted_passes(ledger: Any, **kwargs: Any) -> Any:
        scans["population pass"] += 1
        return passes(ledger, **kwargs)

    monkeypatch.setattr(views, "_spends", counted)
    monkeypatch.setattr(snapshots, "effective_epsilon_passes", counted_passes)
    monkeypatch.setattr(app_module, "JobWorker", InProcessWorker)  # the passes counted here
    app = create_app(settings, clock=FixedClock(NOW))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 300  # generous: a busy machine starts slowly
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "the server did not start"
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, timeout=120) as c:
        policy = c.get("/v1/use-cases/emoji").json()
        fields = {k: v for k, v in policy.items() if k in PolicyCreate.model_fields}
        mech = mechanism_for(PolicyCreate.model_validate(fields))
        bodies = mech.privatize(["a"] * 300, rng=np.random.default_rng(3)).to_dicts()
        items = [{"device_id": f"dev-{i % 200}", "report": b} for i, b in enumerate(bodies)]
        r = c.post(
            "/v1/use-cases/emoji/reports:batch",
            json={"items": items},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert r.status_code == 200 and r.json()["accepted"] > 0, r.text
    scans.clear()
    try:
        yield base, app, scans
    finally:
        server.should_exit = True
        thread.join(timeout=60)


def test_concurrent_callers_share_one_scan_and_get_the_uncached_figures(
    served: tuple[str, Any, Counter[Any]],
) -> None:
    base, app, scans = served
    asks = [(scope, bins) for scope in ("window", "lifetime") for bins in range(1, 201, 10)]

    def ask(scope_bins: tuple[str, int]) -> dict[str, Any]:
        scope, bins = scope_bins
        with httpx.Client(base_url=base, timeout=120) as c:
            r = c.get(
                "/v1/audit/use-cases/emoji/distribution", params={"scope": scope, "bins": bins}
            )
            assert r.status_code == 200, r.text
            body: dict[str, Any] = r.json()
            return body

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(ask, asks))
    assert scans == Counter({"population pass": 1}), scans  # computed once, no scan per use case
    scans.clear()
    with ThreadPoolExecutor(20) as pool:
        assert list(pool.map(ask, asks)) == answers
    assert not scans, scans  # stored figures: no request reads the ledger
    ledger = app.state.ledger
    for (scope, bins), body in zip(asks, answers, strict=True):
        expected = distribution(ledger, "emoji", now=NOW, scope=scope, bins=bins).to_dict()
        assert body == expected, (scope, bins)
    assert answers[0]["devices"] == 200

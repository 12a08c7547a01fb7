"""The server's claims as log entries: appended once, recomputed from the leaves alone.

A real ledger (SQLite, and PostgreSQL when configured): reports from ten devices (four of them
twice) on one day and six on the next, each day flushed into a batch; the claims job claims
both days. The claims' figures are checked against references computed from the raw sizes,
every claim recomputes exactly from the public leaves, the regenerated report is byte for byte
the one the server publishes, and an altered epsilon or batch size is named.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import orjson
import pytest
from sqlalchemy import Engine

from dp_governor.api.database import init_service_db
from dp_governor.budget import Decision, Ledger, utc_day
from dp_governor.budget.privacy.sub_batches import compose_sizes
from dp_governor.budget.reporting.claims import (
    CLAIM_ACTION,
    check_claims,
    claim_figures,
    logged_claim,
    publish_claims,
    render_report,
)
from dp_governor.pipeline.flush import flush_inbox
from dp_governor.pipeline.ingest import Ingestor, SubmitRequest
from dp_governor.pipeline.seal import InboxSeal
from dp_governor.policies import PolicyCreate, mechanism_for

SECRET = b"claims-secret-claims-secret-claims-secret"
SEAL = InboxSeal([b"claims-shuffler-claims-shuffler-claims-shuffler"])
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
TODAY = utc_day(NOW)
FIRST = TODAY - 3
DELTA = 1e-9
POLICY = PolicyCreate.model_validate(
    {
        "name": "emoji",
        "mechanism": "cms",
        "k": 16,
        "m": 64,
        "epsilon_per_report": 2.0,
        "max_reports_per_day": 5,
        "retention_days": 30,
        "min_batch_devices": 3,
        "delta": DELTA,
    }
)


def _submit(ingestor: Ingestor, devices: list[str], now: datetime) -> None:
    bodies = mechanism_for(POLICY).privatize(["a"] * len(devices), rng=np.random.default_rng(7))
    requests = [
        SubmitRequest("emoji", d, b) for d, b in zip(devices, bodies.to_dicts(), strict=True)
    ]
    results = ingestor.submit_group(requests, now=now)
    assert all(isinstance(r, Decision) and r.accepted for r in results), results[:3]


def build(engine: Engine, audit_key: bytes | None = None, *, claim: bool = True) -> Ledger:
    """Two days of reports, each day flushed into a batch, and (``claim``) both days claimed."""
    init_service_db(engine)
    ledger = Ledger(engine, SECRET, audit_key=audit_key)
    ledger.policies.create(POLICY)
    ingestor = Ingestor(ledger, SECRET, seal=SEAL)
    devices = [f"d{i}" for i in range(10)]
    first = NOW - timedelta(days=3)
    _submit(ingestor, devices, first)
    _submit(ingestor, devices[:4], first)  # four devices send twice: layers [10, 4]
    assert flush_inbox(engine, seal=SEAL, min_batch=1, now=first, ledger=ledger) == 14
    second = NOW - timedelta(days=2)
    _submit(ingestor, devices[:6], second)
    assert flush_inbox(engine, seal=SEAL, min_batch=1, now=second, ledger=ledger) == 6
    if claim:
        assert publish_claims(ledger, today=TODAY, now=NOW) == 2
        ledger.tlog.sync()
    return ledger


def _leaves(ledger: Ledger) -> list[bytes]:
    point = ledger.tlog.latest()
    assert point is not None
    return ledger.tlog.entries(0, point.size)


def test_claims_carry_the_figures_their_inputs_give(engine: Engine) -> None:
    ledger = build(engine)
    first, second = logged_claim(ledger, "emoji", FIRST), logged_claim(ledger, "emoji", FIRST + 1)
    assert first is not None and second is not None
    # the local epsilon distribution from the raw reports: 4 devices x 2 reports, 6 x 1
    assert first["local"] == [[2_000_000, 6], [4_000_000, 4]]
    assert second["local"] == [[2_000_000, 6]]
    assert [b["layers"] for b in first["inputs"]["batches"]] == [[10, 4]]
    (batch,) = first["figures"]["batches"]
    assert batch["central"]["epsilon"] == compose_sizes(2.0, [10, 4], DELTA)[0]
    # day two's window holds both batches: 5 reports a day over 2 days cover all three layers
    assert second["figures"]["window"]["epsilon"] == compose_sizes(2.0, [10, 6, 4], DELTA)[0]
    assert second["figures"]["window_adaptive"]["epsilon"] == compose_sizes(2.0, [4] * 10, DELTA)[0]
    assert second["inputs"]["accountant"]["name"] == "dp-accounting"
    assert second["inputs"]["policy"]["mechanism"] == "cms"
    assert publish_claims(ledger, today=TODAY, now=NOW) == 0  # once: a rerun claims nothing


def test_the_leaves_alone_reproduce_every_claim_and_its_report(engine: Engine) -> None:
    ledger = build(engine)
    checks = check_claims(_leaves(ledger))
    assert [(c.use_case, c.day, c.problems) for c in checks] == [
        ("emoji", FIRST, ()),
        ("emoji", FIRST + 1, ()),
    ]
    for check in checks:
        published = logged_claim(ledger, "emoji", check.day)
        assert published is not None
        assert check.report.encode() == render_report(published).encode()
    # no leaf of a claim names a device or its pseudonym
    claims = [leaf.decode() for leaf in _leaves(ledger) if CLAIM_ACTION.encode() in leaf]
    names = [f"d{i}" for i in range(10)]
    secret = [f'"{n}"' for n in names] + [ledger.device_key(n) for n in names]
    assert len(claims) == 2 and not any(s in leaf for s in secret for leaf in claims)


def _edit(leaves: list[bytes], day: int, change: Callable[[dict[str, Any]], None]) -> list[bytes]:
    out = []
    for raw in leaves:
        leaf = orjson.loads(raw)
        if leaf.get("kind") == CLAIM_ACTION and leaf["data"]["inputs"]["day"] == day:
            change(leaf["data"])
            raw = orjson.dumps(leaf, option=orjson.OPT_SORT_KEYS)
        out.append(raw)
    return out


def _epsilon(claim: dict[str, Any]) -> None:
    claim["figures"]["window"]["epsilon"] *= 0.9


def _batch_size(claim: dict[str, Any]) -> None:
    claim["inputs"]["batches"][0]["devices"] = 100
    claim["inputs"]["batches"][0]["layers"][0] = 100


def _dropped(claim: dict[str, Any]) -> None:  # leave out day one's batch, and its figure
    claim["inputs"]["batches"] = claim["inputs"]["batches"][1:]
    claim["figures"] = claim_figures(claim["inputs"])


def _local(claim: dict[str, Any]) -> None:
    claim["local"] = [[2_000_000, 10]]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (_epsilon, "window: claimed epsilon"),
        (_batch_size, "batch.publish leaves"),
        (_dropped, "the claim's 0 differ from the 1 batch.publish leaves"),
        (_local, "local epsilon distribution"),
    ],
)
def test_an_altered_claim_is_named(
    engine: Engine, change: Callable[[dict[str, Any]], None], named: str
) -> None:
    ledger = build(engine)
    checks = check_claims(_edit(_leaves(ledger), FIRST + 1, change))
    assert checks[0].ok
    assert not checks[1].ok and any(named in p for p in checks[1].problems), checks[1].problems


def test_days_whose_charges_were_purged_are_not_claimed(engine: Engine) -> None:
    ledger = build(engine, claim=False)
    later = NOW + timedelta(days=40)  # past the 30-day retention of both days
    ledger.purge(now=later)
    assert publish_claims(ledger, today=utc_day(later), now=later) == 0

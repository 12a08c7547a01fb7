"""SQLite and PostgreSQL decide the same random report sequences alike, and store the same rows.

PostgreSQL's charge sends its statements in three trips guessed from the cached policy book
(docs/performance.md); SQLite runs them one by one. Both go through the one charge path, so
every decision, charge, account, idempotency record and audit entry must agree, across policy
edits, a use case deleted (the guess then names one that is gone) and re-created, replays and
conflicting idempotency keys. Charge ids are left out: PostgreSQL draws them from a sequence,
with gaps.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from sqlalchemy import Engine, text

from dp_governor.budget import Decision, Ledger
from dp_governor.budget.gate.charge import BatchItem, charge_batch
from dp_governor.policies import PolicyCreate, PolicyUpdate
from tests.conftest import PG_URL, SECRET, make_engine

NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
BASE = {"mechanism": "cms", "k": 4, "m": 8, "retention_days": 3}
POLICIES = {
    "a": {"epsilon_per_report": 1.0, "max_reports_per_day": 3, "window_epsilon_cap": 4.0},
    "b": {"epsilon_per_report": 1.5, "max_reports_per_day": 2},
    "c": {"epsilon_per_report": 0.5, "max_reports_per_day": 4, "lifetime_epsilon_cap": 5.0},
}


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[tuple[Engine, Engine]]:
    """A fresh SQLite database and a fresh PostgreSQL schema."""
    sqlite = make_engine("sqlite", tmp_path)
    postgres = make_engine("postgresql", tmp_path)
    yield next(sqlite), next(postgres)
    for made in (sqlite, postgres):
        for _ in made:
            pass


def _create(ledger: Ledger, name: str) -> None:
    policy = PolicyCreate.model_validate({**BASE, "name": name, **POLICIES[name]})
    ledger.policies.create(policy, allow_loosen=True)


def _edit(ledger: Ledger, step: int) -> None:
    """The policy edit (if any) made before batch ``step``."""
    if step == 8:
        ledger.policies.delete("c")
    elif step == 14:
        ledger.policies.update("a", PolicyUpdate(epsilon_per_report=0.75), allow_loosen=True)
    elif step == 20:
        _create(ledger, "c")


def _batches(seed: int) -> list[list[BatchItem]]:
    """Random groups: a few devices, known and unknown use cases, keys repeated and reused."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(30):
        batch = []
        for _ in range(int(rng.integers(1, 7))):
            device = f"dev-{rng.integers(0, 6)}"
            use_case = str(rng.choice(["a", "a", "b", "c", "nope"]))
            key = f"k{rng.integers(0, 9)}" if rng.random() < 0.4 else None
            fingerprint = str(rng.choice(["h1", "h1", "h2"])) if key else None
            batch.append(BatchItem(device, use_case, key, fingerprint))
        out.append(batch)
    return out


def _outcome(result: Decision | Exception) -> Any:
    if isinstance(result, Decision):
        return result._replace(charge_id=None)
    return (type(result).__name__, str(result))


def _without_id(stored: dict[str, Any]) -> bytes:
    """A stored decision or entry's data, its charge id left out, as canonical JSON."""
    return orjson.dumps({k: v for k, v in stored.items() if k != "charge_id"})


def _rows(engine: Engine) -> dict[str, list[Any]]:
    """What the charges stored, charge ids aside (accounts never charged aside too)."""
    with engine.connect() as conn:

        def rows(sql: str) -> list[Any]:
            return sorted((tuple(r) for r in conn.execute(text(sql))), key=repr)

        return {
            "charges": rows(
                "SELECT device_key, use_case, budget, policy_version, epsilon_micro, day,"
                " idempotency_key FROM charges"
            ),
            "accounts": rows(
                "SELECT device_key, count, epsilon_micro, days, lifetime, oldest_day"
                " FROM accounts WHERE count > 0"
            ),
            "idempotency": sorted(
                (dk, key, fp, day, use_case, _without_id(orjson.loads(decision)))
                for dk, key, fp, day, use_case, decision in rows(
                    "SELECT device_key, key, request_hash, day, use_case, decision FROM idempotency"
                )
            ),
            "audit": [
                (actor, action, _without_id(orjson.loads(body)["data"]))
                for actor, action, body in conn.execute(
                    text("SELECT actor, action, body FROM audit_log ORDER BY seq")
                )
                if action == "charge"
            ],
        }


@pytest.mark.skipif(not PG_URL, reason="DPGOV_TEST_DATABASE_URL is not set")
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sqlite_and_postgresql_decide_and_store_alike(
    engines: tuple[Engine, Engine], seed: int
) -> None:
    ledgers = [Ledger(engine, SECRET) for engine in engines]
    for ledger in ledgers:
        for name in POLICIES:
            _create(ledger, name)
    for step, batch in enumerate(_batches(seed)):
        now = NOW + timedelta(hours=7 * step)
        outcomes = []
        for ledger in ledgers:
            _edit(ledger, step)
            outcomes.append([_outcome(r) for r in charge_batch(ledger.gate, batch, now=now)])
        assert outcomes[0] == outcomes[1], (step, batch)
    sqlite, postgres = (_rows(engine) for engine in engines)
    assert sqlite["charges"], "no report was accepted: the sequence tests nothing"
    for table, stored in sqlite.items():
        assert stored == postgres[table], table

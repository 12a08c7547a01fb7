"""The bulk generator writes what the gate writes for the same reports, and verify accepts it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from sqlalchemy import Engine, text

from benchmarks import scale
from dp_governor.budget import Ledger
from dp_governor.budget.storage.partitions import partition_days
from dp_governor.pipeline.purge import purge
from dp_governor.policies.defaults import default_policies
from tests.conftest import BACKENDS, PG_URL, make_engine

DEVICES, DAYS, SEED = 60, 6, 7


@pytest.fixture(params=BACKENDS)
def engines(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Engine, Engine]]:
    """Two fresh databases of one backend: the generator's and the gate's."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = make_engine(request.param, tmp_path / "a")
    second = make_engine(request.param, tmp_path / "b")
    yield next(first), next(second)
    for rest in (first, second):
        next(rest, None)


def _rows(engine: Engine, sql: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql))]


def _charge_entries(engine: Engine) -> list[tuple[Any, ...]]:
    """The charge entries' actor and data; charge ids as their rank (PostgreSQL leaves gaps)."""
    rows = _rows(engine, "SELECT actor, body FROM audit_log WHERE action = 'charge' ORDER BY seq")
    out = []
    rank = 0
    for actor, body in rows:
        data = orjson.loads(body)["data"]
        if data["charge_id"] is not None:
            rank += 1
            data["charge_id"] = rank
        out.append((actor, orjson.loads(body)["at"], sorted(data.items())))
    return out


def test_generated_rows_equal_the_gates(engines: tuple[Engine, Engine]) -> None:
    """Same reports, in the same order: same charges, accounts and charge audit entries."""
    generated, charged = Ledger(engines[0], scale.SECRET), Ledger(engines[1], scale.SECRET)
    built = scale.build(generated, devices=DEVICES, days=DAYS, rng=np.random.default_rng(SEED))
    charged.policies.write_all(default_policies(), actor="system")
    rng = np.random.default_rng(SEED)
    use_cases = list(scale.RATES)
    refused = 0
    for day in range(scale.FIRST_DAY, scale.FIRST_DAY + DAYS):
        for d, u in scale.plan_day(DEVICES, use_cases, rng=rng).tolist():
            now = scale.noon(day)
            refused += not charged.charge(scale.device_id(d), use_cases[u], now=now).accepted
    assert refused > 0 and built.charges > 0  # the sample exercises both answers
    assert built.attempts == built.charges + refused == built.entries

    columns = "device_key, use_case, budget, policy_version, epsilon_micro, day, idempotency_key"
    charges = f"SELECT {columns} FROM charges ORDER BY id"
    assert _rows(engines[0], charges) == _rows(engines[1], charges)
    if engines[0].dialect.name == "sqlite":  # PostgreSQL's sequence skips a refusal's id
        ids = "SELECT id FROM charges ORDER BY id"
        assert _rows(engines[0], ids) == _rows(engines[1], ids)
    accounts = "SELECT * FROM accounts ORDER BY device_key"
    assert _rows(engines[0], accounts) == _rows(engines[1], accounts)
    reporting = "SELECT count(DISTINCT device_key) FROM charges"
    assert len(_rows(engines[0], accounts)) == _rows(engines[0], reporting)[0][0] > DEVICES // 2
    assert _charge_entries(engines[0]) == _charge_entries(engines[1])

    verdict, state = generated.verify()
    assert verdict.ok, verdict.problem
    assert state.checked


@pytest.fixture
def pg_engine(tmp_path: Path) -> Iterator[Engine]:
    """A fresh PostgreSQL scratch schema (skipped without the server)."""
    if not PG_URL:
        pytest.skip("DPGOV_TEST_DATABASE_URL is not set (no PostgreSQL to test on)")
    yield from make_engine("postgresql", tmp_path)


def test_generated_days_are_partitions_the_purge_drops(pg_engine: Engine) -> None:
    """On PostgreSQL each generated day is its own partition, so the purge drops the old half."""
    engine = pg_engine
    ledger = Ledger(engine, scale.SECRET)
    built = scale.build(
        ledger,
        devices=DEVICES,
        days=DAYS,
        rng=np.random.default_rng(SEED),
        reports=True,
        retention_days=DAYS // 2,
    )
    assert _rows(engine, "SELECT count(*) FROM charges_default") == [(0,)]
    days = range(scale.FIRST_DAY, scale.FIRST_DAY + DAYS)
    with engine.connect() as conn:
        assert set(days) <= set(partition_days(conn))
    purged = purge(ledger, now=scale.noon(days[-1]))
    (body,) = _rows(engine, "SELECT body FROM audit_log WHERE action = 'purge.ledger'")[0]
    dropped = orjson.loads(body)["data"]["partitions_dropped"]
    assert dropped == list(days[: len(dropped)]) and len(dropped) >= DAYS // 2 - 1
    kept = _rows(engine, "SELECT count(*) FROM charges")[0][0]
    assert 0 < purged["charges"] and purged["charges"] + kept == built.charges

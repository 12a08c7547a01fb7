"""A batch charges exactly as the same requests one by one would (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from dp_governor.budget import Decision, IdempotencyConflict, InvalidRequest, Ledger, UnknownUseCase
from dp_governor.budget.gate.charge import BatchItem, charge_batch
from dp_governor.policies import PolicyCreate
from tests.conftest import SECRET

NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)


def _policies(ledger: Ledger) -> None:
    base = {"mechanism": "cms", "k": 4, "m": 8, "retention_days": 3}
    ledger.policies.create(
        PolicyCreate.model_validate(
            {
                **base,
                "name": "a",
                "epsilon_per_report": 1.0,
                "max_reports_per_day": 3,
                "window_epsilon_cap": 4.0,
            }
        ),
        allow_loosen=True,
    )
    group = {"budget_group": "g", "max_reports_per_day": 2, "lifetime_epsilon_cap": 5.0}
    ledger.policies.create(
        PolicyCreate.model_validate({**base, "name": "b", "epsilon_per_report": 1.5, **group}),
        allow_loosen=True,
    )
    ledger.policies.create(
        PolicyCreate.model_validate({**base, "name": "c", "epsilon_per_report": 0.5, **group}),
        allow_loosen=True,
    )


def _key(d: Decision) -> tuple[object, ...]:
    return (
        d.accepted,
        d.reason,
        d.use_case,
        d.retry_at,
        d.reports_left_today,
        d.window_remaining,
        d.lifetime_remaining,
    )


requests = st.lists(
    st.tuples(st.sampled_from(["x", "y"]), st.sampled_from(["a", "b", "c"]), st.integers(0, 2)),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(days=st.lists(requests, min_size=1, max_size=3))
def test_batch_equals_one_by_one(engine: Engine, days: list[list[tuple[str, str, int]]]) -> None:
    with engine.begin() as conn:
        for table in (
            "charges",
            "accounts",
            "idempotency",
            "policies",
        ):
            conn.execute(text(f"DELETE FROM {table}"))
    single = Ledger(engine, SECRET)
    _policies(single)
    batch_ledger = Ledger(engine, SECRET + b"-other-key-space")  # disjoint device keys
    accepted = 0
    for offset, day in enumerate(days):
        now = NOW + timedelta(days=offset)
        one_by_one = [single.charge(dev, uc, now=now) for dev, uc, _ in day]
        items = [BatchItem(dev, uc) for dev, uc, _ in day]
        batched = charge_batch(batch_ledger.gate, items, now=now)
        assert [_key(d) for d in one_by_one] == [_key(d) for d in batched]  # type: ignore[arg-type]
        accepted += sum(d.accepted for d in one_by_one)
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT COUNT(*) FROM charges")).scalar_one()
    assert stored == 2 * accepted  # both ledgers wrote the same charges


def test_batch_item_errors_and_idempotency(ledger: Ledger) -> None:
    items = [
        BatchItem("d1", "emoji", "k1", "h"),
        BatchItem("d1", "emoji", "k1", "h"),  # replay of the first inside the batch
        BatchItem("d1", "emoji", "k1", "other"),  # same key, different request
        BatchItem("", "emoji"),
        BatchItem("d2", "nope"),
        BatchItem("d2", "emoji"),
        BatchItem("d2", "emoji"),
    ]
    out = charge_batch(ledger.gate, items, now=NOW)
    assert isinstance(out[0], Decision) and out[0].accepted and out[0].charge_id
    assert isinstance(out[1], Decision) and out[1].replayed and out[1].charge_id == out[0].charge_id
    assert isinstance(out[2], IdempotencyConflict)
    assert isinstance(out[3], InvalidRequest) and out[3].field == "device_id"
    assert isinstance(out[4], UnknownUseCase)
    assert [o.reason for o in out[5:]] == ["accepted", "daily_cap"]  # type: ignore[union-attr]
    again = charge_batch(ledger.gate, [BatchItem("d1", "emoji", "k1", "h")], now=NOW)
    assert isinstance(again[0], Decision) and again[0].replayed
    with ledger.engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM charges")).scalar_one() == 2


def test_on_accept_failure_rolls_the_whole_batch_back(ledger: Ledger) -> None:
    def boom(conn: object, accepted: object) -> None:
        raise RuntimeError("inbox write failed")

    with pytest.raises(RuntimeError):
        charge_batch(
            ledger.gate, [BatchItem("d", "emoji"), BatchItem("e", "emoji")], now=NOW, on_accept=boom
        )
    with ledger.engine.connect() as conn:
        for table in ("charges", "accounts"):
            count = conn.execute(text(f"SELECT COUNT(*) FROM {table} WHERE 1 = 1")).scalar_one()
            assert count == 0, table

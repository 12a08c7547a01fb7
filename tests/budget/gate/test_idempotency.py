"""Idempotency keys: retries across workers, expired refusals, the retry window, keyed storage."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from dp_governor.budget import Decision, Ledger
from dp_governor.budget.gate.charge import BatchItem, charge_batch

NOW = datetime(2026, 11, 22, 15, 30, tzinfo=UTC)


def test_a_retry_storm_fails_only_nothing(ledger: Ledger) -> None:
    """Batches racing on one (device, key): the key charges once, unrelated items all pass."""

    def batch(n: int) -> list[Decision | Exception]:
        items = [BatchItem("stormy", "emoji", "same-key", "h")]
        items += [BatchItem(f"calm-{n}-{i}", "emoji") for i in range(5)]
        return charge_batch(ledger.gate, items, now=NOW)

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(batch, range(40)))
    assert all(isinstance(r, Decision) for rs in results for r in rs)
    firsts = [rs[0] for rs in results]
    assert sum(isinstance(d, Decision) and not d.replayed for d in firsts) == 1
    assert len({d.charge_id for d in firsts if isinstance(d, Decision)}) == 1
    assert all(isinstance(r, Decision) and r.accepted for rs in results for r in rs[1:])
    with ledger.engine.connect() as conn:
        charges = conn.execute(text("SELECT count(*) FROM charges")).scalar_one()
    assert charges == 1 + 40 * 5


def test_an_expired_refusal_is_decided_again(ledger: Ledger) -> None:
    assert ledger.charge("dev", "emoji", now=NOW).accepted
    refused = ledger.charge("dev", "emoji", now=NOW, idempotency_key="k")
    assert refused.reason == "daily_cap" and refused.retry_at is not None
    again = ledger.charge("dev", "emoji", now=NOW + timedelta(minutes=5), idempotency_key="k")
    assert again.replayed and again.reason == "daily_cap"  # not yet due: the same answer
    tomorrow = refused.retry_at + timedelta(minutes=1)
    fresh = ledger.charge("dev", "emoji", now=tomorrow, idempotency_key="k")
    assert fresh.accepted and not fresh.replayed
    later = ledger.charge("dev", "emoji", now=tomorrow, idempotency_key="k")
    assert later.replayed and later.charge_id == fresh.charge_id


def test_idempotency_records_live_only_through_the_retry_window(ledger: Ledger) -> None:
    first = ledger.charge("dev", "quicktype", now=NOW, idempotency_key="k")
    assert ledger.purge(now=NOW + timedelta(days=1)).idempotency == 0
    retry = ledger.charge("dev", "quicktype", now=NOW + timedelta(days=1), idempotency_key="k")
    assert retry.replayed and retry.charge_id == first.charge_id
    assert ledger.purge(now=NOW + timedelta(days=2)).idempotency == 1
    with ledger.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM idempotency")).scalar_one() == 0

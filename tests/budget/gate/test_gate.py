"""The gate's contract, run on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, func, select, text

from dp_governor.budget import (
    Decision,
    IdempotencyConflict,
    InvalidRequest,
    Ledger,
    UnknownUseCase,
    init_db,
)
from dp_governor.budget.reporting.loss import (
    device_loss,
    devices_loss,
    lifetime_rows,
    population_lifetime_loss,
    population_window_loss,
    window_totals,
)
from dp_governor.budget.rule.state import AccountState
from dp_governor.budget.storage.tables import Charge
from dp_governor.policies import PolicyCreate, PolicyUpdate

NOW = datetime(2026, 11, 22, 15, 30, tzinfo=UTC)


def count_rows(ledger: Ledger, table: str) -> int:
    with ledger.engine.connect() as conn:
        return int(conn.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar_one())


def add_policy(ledger: Ledger, **overrides: object) -> None:
    fields: dict[str, object] = {
        "name": "test-case",
        "mechanism": "cms",
        "k": 16,
        "m": 64,
        "epsilon_per_report": 0.1,
        "max_reports_per_day": 10,
    }
    fields.update(overrides)
    ledger.policies.create(PolicyCreate.model_validate(fields))


def test_daily_cap_then_refusal_with_next_midnight(ledger: Ledger) -> None:
    first = ledger.charge("device-1", "lookup-hints", now=NOW)
    second = ledger.charge("device-1", "lookup-hints", now=NOW)
    third = ledger.charge("device-1", "lookup-hints", now=NOW)
    assert first.accepted and second.accepted and not third.accepted
    assert (first.reports_left_today, second.reports_left_today) == (1, 0)
    assert third.reason == "daily_cap"
    assert third.retry_at == datetime(2026, 11, 23, tzinfo=UTC)
    assert count_rows(ledger, "charges") == 2
    # midnight resets the daily cap
    assert ledger.charge(
        "device-1", "lookup-hints", now=datetime(2026, 11, 23, tzinfo=UTC)
    ).accepted


def test_devices_and_use_cases_are_independent(ledger: Ledger) -> None:
    assert ledger.charge("a", "emoji", now=NOW).accepted
    assert ledger.charge("b", "emoji", now=NOW).accepted
    assert ledger.charge("a", "health-types", now=NOW).accepted
    assert not ledger.charge("a", "emoji", now=NOW).accepted


def test_safari_domains_share_one_budget(ledger: Ledger) -> None:
    assert ledger.charge("d", "safari-energy-domains", now=NOW).accepted
    shared = ledger.charge("d", "safari-crash-domains", now=NOW)
    assert shared.accepted and shared.budget == "safari-domains"
    refused = ledger.charge("d", "safari-energy-domains", now=NOW)
    assert not refused.accepted and refused.reason == "daily_cap"
    assert ledger.charge("d", "safari-autoplay", now=NOW).accepted  # its own budget


def test_exact_epsilon_cap_of_three_tenths_admits_exactly_three(ledger: Ledger) -> None:
    add_policy(ledger, window_epsilon_cap=0.3)
    decisions = [ledger.charge("dev", "test-case", now=NOW) for _ in range(5)]
    assert [d.accepted for d in decisions] == [True, True, True, False, False]
    assert decisions[2].window_remaining == 0.0
    assert decisions[3].reason == "window_cap"


def test_window_is_d_minus_89_to_d(ledger: Ledger) -> None:
    add_policy(ledger, epsilon_per_report=1.0, max_reports_per_day=1, window_epsilon_cap=2.0)
    day0 = NOW - timedelta(days=89)
    assert ledger.charge("dev", "test-case", now=day0).accepted  # day D-89
    assert ledger.charge("dev", "test-case", now=day0 + timedelta(days=1)).accepted  # D-88
    refused = ledger.charge("dev", "test-case", now=NOW)  # day D: D-89 still counts
    assert refused.reason == "window_cap"
    assert refused.retry_at == datetime(2026, 11, 23, tzinfo=UTC)  # when D-89 drops out
    assert ledger.charge("dev", "test-case", now=NOW + timedelta(days=1)).accepted  # D-90 out
    assert ledger.charge("dev", "test-case", now=NOW + timedelta(days=2)).accepted  # D-88 out
    later = ledger.charge("dev", "test-case", now=NOW + timedelta(days=3))
    assert later.reason == "window_cap"  # D+1 and D+2 fill the window at D+3
    assert later.retry_at == datetime(2026, 11, 22, tzinfo=UTC) + timedelta(days=91)


def test_lifetime_cap_refuses_forever(ledger: Ledger) -> None:
    add_policy(ledger, epsilon_per_report=1.0, max_reports_per_day=5, lifetime_epsilon_cap=2.0)
    assert ledger.charge("dev", "test-case", now=NOW).accepted
    assert ledger.charge("dev", "test-case", now=NOW).lifetime_remaining == 0.0
    refused = ledger.charge("dev", "test-case", now=NOW + timedelta(days=400))
    assert refused.reason == "lifetime_cap" and refused.retry_at is None
    assert count_rows(ledger, "charges") == 2


def test_idempotent_retry_returns_the_first_decision_without_a_second_charge(
    ledger: Ledger,
) -> None:
    first = ledger.charge("dev", "emoji", now=NOW, idempotency_key="k-1", request_hash="h1")
    again = ledger.charge("dev", "emoji", now=NOW, idempotency_key="k-1", request_hash="h1")
    assert first.accepted and again.accepted and again.replayed
    assert again.charge_id == first.charge_id
    assert count_rows(ledger, "charges") == 1
    with pytest.raises(IdempotencyConflict):
        ledger.charge("dev", "emoji", now=NOW, idempotency_key="k-1", request_hash="other")
    with pytest.raises(IdempotencyConflict):
        ledger.charge("dev", "health-types", now=NOW, idempotency_key="k-1", request_hash="h1")
    refused = ledger.charge("dev", "emoji", now=NOW, idempotency_key="k-2", request_hash="h2")
    replay = ledger.charge("dev", "emoji", now=NOW, idempotency_key="k-2", request_hash="h2")
    assert not refused.accepted and replay.reason == "daily_cap" and replay.replayed
    # the same key is per device
    assert ledger.charge("other", "emoji", now=NOW, idempotency_key="k-1").accepted


def test_on_accept_runs_in_the_same_transaction(ledger: Ledger) -> None:
    seen: list[Decision] = []

    def store(conn: Connection, decision: Decision) -> None:
        seen.append(decision)
        raise RuntimeError("report insert failed")

    with pytest.raises(RuntimeError):
        ledger.charge("dev", "emoji", now=NOW, on_accept=store)
    assert seen and count_rows(ledger, "charges") == 0
    assert count_rows(ledger, "accounts") == 0
    with pytest.raises(RuntimeError):
        ledger.charge("dev", "emoji", now=NOW, idempotency_key="x", on_accept=store)
    assert count_rows(ledger, "charges") == 0 and count_rows(ledger, "idempotency") == 0
    # a refused charge never calls on_accept
    assert ledger.charge("dev", "emoji", now=NOW).accepted
    calls: list[Decision] = []
    ledger.charge("dev", "emoji", now=NOW, on_accept=lambda c, d: calls.append(d))
    assert calls == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"device_id": ""}, "device_id"),
        ({"device_id": "x" * 257}, "device_id"),
        ({"device_id": 5}, "device_id"),
        ({"device_id": "bad\nid"}, "device_id"),
        ({"use_case": ""}, "use_case"),
        ({"now": datetime(2026, 11, 22)}, "now"),
        ({"now": "2026-11-22"}, "now"),
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"idempotency_key": "k" * 256}, "idempotency_key"),
    ],
)
def test_invalid_requests_write_nothing(
    ledger: Ledger, kwargs: dict[str, object], field: str
) -> None:
    args: dict[str, object] = {"device_id": "dev", "use_case": "emoji", "now": NOW}
    args.update(kwargs)
    with pytest.raises(InvalidRequest) as info:
        ledger.charge(
            args.pop("device_id"),  # type: ignore[arg-type]
            args.pop("use_case"),  # type: ignore[arg-type]
            **args,  # type: ignore[arg-type]
        )
    assert info.value.field == field
    assert count_rows(ledger, "charges") == 0 and count_rows(ledger, "accounts") == 0


def test_unknown_and_deleted_use_cases(ledger: Ledger) -> None:
    with pytest.raises(UnknownUseCase):
        ledger.charge("dev", "nope", now=NOW)
    ledger.policies.delete("emoji")
    with pytest.raises(UnknownUseCase):
        ledger.charge("dev", "emoji", now=NOW)


def test_raw_device_ids_never_reach_the_database(ledger: Ledger) -> None:
    device = "device-ABC-123-unique"
    ledger.charge(device, "emoji", now=NOW, idempotency_key="key")
    ledger.charge(device, "quicktype", now=NOW)
    with ledger.engine.connect() as conn:
        for table in ("charges", "accounts", "idempotency"):
            for row in conn.execute(text(f"SELECT * FROM {table}")):
                assert all(device not in str(v) for v in row), table
    assert len(ledger.device_key(device)) == 32


def test_each_charge_records_its_policy_version_and_changes_keep_spent_budget(
    ledger: Ledger,
) -> None:
    add_policy(ledger, epsilon_per_report=1.0, max_reports_per_day=3, window_epsilon_cap=5.0)
    assert ledger.charge("dev", "test-case", now=NOW).policy_version == 1
    ledger.policies.update("test-case", PolicyUpdate(epsilon_per_report=2.0), allow_loosen=True)
    d = ledger.charge("dev", "test-case", now=NOW)
    assert d.policy_version == 2 and d.epsilon == 2.0
    ledger.policies.update("test-case", PolicyUpdate(max_reports_per_day=1), allow_loosen=True)
    refused = ledger.charge("dev", "test-case", now=NOW)
    assert refused.reason == "daily_cap"  # two already spent today under the old cap
    with ledger.engine.connect() as conn:
        versions = conn.execute(select(Charge.policy_version).order_by(Charge.id)).scalars().all()  # type: ignore[call-overload]
    assert versions == [1, 2]
    status = {s.use_case: s for s in ledger.status("dev", now=NOW)}["test-case"]
    assert status.epsilon_window == 3.0 and status.reports_today == 2


def test_every_reader_gets_the_one_policy_book(ledger: Ledger) -> None:
    # one lookup: the ledger's readers get the gate's book, read again only after a change
    first = ledger.book()
    assert ledger.book() is first
    with ledger.engine.connect() as conn:
        assert ledger.gate.book(conn) is first
    ledger.policies.update("emoji", PolicyUpdate(max_reports_per_day=3), allow_loosen=True)
    ledger.policies.delete("health-types")
    book = ledger.book()
    assert book is not first and book.terms["emoji"].max_reports_per_day == 3
    assert "health-types" not in book.terms and not book.latest["health-types"].active
    names = [(p.name, p.version) for p in book.versions]  # every version, retired included
    assert names == sorted(names) and {("emoji", 1), ("emoji", 2), ("health-types", 2)} <= set(
        names
    )
    proposed = book.latest["emoji"].model_copy(update={"version": 3, "retention_days": 120})
    assert book.with_policy(proposed).longest_retention["emoji"] == 120


def test_status_reports_every_use_case(ledger: Ledger) -> None:
    ledger.charge("dev", "quicktype", now=NOW)
    status = {s.use_case: s for s in ledger.status("dev", now=NOW)}
    assert len(status) == 7
    q = status["quicktype"]
    assert (q.reports_today, q.reports_left_today, q.epsilon_today) == (1, 1, 8.0)
    assert q.next_reset == datetime(2026, 11, 23, tzinfo=UTC)
    assert status["emoji"].reports_left_today == 1


def test_quicktype_hundred_days(ledger: Ledger) -> None:
    start = NOW - timedelta(days=99)
    for day in range(100):
        for _ in range(3):
            ledger.charge("typist", "quicktype", now=start + timedelta(days=day))
    loss = device_loss(ledger, "typist", now=NOW)
    assert loss.window["quicktype"].epsilon_basic == 1440.0
    assert loss.lifetime["quicktype"].epsilon_basic == 1600.0
    assert loss.window["quicktype"].events == 180


def account_days(ledger: Ledger) -> list[int]:
    """Every day an account still holds."""
    return sorted(entry[0] for _, state in ledger.accounts() for entry in state.days)


def test_purge_deletes_exactly_what_left_the_window(ledger: Ledger) -> None:
    ledger.charge("dev", "health-types", now=NOW - timedelta(days=95))
    for offset in (91, 90, 89):
        ledger.charge(
            "dev", "emoji", now=NOW - timedelta(days=offset), idempotency_key=f"k{offset}"
        )
    day = int(NOW.timestamp() // 86_400)
    assert account_days(ledger) == [day - 95, day - 91, day - 90, day - 89]
    result = ledger.purge(now=NOW)
    assert (result.charges, result.daily_spend, result.idempotency) == (3, 3, 3)
    assert count_rows(ledger, "charges") == 1
    assert account_days(ledger) == [day - 89]
    lifetime = sum(n for _, _, _, _, n, _ in lifetime_rows(ledger))
    assert lifetime == 4  # lifetime totals survive
    assert ledger.purge(now=NOW) == type(result)(0, 0, 0)
    assert ledger.book().horizons == dict.fromkeys(
        (p.name for p in ledger.policies.list()), day - 90
    )


def test_a_charge_clears_its_days_past_the_horizon(ledger: Ledger) -> None:
    for offset in (91, 90, 89):
        ledger.charge("dev", "emoji", now=NOW - timedelta(days=offset))
    ledger.charge("other", "emoji", now=NOW - timedelta(days=91))
    day = int(NOW.timestamp() // 86_400)
    with ledger.engine.begin() as conn:  # the horizon as the purge sets it, accounts untouched
        conn.execute(text("INSERT INTO retention_horizons VALUES ('emoji', :d)"), {"d": day - 90})
    assert account_days(ledger) == [day - 91, day - 91, day - 90, day - 89]
    assert window_totals(ledger, now=NOW) == {ledger.device_key("dev"): 4.0}  # readers skip them
    ledger.charge("dev", "emoji", now=NOW)
    assert account_days(ledger) == [day - 91, day - 89, day]  # dev's were cleared on write
    assert ledger.purge(now=NOW).daily_spend == 1  # other's
    assert sorted(e for _, _, e, _, _, _ in lifetime_rows(ledger)) == [4_000_000, 4_000_000]
    assert sum(n for _, _, _, _, n, _ in lifetime_rows(ledger)) == 5


def test_one_device_thousand_concurrent_charges_admit_exactly_the_cap(ledger: Ledger) -> None:
    with ThreadPoolExecutor(max_workers=16) as pool:
        decisions = list(pool.map(lambda _: ledger.charge("hot", "emoji", now=NOW), range(1000)))
    assert sum(d.accepted for d in decisions) == 1
    assert count_rows(ledger, "charges") == 1


def test_many_devices_and_use_cases_concurrently_exact_totals(ledger: Ledger) -> None:
    use_cases = {"emoji": 1, "lookup-hints": 2, "quicktype": 2}
    attempts = [(f"dev-{d}", uc) for d in range(100) for uc in use_cases for _ in range(6)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        decisions = list(pool.map(lambda a: ledger.charge(a[0], a[1], now=NOW), attempts))
    assert sum(d.accepted for d in decisions) == 100 * sum(use_cases.values())
    with ledger.engine.connect() as conn:
        total = conn.execute(select(func.sum(Charge.epsilon_micro))).scalar_one()
    assert total == 100 * (1 * 4_000_000 + 2 * 4_000_000 + 2 * 8_000_000)


def test_concurrent_idempotent_retries_charge_once(ledger: Ledger) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        decisions = list(
            pool.map(
                lambda _: ledger.charge("dev", "quicktype", now=NOW, idempotency_key="same"),
                range(50),
            )
        )
    assert all(d.accepted for d in decisions)
    assert len({d.charge_id for d in decisions}) == 1
    assert count_rows(ledger, "charges") == 1


def test_population_accounting_window_and_lifetime(ledger: Ledger) -> None:
    for d in range(30):
        for back in reversed(range(1 + d % 3)):  # in date order
            ledger.charge(f"p{d}", "emoji", now=NOW - timedelta(days=back * 40))
    totals = window_totals(ledger, now=NOW, use_case="emoji")
    assert len(totals) == 30
    assert sorted(set(totals.values())) == [4.0, 8.0, 12.0]
    window = population_window_loss(ledger, now=NOW, use_case="emoji")
    lifetime = population_lifetime_loss(ledger, use_case="emoji")
    assert {loss.epsilon_basic for loss in window.values()} == {4.0, 8.0, 12.0}
    assert {loss.events for loss in lifetime.values()} == {1, 2, 3}
    assert ledger.accountant.hit_rate > 0.8  # 30 devices, 3 distinct ledgers
    both = devices_loss(ledger, ["p0", "p2"], now=NOW)
    assert both["p2"].window_total is not None and both["p2"].window_total.epsilon_basic == 12.0
    after = window_totals(ledger, now=NOW + timedelta(days=100))
    assert after == {}
    with pytest.raises(UnknownUseCase):
        window_totals(ledger, now=NOW, use_case="nope")


def test_a_database_with_old_format_device_keys_is_refused(ledger: Ledger) -> None:
    with ledger.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO accounts (device_key, count, epsilon_micro, days, lifetime)"
                " VALUES (:k, 1, 1, '[]', '[]')"
            ),
            {"k": "a" * 64},
        )
    with pytest.raises(RuntimeError, match="128-bit"):
        init_db(ledger.engine)


def test_charge_ids_are_never_reused_after_a_purge(ledger: Ledger) -> None:
    # Receipts and audit entries name charges by id: a purge that empties the table must not
    # let the next charge (single or batched) take an id that was already handed out.
    from dp_governor.budget.gate.charge import BatchItem, charge_batch

    old = NOW - timedelta(days=200)
    issued = [ledger.charge(f"dev-{i}", "emoji", now=old).charge_id for i in range(3)]
    batched = charge_batch(ledger.gate, [BatchItem("dev-9", "emoji")], now=old)
    assert isinstance(batched[0], Decision) and batched[0].accepted
    issued.append(batched[0].charge_id)
    assert ledger.purge(now=NOW).charges == 4 and count_rows(ledger, "charges") == 0
    single = ledger.charge("dev-0", "emoji", now=NOW).charge_id
    again = charge_batch(ledger.gate, [BatchItem("dev-1", "emoji")], now=NOW)
    assert isinstance(again[0], Decision)
    assert single is not None and again[0].charge_id is not None
    assert min(single, again[0].charge_id) > max(i for i in issued if i is not None)


def test_the_account_scan_pages_through_every_row_once(ledger: Ledger) -> None:
    for i in range(5):
        for use_case in ("emoji", "quicktype", "safari-energy-domains"):
            ledger.charge(f"dev-{i}", use_case, now=NOW)
    whole = [dk for dk, _ in ledger.accounts()]
    assert len(whole) == 5 and whole == sorted(whole)
    for chunk in (1, 2, 4, 5, 6):
        assert [dk for dk, _ in ledger.accounts(chunk=chunk)] == whole
    assert all(len(state.slots) == 3 for _, state in ledger.accounts())
    assert sorted(window_totals(ledger, now=NOW).values()) == [16.0] * 5  # emoji, quicktype, safari


def test_a_purge_leaves_an_account_charged_while_it_ran(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = NOW - timedelta(days=95)
    for i in range(3):
        ledger.charge(f"dev-{i}", "emoji", now=old)
    scan = ledger.accounts
    charged: list[str] = []

    def racing(**kwargs: object) -> Iterator[tuple[str, AccountState]]:
        for row in scan(**kwargs):  # type: ignore[arg-type]
            yield row
            if not charged:  # a charge lands between the purge's read and its write
                charged.append(row[0])
                assert ledger.charge("dev-x", "emoji", now=NOW).accepted  # another device
                devices = {ledger.device_key(f"dev-{i}"): f"dev-{i}" for i in range(3)}
                assert ledger.charge(devices[row[0]], "emoji", now=NOW).accepted

    monkeypatch.setattr(ledger, "accounts", racing)
    result = ledger.purge(now=NOW)
    assert result.daily_spend == 2  # the third was pruned by its own charge, not counted twice
    monkeypatch.undo()
    day = int(NOW.timestamp() // 86_400)
    assert account_days(ledger) == [day, day]  # dev-x's and the raced device's today
    assert sum(n for _, _, _, _, n, _ in lifetime_rows(ledger)) == 5

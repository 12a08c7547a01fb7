"""``audit verify`` checks each acceptance's ``n`` and ``spent`` against the ``charges`` rows.

A real ledger (SQLite, and PostgreSQL when configured). Honest ledgers of several devices, use
cases and days (relays' batches, a mid-day epsilon change, retention purges) verify, in full
and incrementally; a gate that writes one acceptance's ordinal or running spend wrong (the real
charge transaction, with ``charge_entry`` handed a tampered tally) fails both, naming
``charges``. A seeded random model explores histories beyond the listed cases: every honest
ledger is accepted and every single tampered ``n`` or ``spent`` rejected.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text

import dp_governor.budget.gate.charge as gate_charge
from dp_governor.budget import Ledger, utc_day
from dp_governor.budget.audit.log import Entry, Verification
from dp_governor.budget.audit.verify import StateReplay
from dp_governor.budget.gate.charge import BatchItem, charge_batch, charge_entry
from dp_governor.policies import PolicyUpdate
from tests.budget.audit.releases import entry_before_labels
from tests.conftest import SECRET

NOW = datetime(2026, 11, 22, 9, tzinfo=UTC)
USE_CASES = ("emoji", "quicktype", "lookup-hints")
DEVICES = [f"device-{i}" for i in range(5)]
Tamper = Callable[[int, int, int], tuple[int, int]]  # (n, spent, epsilon) -> written (n, spent)
TAMPERS: dict[str, Tamper] = {
    "spent one micro-epsilon low": lambda n, s, e: (n, s - 1),
    "spent one micro-epsilon high": lambda n, s, e: (n, s + 1),
    "spent of the charge alone": lambda n, s, e: (n, e if s != e else 2 * e),
    "spent zero": lambda n, s, e: (n, 0),
    "n one more": lambda n, s, e: (n + 1, s),
    "n one less": lambda n, s, e: (n - 1, s),
    "n and spent of the next charge": lambda n, s, e: (n + 1, s + e),
    "n and spent of the previous charge": lambda n, s, e: (n - 1, s - e),
}


def _generous(ledger: Ledger) -> None:
    """Room for several reports a day, so ordinals and running totals go past one."""
    for name in USE_CASES:
        ledger.policies.update(name, PolicyUpdate(max_reports_per_day=4), allow_loosen=True)


@contextmanager
def _dishonest_gate(tamper: Tamper) -> Iterator[list[int]]:
    """The gate writes the next acceptance's ``(n, spent)`` through ``tamper``; yields its day."""
    written: list[int] = []

    def entry(
        dk: str,
        decision: Any,
        terms: Any,
        idempotency: str | None = None,
        tally: tuple[int, int] | None = None,
    ) -> Entry:
        if tally is not None and not written:
            tally = tamper(tally[0], tally[1], int(terms.eps_micro))
            written.append(int(decision.day))
        return charge_entry(dk, decision, terms, idempotency, tally)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gate_charge, "charge_entry", entry)
        yield written


def _record(ledger: Ledger, *, full: bool, when: datetime) -> Verification:
    """One verification, recorded as the ``verify`` job records it."""
    verdict, state = ledger.verify(full=full)
    ledger.verdicts.record(
        now=when, full=full, from_seq=verdict.from_seq, problem=verdict.problem, resume=state.resume
    )
    return verdict


def _checkpoint(ledger: Ledger, when: datetime) -> None:
    """The checkpoint job: the chain's head and the transparency log signed."""
    ledger.audit.checkpoint(now=when)
    ledger.tlog.sync()


def _days(ledger: Ledger, rng: np.random.Generator, start: datetime, days: int) -> datetime:
    """Random reports over ``days`` days from ``start``: single and batched, epsilon changed."""
    when = start
    for day in range(days):
        when = start + timedelta(days=day)
        for step in range(int(rng.integers(10, 25))):
            if day == 1 and step == 4:
                ledger.policies.update("emoji", PolicyUpdate(epsilon_per_report=3.0))
            if rng.random() < 0.3:  # a relay's batch: a device may repeat in it
                items = [
                    BatchItem(str(rng.choice(DEVICES)), str(rng.choice(USE_CASES)))
                    for _ in range(int(rng.integers(2, 7)))
                ]
                charge_batch(ledger.gate, items, now=when)
            else:
                ledger.charge(str(rng.choice(DEVICES)), str(rng.choice(USE_CASES)), now=when)
    return when


def _tallied(ledger: Ledger) -> int:
    """How many acceptances carry an ``n`` of 2 or more (the running sums that were checked)."""
    with ledger.connect() as conn:
        bodies = conn.execute(text("SELECT body FROM audit_log WHERE action = 'charge'")).scalars()
        return sum(1 for b in bodies if (orjson.loads(b)["data"].get("n") or 0) >= 2)


def test_several_devices_use_cases_and_days_verify(ledger: Ledger) -> None:
    _generous(ledger)
    when = _days(ledger, np.random.default_rng(7), NOW, 3)
    assert _tallied(ledger) > 5
    _checkpoint(ledger, when)
    assert _record(ledger, full=False, when=when).ok
    _days(ledger, np.random.default_rng(8), when, 2)
    _checkpoint(ledger, when + timedelta(days=1))
    incremental = _record(ledger, full=False, when=when)
    full = _record(ledger, full=True, when=when)
    assert incremental.ok and incremental.from_seq > 0, incremental
    assert full.ok, full


@pytest.mark.parametrize("kind", sorted(TAMPERS))
def test_a_wrong_n_or_spent_written_by_the_gate_fails_full_and_incremental(
    ledger: Ledger, kind: str
) -> None:
    _generous(ledger)
    for device in ("a", "b"):
        ledger.charge(device, "emoji", now=NOW)
    _checkpoint(ledger, NOW)
    assert _record(ledger, full=False, when=NOW).ok
    ledger.charge("a", "emoji", now=NOW)  # a's second emoji: n 2, spent 8.0
    with _dishonest_gate(TAMPERS[kind]) as tampered:
        assert ledger.charge("a", "emoji", now=NOW).accepted  # its third
    assert tampered == [utc_day(NOW)]
    ledger.charge("c", "emoji", now=NOW)
    _checkpoint(ledger, NOW)
    for full in (False, True):
        verdict = _record(ledger, full=full, when=NOW)
        assert not verdict.ok, (full, verdict)
        assert str(verdict.problem).startswith("charges: the n or spent"), verdict.problem
        assert "'emoji'" in str(verdict.problem)


def test_an_acceptance_without_n_after_labels_began_fails(ledger: Ledger) -> None:
    ledger.charge("a", "emoji", now=NOW)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gate_charge, "charge_entry", entry_before_labels)
        ledger.charge("b", "quicktype", now=NOW)
    verdict, _ = ledger.verify()
    assert not verdict.ok and "without its n and spent" in str(verdict.problem), verdict


def test_days_anentry_before_labels_charged_are_not_compared_and_later_ones_are(
    ledger: Ledger,
) -> None:
    _generous(ledger)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gate_charge, "charge_entry", entry_before_labels)
        ledger.charge("a", "emoji", now=NOW)
    ledger.charge("a", "emoji", now=NOW)  # n 2 counts the earlier release's charge
    ledger.charge("a", "quicktype", now=NOW)
    assert ledger.verify()[0].ok
    with _dishonest_gate(TAMPERS["spent zero"]):
        ledger.charge("a", "quicktype", now=NOW)  # a day the earlier release did not charge
    verdict, _ = ledger.verify()
    assert not verdict.ok and "'quicktype'" in str(verdict.problem), verdict


def test_a_replay_resumed_from_a_snapshot_without_tallies_skips_the_days_it_had_replayed(
    ledger: Ledger,
) -> None:
    """A verdict recorded before this check resumes: its days' earlier entries were not replayed."""
    _generous(ledger)
    ledger.charge("a", "emoji", now=NOW)
    replay = StateReplay(SECRET)
    assert ledger.audit.verify(observe=replay).ok
    seq = ledger.audit.head()[0]
    snapshot = json.loads(replay.snapshot())  # digests are 256-bit integers: not orjson
    for name in ("tallies", "untallied", "labelled"):
        del snapshot[name]
    ledger.charge("a", "emoji", now=NOW)  # n 2: its first was before the snapshot
    ledger.charge("a", "emoji", now=NOW + timedelta(days=1))
    for old in (False, True):
        state = replay.snapshot() if not old else json.dumps(snapshot)
        resumed = StateReplay.restore(SECRET, state)
        with ledger.connect() as conn:
            rows = conn.execute(
                text("SELECT seq, actor, action, body FROM audit_log WHERE seq > :s ORDER BY seq"),
                {"s": seq},
            ).all()
        for row in rows:
            resumed(int(row[0]), str(row[1]), str(row[2]), str(row[3]))
        check = resumed.compare(ledger.engine)
        assert check.checked and check.problem is None, (old, check)
        assert resumed.untallied == (set(replay.accepted) if old else set())


def _history(ledger: Ledger, rng: np.random.Generator, when: datetime, steps: int) -> datetime:
    """Random charges, batches, checkpoints, purges and verifications; every verdict accepts."""
    for _ in range(steps):
        step = rng.random()
        if step < 0.55:
            when += timedelta(hours=int(rng.choice((0, 0, 1, 8, 24, 30))))
            ledger.charge(str(rng.choice(DEVICES)), str(rng.choice(USE_CASES)), now=when)
        elif step < 0.7:
            items = [
                BatchItem(str(rng.choice(DEVICES)), str(rng.choice(USE_CASES)))
                for _ in range(int(rng.integers(2, 6)))
            ]
            charge_batch(ledger.gate, items, now=when)
        elif step < 0.75:
            when += timedelta(days=int(rng.integers(85, 100)))  # past the 90-day retention
            ledger.purge(now=when)
        elif step < 0.9:
            _checkpoint(ledger, when)
        else:
            full = bool(rng.random() < 0.5)
            verdict = _record(ledger, full=full, when=when)
            assert verdict.ok, (full, verdict)
    return when


@pytest.mark.parametrize("seed", range(8))
def test_random_histories_verify_and_any_single_tampered_tally_is_rejected(
    ledger: Ledger, seed: int
) -> None:
    rng = np.random.default_rng([33, seed])
    _generous(ledger)
    when = _history(ledger, rng, NOW, 40)
    _checkpoint(ledger, when)
    assert _record(ledger, full=False, when=when).ok
    assert _record(ledger, full=True, when=when).ok
    # a second charge of one device and use case today, then one tampered acceptance
    device, use_case = str(rng.choice(DEVICES)), str(rng.choice(USE_CASES))
    ledger.charge(device, use_case, now=when)
    kind = sorted(TAMPERS)[int(rng.integers(len(TAMPERS)))]
    with _dishonest_gate(TAMPERS[kind]) as tampered:
        for _ in range(20):  # until one is accepted (the daily caps may refuse some)
            if ledger.charge(str(rng.choice(DEVICES)), use_case, now=when).accepted:
                break
    assert tampered, "no acceptance to tamper with"
    for _ in range(int(rng.integers(6))):  # more honest reports the same day
        ledger.charge(str(rng.choice(DEVICES)), str(rng.choice(USE_CASES)), now=when)
    _checkpoint(ledger, when)
    incremental = _record(ledger, full=False, when=when)
    full = _record(ledger, full=True, when=when)
    for verdict in (incremental, full):
        assert not verdict.ok, (kind, verdict)
        assert str(verdict.problem).startswith("charges: the n or spent"), (kind, verdict)


@given(
    dk=st.text(), uc=st.text(), day=st.integers(0, 1 << 20), n=st.integers(1, 10**6),
    spent=st.integers(0, 10**12),
)  # fmt: skip
def test_the_direct_spent_hash_is_the_general_keyed_hash(
    dk: str, uc: str, day: int, n: int, spent: int
) -> None:
    replay = StateReplay(SECRET)
    assert replay._spent(dk, uc, day, n, spent) == replay.h("s", dk, uc, day, n, spent)

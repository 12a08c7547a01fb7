"""Incremental verification: from the last accepted verdict's signed checkpoint, as full would.

A model of random histories (charges on advancing days, checkpoints, verifications) checks
that the incremental verdict equals the full one at every step, and then after one random edit
of the database: equal, except where docs/audit.md says the edit is not the incremental run's
business (an entry before its start, a charge on a day before the first day its new entries
touch), where the full replay alone catches it. A tampered starting checkpoint, a rewritten
entry at the start, a forged verdict and a truncation behind the start fail. SQLite and
PostgreSQL.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import orjson
import pytest
from sqlalchemy import text

from dp_governor.budget import Ledger
from dp_governor.budget.audit.log import Verification, chain_hash

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
USE_CASES = ("emoji", "safari-energy-domains")


def _drop_append_only(ledger: Ledger) -> None:
    """What a writer without the key can do to the database: drop the log's triggers."""
    with ledger.engine.begin() as conn:
        for table in ("audit_log", "audit_checkpoints"):
            if ledger.engine.dialect.name == "sqlite":
                for op in ("update", "delete"):
                    conn.execute(text(f"DROP TRIGGER IF EXISTS {table}_no_{op}"))
            else:
                conn.execute(text(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}"))


def _verify(ledger: Ledger, *, full: bool) -> Verification:
    """The ledger's verification, recorded as the service records it (the pipeline aside)."""
    verdict, state = ledger.verify(full=full)
    ledger.verdicts.record(
        now=NOW, full=full, from_seq=verdict.from_seq, problem=verdict.problem, resume=state.resume
    )
    return verdict


def _both(ledger: Ledger) -> tuple[Verification, Verification]:
    """The incremental verdict, then the full one."""
    return _verify(ledger, full=False), _verify(ledger, full=True)


def _checkpoint(ledger: Ledger, when: datetime) -> None:
    """The checkpoint job's two signatures: the chain's head and the transparency log's."""
    ledger.audit.checkpoint(now=when)
    ledger.tlog.sync()


def _start(ledger: Ledger) -> int:
    """The entry the next incremental verification starts after (0: none recorded)."""
    found = ledger.verdicts.last()
    return 0 if found is None else found[0].checkpoint.seq


def _first_new_day(ledger: Ledger, after: int) -> int | None:
    """The first day a charge entry after ``after`` names (what the charges check reads from)."""
    with ledger.engine.connect() as conn:
        bodies = conn.execute(
            text("SELECT body FROM audit_log WHERE seq > :s AND action = 'charge'"), {"s": after}
        ).scalars()
        days = [int(orjson.loads(b)["data"]["day"]) for b in bodies]
    return min(days, default=None)


def _history(
    ledger: Ledger, rng: np.random.Generator, steps: int, when: datetime = NOW
) -> datetime:
    """Random charges from ``when`` on, checkpoints and verifications; both verdicts accept."""
    for _ in range(steps):
        step = rng.random()
        if step < 0.6:
            when += timedelta(days=int(rng.choice((0, 0, 1, 2))))
            device = f"device-{int(rng.integers(6))}"
            ledger.charge(device, str(rng.choice(USE_CASES)), now=when)
        elif step < 0.85:
            _checkpoint(ledger, when)
        else:
            incremental, full = _both(ledger)
            assert incremental.ok and full.ok, (incremental, full)
    return when


TAMPERS = ("entry", "charge", "account", "policy")


def _tamper(ledger: Ledger, kind: str, rng: np.random.Generator) -> bool:
    """Apply one edit; returns whether the incremental verification must catch it."""
    start = _start(ledger)
    _drop_append_only(ledger)
    with ledger.engine.begin() as conn:
        if kind == "entry":
            head = int(conn.execute(text("SELECT max(seq) FROM audit_log")).scalar_one())
            seq = int(rng.integers(1 if rng.random() < 0.5 else max(start, 1), head + 1))
            conn.execute(text("UPDATE audit_log SET body = body || ' ' WHERE seq = :s"), {"s": seq})
            return seq >= start
        if kind == "charge":
            charge_id, day = conn.execute(
                text("SELECT id, day FROM charges ORDER BY random() LIMIT 1")
            ).one()
            conn.execute(
                text("UPDATE charges SET epsilon_micro = epsilon_micro + 1 WHERE id = :i"),
                {"i": charge_id},
            )
        elif kind == "account":
            conn.execute(text("UPDATE accounts SET days = '[]'"))
            return True
        else:
            conn.execute(text("UPDATE policies SET max_reports_per_day = 99"))
            return True
    first = _first_new_day(ledger, start) if start else int(day)
    return first is not None and int(day) >= first


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kind", TAMPERS)
def test_incremental_equals_full_under_random_histories_and_edits(
    ledger: Ledger, seed: int, kind: str
) -> None:
    rng = np.random.default_rng([seed, TAMPERS.index(kind)])
    when = _history(ledger, rng, 30)
    ledger.charge("device-0", "emoji", now=when)  # at least one charge to edit
    _checkpoint(ledger, when)
    incremental, full = _both(ledger)
    assert incremental.ok and full.ok
    _history(ledger, rng, int(rng.integers(8)), when)
    caught = _tamper(ledger, kind, rng)
    incremental = _verify(ledger, full=False)
    full = _verify(ledger, full=True)
    assert not full.ok
    if caught:
        assert not incremental.ok and incremental.first_bad == full.first_bad
        if kind != "entry":  # an entry: the start's own check words it otherwise
            assert incremental.problem == full.problem
    else:  # not its business: docs/audit.md
        assert incremental.ok, incremental


def _verified_at_checkpoint(ledger: Ledger) -> int:
    for device in ("a", "b", "c"):
        ledger.charge(device, "emoji", now=NOW)
    _checkpoint(ledger, NOW)
    ledger.charge("d", "emoji", now=NOW)
    first = _verify(ledger, full=False)
    assert first.ok and first.from_seq == 0
    start = _start(ledger)
    assert start > 0
    return start


def test_the_next_run_starts_at_the_checkpoint_and_replays_only_what_follows(
    ledger: Ledger,
) -> None:
    start = _verified_at_checkpoint(ledger)
    ledger.charge("e", "emoji", now=NOW + timedelta(days=1))
    again = _verify(ledger, full=False)
    assert again.ok and again.from_seq == start
    head = ledger.audit.head()[0]
    assert again.entries == head - start and again.head_seq == head


def test_a_tampered_starting_checkpoint_fails(ledger: Ledger) -> None:
    start = _verified_at_checkpoint(ledger)
    _drop_append_only(ledger)
    with ledger.engine.begin() as conn:
        conn.execute(
            text("UPDATE audit_checkpoints SET at = '2020-01-01T00:00:00+00:00' WHERE seq = :s"),
            {"s": start},
        )
    verdict = _verify(ledger, full=False)
    assert not verdict.ok and verdict.first_bad == start and "signature" in str(verdict.problem)


def test_an_entry_rewritten_at_the_start_fails(ledger: Ledger) -> None:
    start = _verified_at_checkpoint(ledger)
    _drop_append_only(ledger)
    with ledger.engine.begin() as conn:  # its body edited and its hash recomputed, without the key
        prev, body = conn.execute(
            text("SELECT prev_hash, body FROM audit_log WHERE seq = :s"), {"s": start}
        ).one()
        body = body.replace('"emoji"', '"emojj"')
        conn.execute(
            text("UPDATE audit_log SET body = :b, hash = :h WHERE seq = :s"),
            {"b": body, "h": chain_hash(prev, body), "s": start},
        )
    verdict = _verify(ledger, full=False)
    assert not verdict.ok and verdict.first_bad == start and "rewritten" in str(verdict.problem)


def test_an_edited_entry_before_the_start_is_left_to_the_full_replay(ledger: Ledger) -> None:
    start = _verified_at_checkpoint(ledger)
    _drop_append_only(ledger)
    with ledger.engine.begin() as conn:
        conn.execute(
            text("UPDATE audit_log SET body = body || ' ' WHERE seq = :s"), {"s": start - 1}
        )
    assert _verify(ledger, full=False).ok
    full = _verify(ledger, full=True)
    assert not full.ok and full.first_bad == start - 1


@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE audit_verifications SET seq = 1, hash = NULL",
        "UPDATE audit_verifications SET state = replace(state, 'lifetime', 'lifetime ')",
    ],
)
def test_a_forged_verdict_fails_naming_the_table(ledger: Ledger, edit: str) -> None:
    _verified_at_checkpoint(ledger)
    with ledger.engine.begin() as conn:
        conn.execute(text(edit))
    verdict = _verify(ledger, full=False)
    assert not verdict.ok and str(verdict.problem).startswith("audit_verifications:")


def test_only_the_newest_accepted_verdict_keeps_its_state(ledger: Ledger) -> None:
    _verified_at_checkpoint(ledger)
    ledger.charge("e", "emoji", now=NOW)
    _checkpoint(ledger, NOW)
    assert _verify(ledger, full=False).ok
    with ledger.engine.connect() as conn:
        kept = conn.execute(
            text("SELECT count(*) FROM audit_verifications WHERE state IS NOT NULL")
        ).scalar_one()
        verdicts = conn.execute(text("SELECT count(*) FROM audit_verifications")).scalar_one()
    assert (kept, verdicts) == (1, 2)


def test_a_log_truncated_behind_the_start_fails(ledger: Ledger) -> None:
    start = _verified_at_checkpoint(ledger)
    _drop_append_only(ledger)
    with ledger.engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_log WHERE seq >= :s"), {"s": start})
        conn.execute(text("DELETE FROM audit_checkpoints WHERE seq >= :s"), {"s": start})
    verdict = _verify(ledger, full=False)
    assert not verdict.ok and verdict.first_bad == start

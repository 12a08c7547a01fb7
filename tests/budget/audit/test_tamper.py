"""Tamper evidence over everything that decides: each edit of the database is caught by verify.

A ledger with charges, policy edits and a purge is verified clean; then one edit a database
writer could make (without the audit key) is applied and ``Ledger.verify`` must fail naming what
disagrees. Run on SQLite and PostgreSQL.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from dp_governor.budget import Ledger
from dp_governor.budget.audit.log import read_checkpoints, write_checkpoints
from dp_governor.policies import PolicyUpdate

NOW = datetime(2026, 11, 22, 15, 30, tzinfo=UTC)


def _history(ledger: Ledger) -> None:
    ledger.policies.update("emoji", PolicyUpdate(group_size=2))
    for back in (120, 3, 1, 0):
        for device in ("a", "b"):
            ledger.charge(device, "emoji", now=NOW - timedelta(days=back))
            ledger.charge(device, "safari-energy-domains", now=NOW - timedelta(days=back))
    ledger.purge(now=NOW)


LAST = "(SELECT max(id) FROM charges)"
TAMPERS = {
    "a charge's epsilon": [f"UPDATE charges SET epsilon_micro = 1 WHERE id = {LAST}"],
    "a deleted charge": ["DELETE FROM charges WHERE id = (SELECT min(id) FROM charges)"],
    "an added charge": [
        "INSERT INTO charges (device_key, use_case, budget, policy_version, epsilon_micro, day)"
        " SELECT device_key, use_case, budget, policy_version, epsilon_micro, day FROM charges"
        " WHERE id = (SELECT max(id) FROM charges)"
    ],
    "an account reset": [
        "UPDATE accounts SET count = 0, epsilon_micro = 0, days = '[]', lifetime = '[]'"
    ],
    "an account's days emptied": ["UPDATE accounts SET days = '[]'"],
    "a deleted account": ["DELETE FROM accounts"],
    "a policy edited in place": [
        "UPDATE policies SET max_reports_per_day = 100 WHERE name = 'emoji'"
    ],
    "a policy version deleted": ["DELETE FROM policies WHERE name = 'emoji' AND version = 2"],
    "a horizon moved back": ["DELETE FROM retention_horizons"],
}  # fmt: skip


def test_an_untouched_ledger_verifies(ledger: Ledger) -> None:
    _history(ledger)
    verdict, state = ledger.verify()
    assert verdict.ok and verdict.state_checked, verdict
    assert sum(state.accepted.values()) == 12  # 16 accepted, the 4 of 120 days ago purged


@pytest.mark.parametrize("edit", sorted(TAMPERS))
def test_every_edit_of_the_deciding_state_is_caught(ledger: Ledger, edit: str) -> None:
    _history(ledger)
    with ledger.engine.begin() as conn:
        for statement in TAMPERS[edit]:
            conn.execute(text(statement))
    verdict, _ = ledger.verify()
    assert not verdict.ok and verdict.problem, edit


def _drop_append_only(ledger: Ledger) -> None:
    with ledger.engine.begin() as conn:
        if ledger.engine.dialect.name == "sqlite":
            for table in ("audit_log", "audit_checkpoints"):
                for op in ("update", "delete"):
                    conn.execute(text(f"DROP TRIGGER {table}_no_{op}"))
        else:
            for table in ("audit_log", "audit_checkpoints"):
                conn.execute(text(f"DROP TRIGGER {table}_append_only ON {table}"))


def test_truncation_to_an_earlier_checkpoint_is_caught_by_a_kept_copy(
    ledger: Ledger, tmp_path: Path
) -> None:
    kept = tmp_path / "checkpoints.jsonl"
    ledger.charge("a", "emoji", now=NOW)
    first = ledger.audit.checkpoint(now=NOW)
    assert first is not None
    write_checkpoints(ledger.audit.checkpoints(), kept)
    ledger.charge("b", "emoji", now=NOW)
    ledger.charge("c", "emoji", now=NOW)
    assert ledger.audit.checkpoint(now=NOW) is not None
    assert write_checkpoints(ledger.audit.checkpoints(), kept) == 1  # only the new one
    # a writer without the key rolls everything back to the first checkpoint, consistently
    _drop_append_only(ledger)
    with ledger.engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_log WHERE seq > :s"), {"s": first.seq})
        conn.execute(text("DELETE FROM audit_checkpoints WHERE seq > :s"), {"s": first.seq})
        conn.execute(
            text("UPDATE audit_head SET seq = :s, hash = :h"), {"s": first.seq, "h": first.hash}
        )
        conn.execute(text("DELETE FROM charges WHERE id > (SELECT min(id) FROM charges)"))
        conn.execute(text("DELETE FROM accounts WHERE count > 0 AND device_key NOT IN"
                          " (SELECT device_key FROM charges)"))  # fmt: skip
    alone, _ = ledger.verify()
    assert alone.ok  # the database agrees with itself: only a copy kept elsewhere can tell
    verdict, _ = ledger.verify(kept=read_checkpoints(kept))
    assert not verdict.ok and "truncated" in str(verdict.problem)
    assert verdict.kept_checkpoints == 2


def test_a_forged_kept_checkpoint_is_refused(ledger: Ledger, tmp_path: Path) -> None:
    ledger.charge("a", "emoji", now=NOW)
    assert ledger.audit.checkpoint(now=NOW) is not None
    kept = tmp_path / "checkpoints.jsonl"
    write_checkpoints(ledger.audit.checkpoints(), kept)
    kept.write_text(kept.read_text().replace('"seq":', '"seq":1', 1), encoding="utf-8")
    verdict, _ = ledger.verify(kept=read_checkpoints(kept))
    assert not verdict.ok and "signature" in str(verdict.problem)

"""Every table whose content decides or is published: each direct edit fails verify, naming it.

A service's database is built the way the service builds it (charges with idempotency keys,
a refusal, policy and device-wide budget versions, the jobs' flush, fold and purge, reports
left in the inbox, a checkpoint) and verifies clean. Then one edit a database writer could
make without the audit key is applied, and ``verify`` (the service's, as ``GET
/v1/audit/verify`` runs it) must fail with a problem naming the edited table. On SQLite and
PostgreSQL. docs/audit.md lists how each table is covered, and the tables left out.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, text

from dp_governor.api._integrity import pipeline_problem, verify_service
from dp_governor.api.database import init_service_db
from dp_governor.api.jobs import RUNTIMES, Runtime, run_job
from dp_governor.budget import Decision, FixedClock, Ledger, utc_day
from dp_governor.pipeline.ingest import Ingestor, SubmitRequest
from dp_governor.pipeline.seal import InboxSeal
from dp_governor.policies import PolicyCreate, PolicyUpdate, mechanism_for
from dp_governor.policies.device import DeviceBudgetCreate

SECRET = b"matrix-secret-matrix-secret-matrix!!"
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
TINY = PolicyCreate.model_validate(
    {
        "name": "tiny",
        "mechanism": "cms",
        "k": 16,
        "m": 64,
        "epsilon_per_report": 1.0,
        "max_reports_per_day": 5,
        "retention_days": 30,
        "min_batch_devices": 2,
    }
)


def _submit(ingestor: Ingestor, n: int, first: int, now: datetime, *, seed: int) -> None:
    """``n`` keyed reports of ``tiny`` from devices ``first..``; device 0 once too many."""
    bodies = mechanism_for(TINY).privatize(
        [f"v{i % 5}" for i in range(n + 1)], rng=np.random.default_rng(seed)
    )
    devices = [f"dev-{first + i}" for i in range(n)] + [f"dev-{first}"]
    requests = [
        SubmitRequest("tiny", device, body, f"key-{seed}-{i}")
        for i, (device, body) in enumerate(zip(devices, bodies.to_dicts(), strict=True))
    ]
    results = ingestor.submit_group(requests, now=now)
    assert all(isinstance(r, Decision) for r in results), results


@pytest.fixture
def ledger(engine: Engine) -> Ledger:
    """A database as the service leaves it, verifying clean."""
    init_service_db(engine)
    led = Ledger(engine, SECRET)
    led.policies.ensure_defaults()
    led.policies.create(TINY)
    led.policies.update("tiny", PolicyUpdate(description="the second version"), actor="admin")
    led.set_device_budget(DeviceBudgetCreate(epsilon_per_day=100.0, quotas={"tiny": 0.5}))
    ingestor = Ingestor(led, SECRET, seal=SEAL)
    clock = FixedClock(NOW - timedelta(days=1))
    RUNTIMES["matrix"] = Runtime(led, ingestor, clock, shuffle_batch=20, min_batch=1)
    try:
        for n, seed in ((30, 1), (50, 2)):  # yesterday's and today's reports, flushed, folded
            _submit(ingestor, n, 0 if seed == 1 else 100, clock.now(), seed=seed)
            assert run_job("aggregate", "matrix") is not None
            if seed == 1:
                clock.advance(days=1)
        assert run_job("purge", "matrix") is not None
        _submit(ingestor, 8, 200, clock.now(), seed=3)  # left in the inbox
        assert run_job("checkpoint", "matrix") is not None
    finally:
        RUNTIMES.pop("matrix", None)
    verdict = verify_service(led, now=NOW, kept=[], seal=SEAL)
    assert verdict.ok and verdict.state_checked, verdict
    return led


SEAL = InboxSeal([b"shuffler-key-for-tests-shuffler-key-for-tests"])
FIRST = "(SELECT min(id) FROM {t})"
LAST = "(SELECT max(id) FROM {t})"
EDITS: dict[str, tuple[str, str]] = {
    # table edited: the statement
    "a charge's epsilon": ("charges", "UPDATE charges SET epsilon_micro = 1 WHERE id = " + LAST),
    "a charge deleted": ("charges", "DELETE FROM charges WHERE id = " + FIRST),
    "a charge added": (
        "charges",
        "INSERT INTO charges (device_key, use_case, budget, policy_version, epsilon_micro, day)"
        " SELECT device_key, use_case, budget, policy_version, epsilon_micro, day FROM charges"
        " WHERE id = " + LAST,
    ),
    "an account reset": (
        "accounts",
        "UPDATE accounts SET count = 0, epsilon_micro = 0, days = '[]', lifetime = '[]'",
    ),
    "an account's days emptied": ("accounts", "UPDATE accounts SET days = '[]'"),
    "an account deleted": ("accounts", "DELETE FROM accounts"),
    "a policy edited in place": (
        "policies",
        "UPDATE policies SET max_reports_per_day = 100 WHERE name = 'tiny' AND version = 2",
    ),
    "a policy version deleted": (
        "policies",
        "DELETE FROM policies WHERE name = 'tiny' AND version = 2",
    ),
    "the device-wide budget raised in place": (
        "device_budgets",
        "UPDATE device_budgets SET epsilon_per_day = 1000",
    ),
    "a device-wide quota edited": (
        "device_budgets",
        "UPDATE device_budgets SET quotas = '{\"tiny\": 1.0}'",
    ),
    "the device-wide budget deleted": ("device_budgets", "DELETE FROM device_budgets"),
    "a device-wide budget version added": (
        "device_budgets",
        "INSERT INTO device_budgets (version, epsilon_per_day, quotas, created_at, actor)"
        " SELECT version + 1, epsilon_per_day * 2, quotas, created_at, actor"
        " FROM device_budgets",
    ),
    "a horizon moved back": (
        "retention_horizons",
        "UPDATE retention_horizons SET through_day = through_day - 1",
    ),
    "the horizons deleted": ("retention_horizons", "DELETE FROM retention_horizons"),
    "an idempotency record deleted (its retry charged again)": (
        "idempotency",
        "DELETE FROM idempotency WHERE key = (SELECT min(key) FROM idempotency"
        " WHERE decision LIKE '%\"accepted\": true%')",
    ),
    "an idempotency record's decision edited": (
        "idempotency",
        "UPDATE idempotency SET decision = REPLACE(decision, '\"accepted\": true',"
        " '\"accepted\": false') WHERE key = (SELECT min(key) FROM idempotency"
        " WHERE decision LIKE '%\"accepted\": true%')",
    ),
    "an idempotency record's key edited": (
        "idempotency",
        "UPDATE idempotency SET key = 'ffff' || key WHERE key = (SELECT min(key) FROM idempotency)",
    ),
    "an idempotency record's request edited": (
        "idempotency",
        "UPDATE idempotency SET request_hash = 'ffff' WHERE key = (SELECT min(key) FROM"
        " idempotency)",
    ),
    "an idempotency record forged": (
        "idempotency",
        "INSERT INTO idempotency (device_key, key, request_hash, day, decision, use_case)"
        " SELECT device_key, 'eeee' || key, request_hash, day, decision, use_case"
        " FROM idempotency WHERE key = (SELECT min(key) FROM idempotency)",
    ),
    "an inbox report swapped for another's (sealed bytes)": (
        "inbox",
        "UPDATE inbox SET sealed = (SELECT i2.sealed FROM inbox i2"
        " WHERE i2.sealed <> inbox.sealed ORDER BY i2.id LIMIT 1) WHERE id = "
        + FIRST.format(t="inbox"),
    ),
    "an inbox row moved to another day": (
        "inbox",
        "UPDATE inbox SET day = day - 1 WHERE id = " + FIRST.format(t="inbox"),
    ),
    "a stored report's tag removed": (
        "reports",
        "UPDATE reports SET tag = NULL WHERE id = " + FIRST.format(t="reports"),
    ),
    "an inbox row deleted": ("inbox", "DELETE FROM inbox WHERE id = " + FIRST.format(t="inbox")),
    "an inbox row copied": (
        "inbox",
        "INSERT INTO inbox (id, use_case, params, day, payload, device_tag, sealed, tag)"
        " SELECT id + 1, use_case, params, day, payload, device_tag, sealed, tag FROM inbox"
        " WHERE id = " + LAST.format(t="inbox"),
    ),
    "a stored payload forged": (
        "reports",
        'UPDATE reports SET payload = REPLACE(payload, \'"bits":"\', \'"bits":"AA\') WHERE id = '
        + FIRST.format(t="reports"),
    ),
    "a stored payload swapped for another's": (
        "reports",
        "UPDATE reports SET payload = (SELECT r2.payload FROM reports r2"
        " WHERE r2.payload <> reports.payload ORDER BY r2.id LIMIT 1) WHERE id = "
        + FIRST.format(t="reports"),
    ),
    "a stored report moved to another day": (
        "reports",
        "UPDATE reports SET day = day - 1 WHERE id = " + LAST.format(t="reports"),
    ),
    "a stored report deleted": (
        "reports",
        "DELETE FROM reports WHERE id = " + FIRST.format(t="reports"),
    ),
    "a stored report copied": (
        "reports",
        "INSERT INTO reports (id, use_case, params, day, payload, batch, tag)"
        " SELECT substr(id, 1, 31) || 'x', use_case, params, day, payload, batch, tag FROM reports"
        " WHERE id = " + LAST.format(t="reports"),
    ),
    "a part marked unfolded (the fold would add it again)": (
        "batch_parts",
        "UPDATE batch_parts SET folded = false WHERE batch = (SELECT min(batch) FROM batch_parts)",
    ),
    "a part's count edited": (
        "batch_parts",
        "UPDATE batch_parts SET reports = reports + 1 WHERE batch = (SELECT min(batch) FROM"
        " batch_parts)",
    ),
    "a part deleted": (
        "batch_parts",
        "DELETE FROM batch_parts WHERE batch = (SELECT min(batch) FROM batch_parts)",
    ),
    "a part forged": (
        "batch_parts",
        "INSERT INTO batch_parts (batch, params, day, use_case, reports, folded, charge_days)"
        " SELECT batch + 1, params, day, use_case, reports, folded, charge_days FROM batch_parts"
        " WHERE batch = (SELECT min(batch) FROM batch_parts)",
    ),
    "a sketch's count edited": ("sketches", "UPDATE sketches SET n = n + 1"),
    "a sketch swapped for another day's": (
        "sketches",
        "UPDATE sketches SET state = (SELECT s2.state FROM sketches s2"
        " WHERE s2.day <> sketches.day LIMIT 1) WHERE day = (SELECT min(day) FROM sketches)",
    ),
    "a sketch deleted": (
        "sketches",
        "DELETE FROM sketches WHERE day = (SELECT min(day) FROM sketches)",
    ),
    "a sketch forged": (
        "sketches",
        "INSERT INTO sketches (use_case, params, day, n, state)"
        " SELECT use_case, params, day + 5, n, state FROM sketches"
        " WHERE day = (SELECT min(day) FROM sketches)",
    ),
    "a batch's devices inflated": (
        "shuffled_batches",
        "UPDATE shuffled_batches SET devices = devices * 100 WHERE id = "
        + FIRST.format(t="shuffled_batches"),
    ),
    "a batch's local epsilon edited": (
        "shuffled_batches",
        "UPDATE shuffled_batches SET epsilon_micro = 1 WHERE id = "
        + LAST.format(t="shuffled_batches"),
    ),
    "a batch deleted": (
        "shuffled_batches",
        "DELETE FROM shuffled_batches WHERE id = " + FIRST.format(t="shuffled_batches"),
    ),
    "a batch added": (
        "shuffled_batches",
        "INSERT INTO shuffled_batches (use_case, day, first_day, last_day, devices, reports,"
        " max_per_device, layers, untagged, epsilon_micro, min_batch_devices)"
        " SELECT use_case, day, first_day, last_day, devices, reports, max_per_device, layers,"
        " untagged, epsilon_micro, min_batch_devices FROM shuffled_batches WHERE id = "
        + FIRST.format(t="shuffled_batches"),
    ),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_every_edit_of_a_deciding_or_published_table_fails_verify_naming_it(
    ledger: Ledger, edit: str
) -> None:
    table, statement = EDITS[edit]
    with ledger.engine.begin() as conn:
        changed = conn.execute(text(statement.replace("{t}", table))).rowcount
    assert changed, f"the edit changed nothing: {statement}"
    verdict = verify_service(ledger, now=NOW, kept=[], seal=SEAL)
    assert not verdict.ok, edit
    assert table in str(verdict.problem), (edit, verdict.problem)


def test_the_matrix_covers_every_table_docs_audit_lists_as_covered() -> None:
    covered = {table for table, _ in EDITS.values()}
    assert covered == {
        "charges",
        "accounts",
        "policies",
        "device_budgets",
        "retention_horizons",
        "idempotency",
        "inbox",
        "reports",
        "batch_parts",
        "sketches",
        "shuffled_batches",
    }


def test_untagged_rows_pass_only_on_the_days_an_earlier_release_charged(ledger: Ledger) -> None:
    """Reports an earlier release stored have no tag: accepted up to its last charge's day only.

    (Inbox rows are sealed, and the seal authenticates them: a sealed row carries no tag.)
    """
    with ledger.engine.begin() as conn:
        conn.execute(text("UPDATE reports SET tag = NULL"))
    _, state = ledger.verify()
    today = utc_day(NOW)
    legacy = replace(state, legacy_through=today)
    assert pipeline_problem(ledger, legacy, now=NOW, seal=SEAL) is None
    problem = pipeline_problem(ledger, replace(state, legacy_through=today - 1), now=NOW)
    assert problem is not None and problem.startswith("reports: ") and "has no tag" in problem


def test_a_verification_without_the_shuffler_key_says_it_opened_no_sealed_row(
    ledger: Ledger,
) -> None:
    verdict = verify_service(ledger, now=NOW, kept=[])
    assert verdict.ok and verdict.note is not None and "not opened" in verdict.note


def _count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the stored sketches ``verify`` decodes (one per sketch it recomputes)."""
    from dp_governor.api import _integrity
    from dp_governor.pipeline.codec import sketch_from_bytes as decode

    calls: list[int] = []

    def counted(mechanism: Any, state: bytes) -> Any:
        calls.append(len(state))
        return decode(mechanism, state)

    monkeypatch.setattr(_integrity, "sketch_from_bytes", counted)
    return calls


def test_a_routine_verification_decodes_only_the_sketches_changed_since_the_last(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded = _count_decodes(monkeypatch)
    with ledger.engine.connect() as conn:
        sketches = conn.execute(text("SELECT count(*) FROM sketches")).scalar_one()
    assert sketches >= 2
    assert verify_service(ledger, now=NOW, kept=[], seal=SEAL, full=False).ok
    assert decoded == []  # the fixture's accepted verdict recorded every sketch's digest
    assert verify_service(ledger, now=NOW, kept=[], seal=SEAL, full=True).ok
    assert len(decoded) == sketches  # --full recomputes every one
    decoded.clear()
    table, statement = EDITS["a sketch swapped for another day's"]
    with ledger.engine.begin() as conn:
        assert conn.execute(text(statement)).rowcount
    verdict = verify_service(ledger, now=NOW, kept=[], seal=SEAL, full=False)
    assert not verdict.ok and table in str(verdict.problem), verdict.problem
    assert len(decoded) == 1  # the changed one alone


@pytest.mark.parametrize("edit", sorted(e for e, (t, _) in EDITS.items() if t == "sketches"))
def test_every_edit_of_a_sketch_fails_a_routine_verification_too(ledger: Ledger, edit: str) -> None:
    assert verify_service(ledger, now=NOW, kept=[], seal=SEAL, full=False).ok
    table, statement = EDITS[edit]
    with ledger.engine.begin() as conn:
        assert conn.execute(text(statement)).rowcount
    verdict = verify_service(ledger, now=NOW, kept=[], seal=SEAL, full=False)
    assert not verdict.ok and table in str(verdict.problem), (edit, verdict.problem)


def test_a_sketchs_digest_moves_with_each_folded_parts_stored_reports() -> None:
    """A report deleted from a folded part changes the digest (tags rule out edits and additions).

    So a routine run recomputes that sketch even on days the count check leaves out.
    """
    from dp_governor.api._integrity import _sketch_digest

    key = ("emoji", "p", 20_000)
    held = _sketch_digest(key, 5, [(1, 3), (2, 2)], b"state")
    assert held == _sketch_digest(key, 5, [(2, 2), (1, 3)], b"state")
    assert held != _sketch_digest(key, 5, [(1, 3), (2, 1)], b"state")
    assert held != _sketch_digest(key, 5, [(1, 3)], b"state")


def test_the_sketches_of_untagged_days_are_recomputed_on_every_routine_run(
    ledger: Ledger,
) -> None:
    """An earlier release's reports carry no tag: only the fold checks their bytes."""
    from dp_governor.api._integrity import _check_pipeline

    with ledger.engine.begin() as conn:
        conn.execute(text("UPDATE reports SET tag = NULL"))
    _, state = ledger.verify()
    legacy = replace(state, legacy_through=utc_day(NOW))
    problem, digests = _check_pipeline(ledger, legacy, now=NOW, seal=SEAL, verified={})
    assert problem is None and digests
    _, statement = EDITS["a stored payload swapped for another's"]
    with ledger.engine.begin() as conn:
        assert conn.execute(text(statement)).rowcount
    problem, _ = _check_pipeline(ledger, legacy, now=NOW, seal=SEAL, verified=digests)
    assert problem is not None and problem.startswith("sketches: "), problem

"""The private pipeline under concurrency, at low traffic, across policy changes and retention.

Every case runs on SQLite and, when configured, on PostgreSQL (READ COMMITTED), where two
flushes or folds in two connections really overlap.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from sqlalchemy import Connection, Engine, text

from dp_governor.api._integrity import _pipeline_problem, verify_service
from dp_governor.api.database import init_service_db
from dp_governor.budget import Decision, Ledger, create_db_engine, utc_day
from dp_governor.mechanisms import InvalidReport
from dp_governor.pipeline.flush import flush_inbox
from dp_governor.pipeline.fold import aggregate
from dp_governor.pipeline.ingest import Ingestor, SubmitRequest
from dp_governor.pipeline.purge import purge
from dp_governor.pipeline.seal import InboxSeal
from dp_governor.policies import PolicyCreate, PolicyUpdate, mechanism_for

SECRET = b"pipe-secret-pipe-secret-pipe-secret!"
SEAL_KEYS = [b"pipe-shuffler-pipe-shuffler-pipe-shuffler"]
SEAL = InboxSeal(SEAL_KEYS)
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
SMALL: dict[str, dict[str, Any]] = {
    "tiny-cms": {"mechanism": "cms", "k": 16, "m": 64},
    "tiny-hcms": {"mechanism": "hcms", "k": 16, "m": 64},
    "tiny-other": {"mechanism": "cms", "k": 8, "m": 32},
}


def _policy(name: str, **extra: Any) -> PolicyCreate:
    return PolicyCreate.model_validate(
        {
            "name": name,
            **SMALL[name],
            "epsilon_per_report": 2.0,
            "max_reports_per_day": 1000,
            "retention_days": 30,
            **extra,
        }
    )


@pytest.fixture
def ledger(engine: Engine) -> Ledger:
    """A ledger with the small use cases only (folding them costs kilobytes, not gigabytes)."""
    init_service_db(engine)
    led = Ledger(engine, SECRET)
    for name in SMALL:
        led.policies.create(_policy(name))
    return led


def _requests(name: str, n: int, *, device: str = "dev", seed: int = 1) -> list[SubmitRequest]:
    """``n`` privatized reports of one use case from ``n`` devices (values 0..9)."""
    mech = mechanism_for(_policy(name))
    rng = np.random.default_rng(seed)
    bodies = mech.privatize([f"v{i % 10}" for i in range(n)], rng=rng).to_dicts()
    return [SubmitRequest(name, f"{device}-{i}", b) for i, b in enumerate(bodies)]


def _submit(ingestor: Ingestor, requests: list[SubmitRequest], now: datetime = NOW) -> None:
    results = ingestor.submit_group(requests, now=now)
    assert all(isinstance(r, Decision) and r.accepted for r in results), results[:3]


def _count(engine: Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def test_concurrent_flushes_and_aggregates_store_and_fold_each_report_once(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    """Four threads flush and fold while reports arrive: charges = stored = folded, per use case.

    On PostgreSQL the flushes overlap in separate READ COMMITTED transactions; a move that
    reads rows and deletes them later stores a row once per flush that read it.
    """
    engine = ledger.engine
    ingestor = Ingestor(ledger, SECRET, seal=SEAL)
    work = [
        _requests(name, 400, device=f"{name}-round{r}", seed=r) for r in range(4) for name in SMALL
    ]
    arrived = threading.Event()
    errors: list[BaseException] = []

    def submitter() -> None:
        try:
            for group in work:
                _submit(ingestor, group)
        except BaseException as exc:
            errors.append(exc)
        finally:
            arrived.set()

    start = threading.Barrier(5)

    def worker() -> None:
        try:
            start.wait(timeout=60)
            while not arrived.is_set():
                flush_inbox(engine, seal=SEAL, batch=50, min_batch=1)
                aggregate(ledger)
            flush_inbox(engine, seal=SEAL, batch=50, min_batch=1)
            aggregate(ledger)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    with caplog.at_level(logging.WARNING, logger="dpgov"):
        for t in threads:
            t.start()
        start.wait(timeout=60)
        submitter()
        for t in threads:
            t.join(timeout=600)
    assert not errors, errors
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    flush_inbox(engine, seal=SEAL, min_batch=1)  # what arrived after the last flush started
    aggregate(ledger)

    charges = _count(engine, "SELECT COUNT(*) FROM charges")
    assert charges == len(work) * 400
    assert _count(engine, "SELECT COUNT(*) FROM inbox") == 0
    assert _count(engine, "SELECT COUNT(*) FROM reports") == charges
    assert _count(engine, "SELECT SUM(reports) FROM batch_parts WHERE folded") == charges
    assert _count(engine, "SELECT COUNT(*) FROM batch_parts WHERE NOT folded") == 0
    assert _count(engine, "SELECT COUNT(*) FROM inbox_moves WHERE batch IS NOT NULL") == 0
    assert _count(engine, "SELECT COALESCE(SUM(n), 0) FROM sketches") == charges
    with engine.connect() as conn:
        per_case: dict[str, int] = dict(
            conn.execute(text("SELECT use_case, SUM(n) FROM sketches GROUP BY 1")).all()
        )
    assert {k: int(v) for k, v in per_case.items()} == dict.fromkeys(SMALL, 4 * 400)


def _stored_order(engine: Engine) -> list[int]:
    """The ``j`` of each stored report in the table's own order (SQLite rowid, PostgreSQL ctid)."""
    order = "ctid" if engine.dialect.name == "postgresql" else "rowid"
    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT payload FROM reports ORDER BY {order}")).all()
    return [int(orjson.loads(r[0])["j"]) for r in rows]


def test_low_traffic_is_held_until_a_batch_and_ids_carry_no_arrival_order(
    ledger: Ledger,
) -> None:
    """12 reports arriving one by one, each followed by a flush, as at night on a quiet service.

    The flush holds them until 12 are pending, then stores all 12 in a random order: the chance
    that a uniform shuffle keeps arrival order is 1/12! (2e-9). Inbox ids are random 63-bit
    integers: none pairs with the charge ids (1, 2, 3, ...), and all 12 fall below 2^32 with
    probability 2^-372.
    """
    engine = ledger.engine
    ingestor = Ingestor(ledger, SECRET, seal=SEAL)
    cms = mechanism_for(_policy("tiny-cms"))
    moved = []
    for i in range(12):
        body = cms.privatize(["x"], rng=np.random.default_rng(i)).to_dicts()[0]
        body["j"] = i  # arrival order, readable in the payload
        _submit(ingestor, [SubmitRequest("tiny-cms", f"quiet-{i}", body)])
        if i == 10:
            with engine.connect() as conn:
                inbox = [int(r[0]) for r in conn.execute(text("SELECT id FROM inbox"))]
                charge_ids = {int(r[0]) for r in conn.execute(text("SELECT id FROM charges"))}
            assert len(inbox) == 11 and not charge_ids & set(inbox)
            assert max(inbox) >= 1 << 32
        moved.append(flush_inbox(engine, seal=SEAL, min_batch=12))
    assert moved == [0] * 11 + [12]
    order = _stored_order(engine)
    assert sorted(order) == list(range(12)) and order != list(range(12))


def test_the_sqlite_database_file_is_created_private(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite"
    old = os.umask(0o022)
    try:
        engine = create_db_engine(f"sqlite:///{path}")
        init_service_db(engine)
        Ledger(engine, SECRET).policies.create(_policy("tiny-cms"))
        with engine.connect() as conn:  # the WAL and shared-memory files exist while open
            conn.execute(text("SELECT 1"))
            for name in ("new.sqlite", "new.sqlite-wal", "new.sqlite-shm"):
                mode = stat.S_IMODE((tmp_path / name).stat().st_mode)
                assert mode == 0o600, (name, oct(mode))
        engine.dispose()
    finally:
        os.umask(old)


def test_a_retired_use_cases_reports_and_sketches_are_purged(ledger: Ledger) -> None:
    engine = ledger.engine
    ingestor = Ingestor(ledger, SECRET, seal=SEAL)
    for name in ("tiny-cms", "tiny-hcms"):
        _submit(ingestor, _requests(name, 30))
    flush_inbox(engine, seal=SEAL, min_batch=1)
    assert aggregate(ledger).reports == 60
    _submit(ingestor, _requests("tiny-cms", 5, device="late"))  # still in the inbox
    ledger.policies.delete("tiny-cms")

    assert purge(ledger, now=NOW + timedelta(days=29))["reports"] == 0  # inside the window
    result = purge(ledger, now=NOW + timedelta(days=30))
    assert (result["reports"], result["sketches"], result["inbox"]) == (60, 2, 5)
    for table in ("reports", "sketches", "inbox", "charges"):
        assert _count(engine, f"SELECT COUNT(*) FROM {table}") == 0, table


def _min_day(engine: Engine, table: str, use_case: str) -> int | None:
    with engine.connect() as conn:
        found = conn.execute(
            text(f"SELECT MIN(day) FROM {table} WHERE use_case = :u"), {"u": use_case}
        ).scalar_one()
    return None if found is None else int(found)


def test_lowering_retention_deletes_the_reports_at_once_and_keeps_the_spend(
    ledger: Ledger,
) -> None:
    engine = ledger.engine
    ingestor = Ingestor(ledger, SECRET, seal=SEAL)
    _submit(ingestor, _requests("tiny-cms", 5), now=NOW - timedelta(days=20))
    flush_inbox(engine, seal=SEAL, min_batch=1)
    assert aggregate(ledger).reports == 5
    _submit(ingestor, _requests("tiny-cms", 3, device="late"), now=NOW - timedelta(days=20))
    ledger.policies.update("tiny-cms", PolicyUpdate(retention_days=10))  # 30 -> 10

    result = purge(ledger, now=NOW)
    assert (result["reports"], result["sketches"], result["inbox"]) == (5, 1, 3)
    assert result["charges"] == 0 and _count(engine, "SELECT COUNT(*) FROM charges") == 8
    ledger.policies.update("tiny-cms", PolicyUpdate(retention_days=30))  # and back: 10 -> 30
    status = {s.use_case: s for s in ledger.status("dev-0", now=NOW)}["tiny-cms"]
    assert status.epsilon_window == 2.0  # the spend 20 days ago counts again
    assert purge(ledger, now=NOW + timedelta(days=10))["charges"] == 8  # 30 days on: gone


def test_both_purges_follow_the_books_one_rule(ledger: Ledger) -> None:
    engine = ledger.engine
    ingestor = Ingestor(ledger, SECRET, seal=SEAL)
    for back in range(45, -1, -1):  # a report of each use case on each of 46 days, flushed
        requests = [_requests(name, 1, device=f"d{back}")[0] for name in SMALL]
        _submit(ingestor, requests, now=NOW - timedelta(days=back))
        flush_inbox(engine, seal=SEAL, min_batch=1, now=NOW - timedelta(days=back))
    assert aggregate(ledger).reports == 46 * 3
    ledger.policies.update("tiny-cms", PolicyUpdate(retention_days=10))  # data 10, spend 30
    ledger.policies.delete("tiny-hcms")  # retired: 30 for both
    ledger.policies.update("tiny-other", PolicyUpdate(retention_days=40))  # 40 for both
    day = utc_day(NOW)
    rule = ledger.book().purge_through(day)
    assert {n: (day - r.spend_through, day - r.data_through) for n, r in rule.items()} == {
        "tiny-cms": (30, 10),
        "tiny-hcms": (30, 30),
        "tiny-other": (40, 40),
    }

    purge(ledger, now=NOW)
    assert ledger.book().horizons == {n: r.spend_through for n, r in rule.items()}
    for name, kept in rule.items():
        assert _min_day(engine, "charges", name) == kept.spend_through + 1, name
        assert _min_day(engine, "reports", name) == kept.data_through + 1, name
        assert _min_day(engine, "sketches", name) == kept.data_through + 1, name


def test_one_use_cases_failure_does_not_stop_the_others(ledger: Ledger) -> None:
    """A report that cannot be folded fails its use case's run only, and is named in the result."""
    engine = ledger.engine
    ingestor = Ingestor(ledger, SECRET, seal=SEAL)
    for name in SMALL:
        _submit(ingestor, _requests(name, 20))
    flush_inbox(engine, seal=SEAL, min_batch=1)
    with engine.begin() as conn:  # a corrupt row, as a disk fault or a manual edit leaves it
        conn.execute(
            text(
                "UPDATE reports SET payload = 'not json' WHERE id ="
                " (SELECT MIN(id) FROM reports WHERE use_case = 'tiny-hcms')"
            )
        )
    result = aggregate(ledger)
    assert result.reports == 40 and result.sketches == 2
    assert list(result.failed) == ["tiny-hcms"] and "JSONDecodeError" in result.failed["tiny-hcms"]
    with engine.connect() as conn:
        folded: dict[str, int] = dict(conn.execute(text("SELECT use_case, n FROM sketches")).all())
    assert folded == {"tiny-cms": 20, "tiny-other": 20}


class ChangesPolicyMidGroup(Ingestor):
    """An ingestor whose validations of ``tiny-cms`` are each followed by a real policy write.

    This puts an administrator's PUT exactly between a group's validation and its charge,
    where it lands by chance under load; ``change`` is the edit, ``then`` the edits after the
    next validations (the group validated again on the book its charge read).
    """

    changed = False
    change: dict[str, Any] = {"k": 4}  # noqa: RUF012 - set per test
    then: tuple[dict[str, Any], ...] = ()

    def current(self, use_case: str, *, fresh: bool = True) -> Any:
        found = super().current(use_case, fresh=fresh)
        if use_case == "tiny-cms" and (not self.changed or self.then):
            change = self.then[0] if self.changed else self.change
            self.then = self.then[1:] if self.changed else self.then
            self.changed = True
            self.ledger.policies.update("tiny-cms", PolicyUpdate(**change), allow_loosen=True)
        return found


# Edits of the decoding (the mechanism's parameters) or of the terms a report is charged on.
FAILING_EDITS = [
    {"k": 4},
    {"epsilon_per_report": 1.0},
    {"hash_seed": "ab"},
    {"max_reports_per_day": 10},
    {"retention_days": 60},
    {"group_size": 2},
    {"window_epsilon_cap": 100.0},
    {"budget_group": "shared"},
]
# Edits that change neither: the reports validated before them are charged under them.
HARMLESS_EDITS = [
    {"description": "changed"},
    {"publish_threshold": 5.0},
    {"min_batch_devices": 3},
    {"delta": 1e-6},
]


def _mixed() -> list[SubmitRequest]:
    """Ten ``tiny-cms`` reports interleaved with ten ``tiny-hcms`` ones."""
    return [
        r
        for pair in zip(_requests("tiny-cms", 10), _requests("tiny-hcms", 10), strict=True)
        for r in pair
    ]


@pytest.mark.parametrize("change", FAILING_EDITS, ids=lambda c: next(iter(c)))
def test_reports_in_flight_during_a_policy_change_are_validated_again_on_the_new_version(
    ledger: Ledger, change: dict[str, Any]
) -> None:
    engine = ledger.engine
    ingestor = ChangesPolicyMidGroup(ledger, SECRET, seal=SEAL)
    ingestor.change = change
    mixed = _mixed()
    results = ingestor.submit_group(mixed, now=NOW)
    assert all(isinstance(r, Decision) and r.accepted for r in results[1::2]), results
    assert _count(engine, "SELECT COUNT(*) FROM charges WHERE use_case = 'tiny-hcms'") == 10
    charged = [r for r in results[::2] if isinstance(r, Decision)]
    # each is charged on the version it was decoded by, or refused by it
    assert all(r.policy_version == 2 for r in charged), charged
    assert all(isinstance(r, Decision | InvalidReport) for r in results[::2]), results
    params = mechanism_for(ledger.policies.get("tiny-cms")).fingerprint.params
    stored = _rows(engine, "SELECT params FROM inbox WHERE use_case = 'tiny-cms'")
    assert [p for (p,) in stored] == [params] * len(charged)


@pytest.mark.parametrize(
    ("change", "undo"),
    [
        ({"epsilon_per_report": 1.0}, {"epsilon_per_report": 2.0}),
        ({"max_reports_per_day": 10}, {"max_reports_per_day": 1000}),
    ],
    ids=["epsilon_per_report", "max_reports_per_day"],
)
def test_a_policy_that_changes_again_fails_only_its_own_use_cases_reports(
    ledger: Ledger, change: dict[str, Any], undo: dict[str, Any]
) -> None:
    engine = ledger.engine
    ingestor = ChangesPolicyMidGroup(ledger, SECRET, seal=SEAL)
    ingestor.change, ingestor.then = change, (undo,)
    mixed = _mixed()
    results = ingestor.submit_group(mixed, now=NOW)
    outcomes = Counter(
        (req.use_case, type(res).__name__) for req, res in zip(mixed, results, strict=True)
    )
    assert outcomes == {("tiny-cms", "PolicyChanged"): 10, ("tiny-hcms", "Decision"): 10}
    assert all(r.accepted for r in results if isinstance(r, Decision))
    assert _count(engine, "SELECT COUNT(*) FROM inbox WHERE use_case = 'tiny-hcms'") == 10
    assert _count(engine, "SELECT COUNT(*) FROM charges WHERE use_case = 'tiny-cms'") == 0
    # a retry, validated against the version now in force, goes through
    retried = ingestor.submit_group(mixed[::2], now=NOW)
    assert all(isinstance(r, Decision) and r.accepted for r in retried), retried
    assert utc_day(NOW) == retried[0].day  # type: ignore[union-attr]


@pytest.mark.parametrize("change", HARMLESS_EDITS, ids=lambda c: next(iter(c)))
def test_an_edit_of_neither_decoding_nor_terms_fails_no_report_in_flight(
    ledger: Ledger, change: dict[str, Any]
) -> None:
    ingestor = ChangesPolicyMidGroup(ledger, SECRET, seal=SEAL)
    ingestor.change = change
    requests = _requests("tiny-cms", 10)
    results = ingestor.submit_group(requests, now=NOW)
    assert ingestor.changed
    assert all(isinstance(r, Decision) and r.accepted for r in results), results
    assert {r.policy_version for r in results if isinstance(r, Decision)} == {2}
    assert _count(ledger.engine, "SELECT COUNT(*) FROM inbox WHERE use_case = 'tiny-cms'") == 10
    if "min_batch_devices" in change:
        return  # queued without pseudonyms: the batch waits for 3 counted devices (untagged)
    flush_inbox(ledger.engine, ledger=ledger, seal=SEAL, min_batch=1, now=NOW)
    assert aggregate(ledger).reports == 10  # stored under the parameters they were built for


def _rows(engine: Engine, sql: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql))]


def test_a_days_tail_joins_the_next_days_batch_under_one_day(ledger: Ledger) -> None:
    """One report waits past midnight; the batch it joins is stored under its first day whole.

    No stored report says which of the batch's days it was charged on: the batch has one part,
    which counts its reports per charge day for the verification only.
    """
    engine = ledger.engine
    ingestor = Ingestor(ledger, SECRET, seal=SEAL)
    _submit(ingestor, _requests("tiny-cms", 1, device="tail"), now=NOW)
    assert flush_inbox(engine, ledger=ledger, seal=SEAL, min_batch=3, now=NOW) == 0
    tomorrow = NOW + timedelta(days=1)
    _submit(ingestor, _requests("tiny-cms", 2, device="next"), now=tomorrow)
    assert flush_inbox(engine, ledger=ledger, seal=SEAL, min_batch=3, now=tomorrow) == 3
    day = utc_day(NOW)
    assert _rows(engine, "SELECT DISTINCT day FROM reports") == [(day,)]
    ((part_day, reports, charge_days),) = _rows(
        engine, "SELECT day, reports, charge_days FROM batch_parts"
    )
    assert (part_day, reports) == (day, 3)
    assert orjson.loads(charge_days) == {str(day): 1, str(day + 1): 2}
    assert _rows(engine, "SELECT first_day, last_day, split FROM shuffled_batches") == [
        (day, day + 1, False)
    ]
    assert aggregate(ledger).reports == 3
    assert _rows(engine, "SELECT day, n FROM sketches") == [(day, 3)]
    assert verify_service(ledger, now=tomorrow, kept=[]).ok


def test_reports_of_parameters_since_changed_wait_for_a_batch_of_their_own(
    ledger: Ledger,
) -> None:
    engine = ledger.engine
    ingestor = Ingestor(ledger, SECRET, seal=SEAL)
    _submit(ingestor, _requests("tiny-cms", 2, device="before"))
    ledger.policies.update("tiny-cms", PolicyUpdate(epsilon_per_report=1.5))  # new parameters
    new = mechanism_for(ledger.policies.get("tiny-cms"))
    bodies = new.privatize(["a", "b", "c"], rng=np.random.default_rng(3)).to_dicts()
    _submit(ingestor, [SubmitRequest("tiny-cms", f"after-{i}", b) for i, b in enumerate(bodies)])
    assert (
        flush_inbox(engine, ledger=ledger, seal=SEAL, min_batch=3) == 3
    )  # the new parameters' three
    assert _count(engine, "SELECT COUNT(DISTINCT params) FROM reports") == 1
    assert _count(engine, "SELECT COUNT(*) FROM inbox") == 2  # the two of before: too few
    assert _rows(engine, "SELECT epsilon_micro, reports FROM shuffled_batches") == [(1_500_000, 3)]
    assert flush_inbox(engine, ledger=ledger, seal=SEAL, min_batch=3) == 0
    assert flush_inbox(engine, ledger=ledger, seal=SEAL, min_batch=2) == 2  # a batch of their own
    assert _count(engine, "SELECT COUNT(DISTINCT batch) FROM reports") == 2
    assert _count(engine, "SELECT COUNT(*) FROM batch_parts") == 2
    assert verify_service(ledger, now=NOW, kept=[]).ok


def test_a_batch_reaching_back_before_the_window_goes_whole_and_still_verifies(
    ledger: Ledger,
) -> None:
    """The purge deletes a batch when its first day leaves the window: early, never late."""
    engine = ledger.engine
    ingestor = Ingestor(ledger, SECRET, seal=SEAL)
    first = NOW - timedelta(days=31)
    _submit(ingestor, _requests("tiny-cms", 1, device="old"), now=first)
    _submit(ingestor, _requests("tiny-cms", 2, device="new"), now=first + timedelta(days=2))
    flush_inbox(engine, ledger=ledger, seal=SEAL, min_batch=3, now=first + timedelta(days=2))
    _submit(ingestor, _requests("tiny-cms", 1, device="today"), now=NOW)  # waits in the inbox
    assert verify_service(ledger, now=NOW, kept=[]).ok
    assert purge(ledger, now=NOW)["reports"] == 3  # two of them a day early
    assert verify_service(ledger, now=NOW, kept=[]).ok  # what the purge took early is allowed
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM inbox"))
    broken = verify_service(ledger, now=NOW, kept=[])
    assert not broken.ok and "records 1 charges" in str(broken.problem)


class ReleaseBefore(Ingestor):
    """An ingestor that queues its inbox rows in the clear, as the release before sealing did."""

    def store_reports(
        self, conn: Connection, rows: list[tuple[str, str, int, bytes, int | None]]
    ) -> None:
        conn.execute(
            text(
                "INSERT INTO inbox (id, use_case, params, day, payload, device_tag)"
                " VALUES (:id, :u, :p, :d, :payload, :tag)"
            ),
            [
                {
                    "id": secrets.randbits(63),
                    "u": u,
                    "p": p,
                    "d": d,
                    "payload": t.decode(),
                    "tag": tag,
                }
                for u, p, d, t, tag in rows
            ],
        )


def _as_the_release_before(ledger: Ledger, requests: list[SubmitRequest], day: int) -> None:
    """Charges and their inbox rows in the clear, on ``day``."""
    queued = ReleaseBefore(ledger, SECRET, seal=SEAL)
    _submit(queued, requests, now=datetime.fromtimestamp(day * 86_400 + 3600, UTC))


def test_rows_queued_in_the_clear_are_sealed_by_the_next_flush_and_flush_later(
    ledger: Ledger,
) -> None:
    """An upgraded database's waiting rows: sealed at the next flush, their clear bytes gone."""
    engine = ledger.engine
    requests = _requests("tiny-cms", 5, device="legacy")
    _as_the_release_before(ledger, requests, utc_day(NOW))
    clear = _rows(engine, "SELECT payload FROM inbox")
    assert len(clear) == 5 and all(p is not None for (p,) in clear)
    assert (
        flush_inbox(engine, ledger=ledger, seal=SEAL, min_batch=10, now=NOW) == 0
    )  # too few: they wait
    assert _rows(
        engine, "SELECT COUNT(*) FROM inbox WHERE payload IS NULL AND sealed IS NOT NULL"
    ) == [(5,)]
    if engine.dialect.name == "sqlite":
        assert _rows(engine, "PRAGMA secure_delete") == [(1,)]
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        data = Path(str(engine.url.database)).read_bytes()
        assert not any(str(p).encode() in data for (p,) in clear)  # overwritten, not just freed
    assert flush_inbox(engine, ledger=ledger, seal=SEAL, min_batch=5, now=NOW) == 5
    stored = {str(p) for (p,) in _rows(engine, "SELECT payload FROM reports")}
    assert stored == {str(p) for (p,) in clear}


def test_a_batch_claimed_by_the_release_before_is_finished_as_it_was_planned(
    ledger: Ledger,
) -> None:
    """A claim left half moved across the upgrade: its parts by charge day, marked split."""
    engine = ledger.engine
    day = utc_day(NOW)
    _as_the_release_before(ledger, _requests("tiny-cms", 2, device="a"), day - 1)
    _as_the_release_before(ledger, _requests("tiny-cms", 3, device="b"), day)
    rows = _rows(engine, "SELECT id, params, day FROM inbox ORDER BY id")
    params = str(rows[0][1])
    record = {
        "first_day": day - 1,
        "last_day": day,
        "devices": 0,
        "reports": 5,
        "max_per_device": 0,
        "layers": [],
        "untagged": 5,
        "epsilon_micro": 2_000_000,
        "min_batch_devices": 1,
        "parts": [[params, day - 1, 2], [params, day, 3]],
    }
    manifest = np.asarray([int(r[0]) for r in rows], dtype=np.int64).tobytes()
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO inbox_moves VALUES ('tiny-cms', 1, 77, 0)"))
        conn.execute(
            text("INSERT INTO inbox_orders (batch, manifest, record) VALUES (77, :m, :r)"),
            {"m": manifest, "r": orjson.dumps(record).decode()},
        )
    assert flush_inbox(engine, ledger=ledger, seal=SEAL, min_batch=100, now=NOW) == 5
    assert sorted(_rows(engine, "SELECT day, reports FROM batch_parts")) == [(day - 1, 2), (day, 3)]
    assert _rows(engine, "SELECT split FROM shuffled_batches") == [(True,)]
    assert _count(engine, "SELECT COUNT(*) FROM inbox_orders") == 0
    # the counts agree (the rows the release before queued carry no tag, and these charges'
    # entries are this release's, so verify would also name the untagged rows)
    _, state = ledger.verify()
    with engine.connect() as conn:
        assert _pipeline_problem(conn, ledger.book(), day, dict(state.accepted)) is None


def test_rows_sealed_under_a_key_not_held_wait_until_it_is_given(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    engine = ledger.engine
    _submit(Ingestor(ledger, SECRET, seal=SEAL), _requests("tiny-cms", 4))
    rotated_away = InboxSeal([b"a-new-key-a-new-key-a-new-key-a-new-key!"])
    with caplog.at_level(logging.WARNING, logger="dpgov"):
        assert flush_inbox(engine, ledger=ledger, seal=rotated_away, min_batch=1) == 0
    assert "4 inbox rows cannot be opened" in caplog.text and "DPGOV_SHUFFLER_KEY" in caplog.text
    both = InboxSeal([b"a-new-key-a-new-key-a-new-key-a-new-key!", *SEAL_KEYS])
    assert flush_inbox(engine, ledger=ledger, seal=both, min_batch=1) == 4

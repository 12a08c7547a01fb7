"""Ledgers of earlier layouts are upgraded in place (migrations 0002, 0012), SQLite and PostgreSQL.

Those layouts came before migrations: each test turns a new ledger into one, without the
``alembic_version`` table such a database never had.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Select, and_, inspect, text

from dp_governor.budget import Ledger, init_db
from dp_governor.budget.gate.prepared import device_key
from dp_governor.budget.reporting.claims import logged_claim
from dp_governor.budget.reporting.loss import device_loss, lifetime_rows
from dp_governor.budget.storage.db import page_query
from dp_governor.policies import PolicyUpdate
from tests.conftest import SECRET

NOW = datetime(2026, 11, 23, 12, tzinfo=UTC)
DAY = int(NOW.timestamp() // 86_400)
OLD_LAYOUT = [
    "DROP TABLE alembic_version",
    "DROP TABLE accounts",
    "CREATE TABLE accounts (device_key VARCHAR(64) NOT NULL, budget VARCHAR(63) NOT NULL,"
    " count BIGINT NOT NULL, epsilon_micro BIGINT NOT NULL, PRIMARY KEY (device_key, budget))",
    "CREATE TABLE daily_spend (device_key VARCHAR(64) NOT NULL, budget VARCHAR(63) NOT NULL,"
    " day INTEGER NOT NULL, count INTEGER NOT NULL, epsilon_micro BIGINT NOT NULL,"
    " PRIMARY KEY (device_key, budget, day))",
    "CREATE TABLE lifetime_totals (device_key VARCHAR(64) NOT NULL,"
    " use_case VARCHAR(63) NOT NULL, epsilon_micro BIGINT NOT NULL, count BIGINT NOT NULL,"
    " PRIMARY KEY (device_key, use_case, epsilon_micro))",
    "DROP INDEX ix_charges_day",
    "CREATE INDEX ix_charges_use_case_device ON charges (use_case, device_key, day, epsilon_micro)",
]


def test_an_old_ledger_keeps_every_device_state(ledger: Ledger) -> None:
    dk = device_key(SECRET, "old-device")
    with ledger.engine.begin() as conn:
        for statement in OLD_LAYOUT:
            conn.execute(text(statement))
        rows: dict[str, list[tuple[object, ...]]] = {
            "accounts": [(dk, "emoji", 3, 12_000_000), (dk, "safari-domains", 2, 8_000_000)],
            "daily_spend": [
                (dk, "emoji", DAY - 120, 1, 4_000_000),
                (dk, "emoji", DAY - 1, 1, 4_000_000),
                (dk, "emoji", DAY, 1, 4_000_000),
                (dk, "safari-domains", DAY, 2, 8_000_000),
            ],
            "charges (device_key, use_case, budget, policy_version, epsilon_micro, day)": [
                (dk, "emoji", "emoji", 1, 4_000_000, DAY - 120),
                (dk, "emoji", "emoji", 1, 4_000_000, DAY - 1),
                (dk, "emoji", "emoji", 1, 4_000_000, DAY),
                (dk, "safari-energy-domains", "safari-domains", 1, 4_000_000, DAY),
                (dk, "safari-crash-domains", "safari-domains", 1, 4_000_000, DAY),
            ],
            "lifetime_totals": [
                (dk, "emoji", 4_000_000, 3),
                (dk, "safari-energy-domains", 4_000_000, 1),
                (dk, "safari-crash-domains", 4_000_000, 1),
            ],
        }
        for table, values in rows.items():
            marks = ", ".join(f":v{i}" for i in range(len(values[0])))
            for value in values:
                conn.execute(
                    text(f"INSERT INTO {table} VALUES ({marks})"),
                    {f"v{i}": v for i, v in enumerate(value)},
                )
    init_db(ledger.engine)
    init_db(ledger.engine)  # a second start finds nothing to migrate

    tables = set(inspect(ledger.engine).get_table_names())
    assert "daily_spend" not in tables and "lifetime_totals" not in tables
    indexes = {i["name"] for i in inspect(ledger.engine).get_indexes("charges")}
    assert "ix_charges_day" in indexes and "ix_charges_use_case_device" not in indexes
    assert "ix_charges_use_case_day" in indexes  # the purge's (0012)
    status = {s.use_case: s for s in ledger.status("old-device", now=NOW)}
    assert status["emoji"].reports_today == 1 and status["emoji"].reports_left_today == 0
    assert status["emoji"].epsilon_window == 8.0 and status["emoji"].epsilon_lifetime == 12.0
    assert status["safari-energy-domains"].reports_left_today == 0
    assert not ledger.charge("old-device", "emoji", now=NOW).accepted  # today's report counted
    assert not ledger.charge("old-device", "safari-crash-domains", now=NOW).accepted
    assert sorted(lifetime_rows(ledger)) == [
        (dk, "emoji", 4_000_000, 1, 3, ""),
        (dk, "safari-crash-domains", 4_000_000, 1, 1, ""),
        (dk, "safari-energy-domains", 4_000_000, 1, 1, ""),
    ]
    assert ledger.purge(now=NOW).daily_spend == 1  # the day 120 days ago
    tomorrow = datetime.fromtimestamp((DAY + 1) * 86_400 + 3600, UTC)
    assert ledger.charge("old-device", "emoji", now=tomorrow).accepted
    loss = device_loss(ledger, "old-device", now=tomorrow)
    assert loss.lifetime["emoji"].events == 4 and loss.window["emoji"].events == 3
    assert loss.window["safari-crash-domains"].events == 1


PER_BUDGET = [
    "DROP TABLE alembic_version",
    "DROP TABLE accounts",
    "CREATE TABLE accounts (device_key VARCHAR(64) NOT NULL, budget VARCHAR(63) NOT NULL,"
    " count BIGINT NOT NULL, epsilon_micro BIGINT NOT NULL, days TEXT NOT NULL DEFAULT '[]',"
    " lifetime TEXT NOT NULL DEFAULT '[]', oldest_day INTEGER,"
    " PRIMARY KEY (device_key, budget))",
]


def test_per_budget_accounts_become_one_row_per_device(ledger: Ledger) -> None:
    """The layout keyed by (device, budget): emoji's history, then a group's, fold together."""
    dk = device_key(SECRET, "moved")
    ledger.policies.update("emoji", PolicyUpdate(lifetime_epsilon_cap=12.0, group_size=3))
    with ledger.engine.begin() as conn:
        for statement in PER_BUDGET:
            conn.execute(text(statement))
        rows = [
            (dk, "emoji", 2, 8_000_000, f"[[{DAY - 2},1],[1,1]]", '[["emoji",4000000,2]]'),
            (dk, "keyboard", 1, 4_000_000, f"[[{DAY},1]]", '[["emoji",4000000,1]]'),
        ]
        for row in rows:
            conn.execute(
                text(
                    "INSERT INTO accounts (device_key, budget, count, epsilon_micro, days,"
                    " lifetime) VALUES (:a, :b, :c, :d, :e, :f)"
                ),
                dict(zip("abcdef", row, strict=True)),
            )
    init_db(ledger.engine)
    init_db(ledger.engine)
    columns = {c["name"] for c in inspect(ledger.engine).get_columns("accounts")}
    assert "budget" not in columns
    assert sorted(lifetime_rows(ledger)) == [(dk, "emoji", 4_000_000, 3, 3, "")]
    emoji = {s.use_case: s for s in ledger.status("moved", now=NOW)}["emoji"]
    assert emoji.epsilon_lifetime == 12.0 and emoji.lifetime_remaining == 0.0
    assert emoji.reports_today == 1 and emoji.epsilon_window == 12.0
    assert ledger.charge("moved", "emoji", now=NOW).reason == "daily_cap"


PURGE_INDEXES = {
    "charges": "ix_charges_use_case_day",
    "reports": "ix_reports_part",
    "idempotency": "ix_idempotency_day_key",
}


def _plan(conn: Connection, query: Select[Any]) -> str:
    sql = str(query.compile(conn, compile_kwargs={"literal_binds": True}))
    if conn.dialect.name == "sqlite":
        return " ".join(str(r[-1]) for r in conn.execute(text(f"EXPLAIN QUERY PLAN {sql}")))
    conn.execute(text("SET LOCAL enable_seqscan = off"))  # a tiny table: can the index serve it?
    conn.execute(text("SET LOCAL enable_bitmapscan = off"))
    return " ".join(str(r[0]) for r in conn.execute(text(f"EXPLAIN {sql}")))


def test_revision_0011_gives_each_purge_page_an_index_range(ledger: Ledger) -> None:
    """Every page the purge reads is a range of one index, first page or later (0011 -> 0012)."""
    from alembic import command

    from dp_governor.budget.storage.db import writer
    from dp_governor.budget.storage.schema import alembic_config
    from dp_governor.budget.storage.tables import Charge, IdempotencyRecord
    from dp_governor.pipeline.tables import REPORTS

    with writer(ledger.engine).begin() as conn:
        for statement in reversed(_INDEX_0012):  # back to revision 0011's indexes
            conn.execute(text(statement))
        conn.execute(text("UPDATE alembic_version SET version_num = '0011'"))
        command.upgrade(alembic_config(conn), "head")
    found = {t: {i["name"] for i in inspect(ledger.engine).get_indexes(t)} for t in PURGE_INDEXES}
    assert all(name in found[t] for t, name in PURGE_INDEXES.items()), found
    assert "ix_reports_batch" not in found["reports"]
    charges, idem = Charge.__table__, IdempotencyRecord.__table__  # type: ignore[attr-defined]
    pages = {
        "charges": (
            (charges.c.use_case, charges.c.day, charges.c.id),
            and_(charges.c.use_case == "emoji", charges.c.day <= DAY),
            ("emoji", DAY - 3, 17),
        ),
        "reports": (
            (REPORTS.c.batch, REPORTS.c.params, REPORTS.c.day, REPORTS.c.id),
            and_(REPORTS.c.batch == 4, REPORTS.c.params == "p", REPORTS.c.day == DAY),
            (4, "p", DAY, "ab"),
        ),
        "idempotency": (
            (idem.c.day, idem.c.device_key, idem.c.key),
            idem.c.day <= DAY,
            (DAY - 3, "d", "k"),
        ),
    }
    for table, (order, where, after) in pages.items():
        for start in (None, after):
            with ledger.engine.begin() as conn:
                plan = _plan(conn, page_query(order, where, start, 500))
            # a partitioned charges table scans each partition's copy of the index
            partition = "_use_case_day_id_idx" if table == "charges" else PURGE_INDEXES[table]
            assert PURGE_INDEXES[table] in plan or partition in plan, (table, start, plan)
            assert "TEMP B-TREE" not in plan and "Sort" not in plan, plan  # index order
            if start is not None and ledger.engine.dialect.name == "postgresql":
                assert "Index Cond: " in plan and "ROW(" in plan, plan  # the keyset bounds it


_INDEX_0012 = [
    "CREATE INDEX ix_reports_batch ON reports (batch)",
    "CREATE INDEX ix_idempotency_day ON idempotency (day)",
    "DROP INDEX ix_charges_use_case_day",
    "DROP INDEX ix_reports_part",
    "DROP INDEX ix_idempotency_day_key",
]


def test_revision_0014_finds_a_days_claim_through_the_claims_index(ledger: Ledger) -> None:
    """The claims' reads are ranges of the partial index ``ix_audit_log_claims`` (0013 -> 0014)."""
    from alembic import command

    from dp_governor.budget.audit.log import Entry
    from dp_governor.budget.reporting.claims import CLAIM_ACTION, CLAIMS_SINCE, NEWEST_CLAIM
    from dp_governor.budget.storage.db import writer
    from dp_governor.budget.storage.schema import alembic_config

    with writer(ledger.engine).begin() as conn:
        conn.execute(text("DROP INDEX ix_audit_log_claims"))  # back to revision 0013
        conn.execute(text("UPDATE alembic_version SET version_num = '0013'"))
        ledger.audit.append(conn, [Entry("device:d", "charge", {"day": DAY})] * 50, now=NOW)
        claim = {"inputs": {"use_case": "emoji", "day": DAY}}
        ledger.audit.append(conn, [Entry("job:claims", CLAIM_ACTION, claim)], now=NOW)
        command.upgrade(alembic_config(conn), "head")
    indexes = {i["name"] for i in inspect(ledger.engine).get_indexes("audit_log")}
    assert "ix_audit_log_claims" in indexes, indexes
    for sql in (NEWEST_CLAIM, CLAIMS_SINCE.replace(":since", "'2026-11-23'")):
        with ledger.engine.begin() as conn:
            if conn.dialect.name == "sqlite":
                rows = conn.execute(text(f"EXPLAIN QUERY PLAN {sql}"))
                plan = " ".join(str(r[-1]) for r in rows)
            else:
                conn.execute(text("SET LOCAL enable_seqscan = off"))
                conn.execute(text("SET LOCAL enable_bitmapscan = off"))
                plan = " ".join(str(r[0]) for r in conn.execute(text(f"EXPLAIN {sql}")))
        assert "ix_audit_log_claims" in plan, plan
        assert "TEMP B-TREE" not in plan and "Sort" not in plan, plan  # in index order
    assert logged_claim(ledger, "emoji", DAY) == claim
    assert logged_claim(ledger, "emoji", DAY - 1) is None  # the claim of another day


def test_the_purge_deletes_charges_through_an_index_not_a_scan(ledger: Ledger) -> None:
    """Each page's DELETE finds its rows by key: a scan per page made the purge quadratic."""
    from datetime import timedelta

    from sqlalchemy import event

    for back in (40, 39, 1):
        for device in ("a", "b", "c"):
            ledger.charge(device, "emoji", now=NOW - timedelta(days=back))
    deletes: list[tuple[str, Any]] = []

    def seen(conn: Any, cursor: Any, statement: str, params: Any, *rest: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE FROM CHARGES"):
            deletes.append((statement, params))

    event.listen(ledger.engine, "before_cursor_execute", seen)
    try:
        assert ledger.purge(now=NOW + timedelta(days=60), rows=2).charges >= 4  # pages of 2
    finally:
        event.remove(ledger.engine, "before_cursor_execute", seen)
    assert deletes
    if ledger.engine.dialect.name != "sqlite":
        return  # PostgreSQL: the (day, id) pairs pick each row's day's partition
    raw = ledger.engine.raw_connection()
    try:
        for statement, params in deletes:
            plan = " ".join(
                str(r[-1]) for r in raw.execute(f"EXPLAIN QUERY PLAN {statement}", params)
            )
            assert "SCAN charges" not in plan and "PRIMARY KEY" in plan, plan
    finally:
        raw.close()


def test_the_purge_deletes_reports_and_records_a_page_a_statement_through_their_indexes(
    ledger: Ledger,
) -> None:
    """SQLite: each page is one DELETE whose subquery is a range of the purge's index.

    No key of a page goes through Python, and neither the page nor its rows are found by a scan.
    """
    from datetime import timedelta

    from sqlalchemy import event

    from dp_governor.budget.storage.db import writer
    from dp_governor.budget.storage.tables import IdempotencyRecord
    from dp_governor.pipeline.purge import purge
    from dp_governor.pipeline.tables import PARTS, REPORTS

    old = DAY - 40
    reports = [
        {"id": f"{i:032x}", "use_case": "emoji", "params": "p", "day": old, "payload": "{}"}
        for i in range(5)
    ]
    records = [
        {"device_key": f"d{i}", "key": f"k{i}", "request_hash": "h", "day": old}
        | {"decision": "{}", "use_case": "emoji"}
        for i in range(5)
    ]
    with writer(ledger.engine).begin() as conn:
        conn.execute(REPORTS.insert(), [r | {"batch": 4} for r in reports])
        part = {"batch": 4, "params": "p", "day": old, "use_case": "emoji", "reports": 5}
        conn.execute(PARTS.insert(), [part | {"folded": True, "charge_days": "{}"}])
        conn.execute(IdempotencyRecord.__table__.insert(), records)  # type: ignore[attr-defined]
    deletes: list[tuple[str, Any]] = []

    def seen(conn: Any, cursor: Any, statement: str, params: Any, *rest: Any) -> None:
        if statement.lstrip().upper().startswith(("DELETE FROM REPORTS", "DELETE FROM IDEMP")):
            deletes.append((statement, params))

    event.listen(ledger.engine, "before_cursor_execute", seen)
    try:
        result = purge(ledger, now=NOW + timedelta(days=60), rows=2)  # pages of 2
    finally:
        event.remove(ledger.engine, "before_cursor_execute", seen)
    assert (result["reports"], result["idempotency"]) == (5, 5), result
    if ledger.engine.dialect.name != "sqlite":
        return  # PostgreSQL: keyset pages, read then deleted by key (the plans test above)
    assert len(deletes) == 6, deletes  # 3 pages each: 2, 2, then 1 (the last)
    raw = ledger.engine.raw_connection()
    try:
        for statement, params in deletes:
            rows = raw.execute(f"EXPLAIN QUERY PLAN {statement}", params)
            plan = " ".join(str(r[-1]) for r in rows)
            table = "reports" if "FROM reports" in statement else "idempotency"
            assert "SCAN" not in plan and "TEMP B-TREE" not in plan, plan
            assert f"COVERING INDEX {PURGE_INDEXES[table]}" in plan, plan  # the page
            assert "PRIMARY KEY" in plan or "sqlite_autoindex_reports_1" in plan, plan  # its rows
    finally:
        raw.close()

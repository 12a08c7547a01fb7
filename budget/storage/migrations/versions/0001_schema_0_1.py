"""The schema of release 0.1: every table, created where missing.

A database made by 0.1 (before migrations) already has every table: this revision then only
records that it is at revision 0001. A new database gets them all, ``charges`` partitioned by
day on PostgreSQL (:mod:`dp_governor.budget.storage.partitions`), the audit tables' append-only
triggers and the audit chain's genesis head. The DDL is written out here, not taken from the models,
so that later model changes go through new revisions.

Revision ID: 0001
Revises: (none)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision: str | None = None
branch_labels = None
depends_on = None

GENESIS = "0" * 64
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_PARTITIONED_CHARGES = [
    """CREATE TABLE charges (
    id BIGSERIAL NOT NULL,
    device_key VARCHAR(64) NOT NULL,
    use_case VARCHAR(63) NOT NULL,
    budget VARCHAR(63) NOT NULL,
    policy_version INTEGER NOT NULL,
    epsilon_micro BIGINT NOT NULL,
    day INTEGER NOT NULL,
    idempotency_key VARCHAR(255),
    PRIMARY KEY (id, day)
) PARTITION BY RANGE (day)""",
    "CREATE INDEX ix_charges_day ON charges (day)",
    "CREATE TABLE charges_default PARTITION OF charges DEFAULT",
]


def _tables() -> list[sa.Table]:
    """Each table of 0.1 (indexes included), on a private metadata."""
    meta = sa.MetaData()
    s = sa.String
    tables = [
        sa.Table(
            "charges",
            meta,
            sa.Column("id", _ID, primary_key=True, autoincrement=True),
            sa.Column("device_key", s(64), nullable=False),
            sa.Column("use_case", s(63), nullable=False),
            sa.Column("budget", s(63), nullable=False),
            sa.Column("policy_version", sa.Integer(), nullable=False),
            sa.Column("epsilon_micro", sa.BigInteger(), nullable=False),
            sa.Column("day", sa.Integer(), nullable=False),
            sa.Column("idempotency_key", s(255), nullable=True),
            sa.Index("ix_charges_day", "day"),
            sqlite_autoincrement=True,
        ),
        sa.Table(
            "accounts",
            meta,
            sa.Column("device_key", s(64), primary_key=True),
            sa.Column("count", sa.BigInteger(), nullable=False),
            sa.Column("epsilon_micro", sa.BigInteger(), nullable=False),
            sa.Column("days", sa.Text(), nullable=False),
            sa.Column("lifetime", sa.Text(), nullable=False),
            sa.Column("oldest_day", sa.Integer(), nullable=True),
            sqlite_with_rowid=False,
        ),
        sa.Table(
            "idempotency",
            meta,
            sa.Column("device_key", s(64), primary_key=True),
            sa.Column("key", s(255), primary_key=True),
            sa.Column("request_hash", s(64), nullable=False),
            sa.Column("day", sa.Integer(), nullable=False),
            sa.Column("decision", sa.Text(), nullable=False),
            sa.Column("use_case", s(63), nullable=False),
            sa.Index("ix_idempotency_day", "day"),
            sqlite_with_rowid=False,
        ),
        sa.Table(
            "retention_horizons",
            meta,
            sa.Column("use_case", s(63), primary_key=True),
            sa.Column("through_day", sa.Integer(), nullable=False),
        ),
        sa.Table(
            "audit_log",
            meta,
            sa.Column("seq", sa.BigInteger(), primary_key=True, autoincrement=False),
            sa.Column("at", s(40), nullable=False),
            sa.Column("actor", s(120), nullable=False),
            sa.Column("action", s(40), nullable=False),
            sa.Column("body", sa.Text(), nullable=False),
            sa.Column("prev_hash", s(64), nullable=False),
            sa.Column("hash", s(64), nullable=False),
            sa.Column("tag", s(64), nullable=False),
        ),
        sa.Table(
            "audit_head",
            meta,
            sa.Column("id", sa.Integer(), primary_key=True),
            sa.Column("seq", sa.BigInteger(), nullable=False),
            sa.Column("hash", s(64), nullable=False),
        ),
        sa.Table(
            "audit_checkpoints",
            meta,
            sa.Column("seq", sa.BigInteger(), primary_key=True, autoincrement=False),
            sa.Column("hash", s(64), nullable=False),
            sa.Column("at", s(40), nullable=False),
            sa.Column("signature", s(64), nullable=False),
        ),
        sa.Table(
            "policies",
            meta,
            sa.Column("name", s(63), primary_key=True),
            sa.Column("description", s(500), nullable=False),
            sa.Column("k", sa.Integer(), nullable=False),
            sa.Column("m", sa.Integer(), nullable=False),
            sa.Column("k_fragment", sa.Integer(), nullable=True),
            sa.Column("m_fragment", sa.Integer(), nullable=True),
            sa.Column("epsilon_per_report", sa.Float(), nullable=False),
            sa.Column("epsilon_word", sa.Float(), nullable=True),
            sa.Column("epsilon_fragment", sa.Float(), nullable=True),
            sa.Column("max_reports_per_day", sa.Integer(), nullable=False),
            sa.Column("retention_days", sa.Integer(), nullable=False),
            sa.Column("group_size", sa.Integer(), nullable=False),
            sa.Column("publish_threshold", sa.Float(), nullable=False),
            sa.Column("window_epsilon_cap", sa.Float(), nullable=True),
            sa.Column("lifetime_epsilon_cap", sa.Float(), nullable=True),
            sa.Column("delta", sa.Float(), nullable=False),
            sa.Column("budget_group", s(63), nullable=True),
            sa.Column("hash_seed", s(64), nullable=True),
            sa.Column("version", sa.Integer(), primary_key=True),
            sa.Column("active", sa.Boolean(), nullable=False),
            sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
            sa.Column("actor", s(100), nullable=False),
            sa.Column("mechanism", s(8), nullable=False),
        ),
        sa.Table(
            "dpgov_meta",
            meta,
            sa.Column("name", s(64), primary_key=True),
            sa.Column("value", s(200), nullable=False),
        ),
        sa.Table(
            "inbox",
            meta,
            sa.Column("id", _ID, primary_key=True, autoincrement=False),
            sa.Column("use_case", s(63), nullable=False),
            sa.Column("params", s(64), nullable=False),
            sa.Column("day", sa.Integer(), nullable=False),
            sa.Column("payload", sa.Text(), nullable=False),
        ),
        sa.Table(
            "reports",
            meta,
            sa.Column("id", s(32), primary_key=True),
            sa.Column("use_case", s(63), nullable=False),
            sa.Column("params", s(64), nullable=False),
            sa.Column("day", sa.Integer(), nullable=False),
            sa.Column("payload", sa.Text(), nullable=False),
            sa.Column("folded", sa.Boolean(), nullable=False),
            sa.Index("ix_reports_fold", "use_case", "params", "day", "folded"),
        ),
        sa.Table(
            "sketches",
            meta,
            sa.Column("use_case", s(63), primary_key=True),
            sa.Column("params", s(64), primary_key=True),
            sa.Column("day", sa.Integer(), primary_key=True),
            sa.Column("n", sa.BigInteger(), nullable=False),
            sa.Column("state", sa.LargeBinary(), nullable=False),
        ),
        sa.Table(
            "job_leases",
            meta,
            sa.Column("job", s(60), primary_key=True),
            sa.Column("holder", s(64), nullable=False),
            sa.Column("until", sa.Float(), nullable=False),
        ),
    ]
    return tables


def _append_only(conn: sa.Connection, name: str) -> None:
    """The triggers that refuse UPDATE and DELETE (and TRUNCATE) on an audit table."""
    if conn.dialect.name == "sqlite":
        for verb in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER {name}_no_{verb.lower()} BEFORE {verb} ON {name}"
                f" BEGIN SELECT RAISE(ABORT, '{name} is append-only: {verb} refused'); END"
            )
        return
    op.execute(
        "CREATE OR REPLACE FUNCTION dpgov_append_only() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP; END $$"
    )
    op.execute(
        f"CREATE TRIGGER {name}_append_only BEFORE UPDATE OR DELETE ON {name}"
        " FOR EACH ROW EXECUTE FUNCTION dpgov_append_only()"
    )
    op.execute(
        f"CREATE TRIGGER {name}_no_truncate BEFORE TRUNCATE ON {name}"
        " FOR EACH STATEMENT EXECUTE FUNCTION dpgov_append_only()"
    )


def upgrade() -> None:
    """Create each table of 0.1 that does not exist yet (all of them in a new database)."""
    conn = op.get_bind()
    existing = set(sa.inspect(conn).get_table_names())
    for table in _tables():
        name = table.name
        if name in existing:
            continue
        if name == "charges" and conn.dialect.name == "postgresql":
            for statement in _PARTITIONED_CHARGES:
                op.execute(statement)
            continue
        table.create(conn)  # with its indexes
        if name in ("audit_log", "audit_checkpoints"):
            _append_only(conn, name)
        if name == "audit_head":
            op.execute(f"INSERT INTO audit_head (id, seq, hash) VALUES (1, 0, '{GENESIS}')")


def downgrade() -> None:
    """Not supported: a ledger is never rolled back (restore the backup taken before upgrading)."""
    raise NotImplementedError("a ledger is not downgraded: restore the backup of the database")

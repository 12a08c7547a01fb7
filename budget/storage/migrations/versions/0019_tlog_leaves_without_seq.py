"""``tlog_leaves`` loses its ``seq`` column and that column's unique index.

A leaf's audit entry is always ``idx + 1`` (and the leaf's own text says it), so the column
repeated the primary key and cost the checkpoint job one more index insert a leaf. PostgreSQL
drops the column in place; SQLite, which cannot drop a column under a unique constraint,
rebuilds the table (its rows copied in one statement, its indexes and append-only triggers made
again). The downgrade restores the column as ``idx + 1``, the same way.

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision: str | None = "0018"
branch_labels = None
depends_on = None

# a claim's leaf (keys sorted: its actor first); the colon escaped from SQLAlchemy's binds
_CLAIM_LEAF = """data LIKE '{"actor":"job\\:claims",%'"""


def _rebuild_sqlite(*, seq: bool) -> None:
    """Rebuild ``tlog_leaves`` on SQLite with or without ``seq`` (``idx + 1``), rows kept."""
    column, unique = ("seq BIGINT NOT NULL, ", ", UNIQUE (seq)") if seq else ("", "")
    op.execute(
        f"CREATE TABLE tlog_leaves_new (idx BIGINT NOT NULL, {column}label VARCHAR(32),"
        f" data TEXT NOT NULL, PRIMARY KEY (idx){unique})"
    )
    names, values = (
        ("idx, seq, label, data", "idx, idx + 1, label, data") if seq else ("idx, label, data",) * 2
    )
    op.execute(f"INSERT INTO tlog_leaves_new ({names}) SELECT {values} FROM tlog_leaves")
    op.execute("DROP TABLE tlog_leaves")  # its indexes and triggers go with it
    op.execute("ALTER TABLE tlog_leaves_new RENAME TO tlog_leaves")
    op.create_index("ix_tlog_leaves_label", "tlog_leaves", ["label"])
    op.create_index(
        "ix_tlog_leaves_claims", "tlog_leaves", ["idx"], sqlite_where=sa.text(_CLAIM_LEAF)
    )
    for verb in ("UPDATE", "DELETE"):
        op.execute(
            f"CREATE TRIGGER tlog_leaves_no_{verb.lower()} BEFORE {verb} ON tlog_leaves"
            f" BEGIN SELECT RAISE(ABORT, 'tlog_leaves is append-only: {verb} refused'); END"
        )


def upgrade() -> None:
    """Drop ``tlog_leaves.seq`` (a rebuild on SQLite)."""
    conn = op.get_bind()
    if "seq" not in {c["name"] for c in sa.inspect(conn).get_columns("tlog_leaves")}:
        return
    if conn.dialect.name == "sqlite":
        _rebuild_sqlite(seq=False)
    else:
        op.execute("ALTER TABLE tlog_leaves DROP COLUMN seq")


def downgrade() -> None:
    """Restore ``tlog_leaves.seq`` as ``idx + 1``, unique and not null."""
    conn = op.get_bind()
    if conn.dialect.name == "sqlite":
        _rebuild_sqlite(seq=True)
        return
    op.execute("ALTER TABLE tlog_leaves ADD COLUMN seq BIGINT")
    op.execute("ALTER TABLE tlog_leaves DISABLE TRIGGER tlog_leaves_append_only")
    op.execute("UPDATE tlog_leaves SET seq = idx + 1")
    op.execute("ALTER TABLE tlog_leaves ENABLE TRIGGER tlog_leaves_append_only")
    op.execute("ALTER TABLE tlog_leaves ALTER COLUMN seq SET NOT NULL")
    op.execute("ALTER TABLE tlog_leaves ADD CONSTRAINT tlog_leaves_seq_key UNIQUE (seq)")

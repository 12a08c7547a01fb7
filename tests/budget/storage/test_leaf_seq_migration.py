"""Revision 0019: ``tlog_leaves`` loses ``seq`` and gets it back, losing no leaf, both backends."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import Engine, inspect, text

from dp_governor.budget import create_db_engine, init_db
from dp_governor.budget.storage.db import writer
from dp_governor.budget.storage.schema import alembic_config

CLAIM = '{"actor":"job:claims","data":{},"day":1,"kind":"claim.day","seq":3}'
LEAVES = [
    (0, "a" * 32, '{"day":1,"kind":"charge","label":"' + "a" * 32 + '","seq":1}'),
    (1, None, '{"day":1,"kind":"refusal","seq":2}'),
    (2, None, CLAIM),
]


def _leaves(engine: Engine, columns: str = "idx, label, data") -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT {columns} FROM tlog_leaves ORDER BY idx")).all()
    return [tuple(row) for row in rows]


def _refused(engine: Engine, statement: str) -> None:
    """``statement`` on ``tlog_leaves`` is refused by its append-only trigger."""
    with pytest.raises(Exception, match="append-only"), writer(engine).begin() as conn:
        conn.execute(text(statement))


def test_revision_0019_drops_the_leaves_seq_and_restores_it(empty_url: str) -> None:
    engine = create_db_engine(empty_url)
    try:
        with writer(engine).begin() as conn:
            command.upgrade(alembic_config(conn), "0018")
            conn.execute(
                text("INSERT INTO tlog_leaves (idx, seq, label, data) VALUES (:i, :s, :l, :d)"),
                [{"i": i, "s": i + 1, "l": label, "d": data} for i, label, data in LEAVES],
            )
        init_db(engine)
        assert "seq" not in {c["name"] for c in inspect(engine).get_columns("tlog_leaves")}
        assert _leaves(engine) == LEAVES
        indexes = {ix["name"] for ix in inspect(engine).get_indexes("tlog_leaves")}
        assert {"ix_tlog_leaves_label", "ix_tlog_leaves_claims"} <= indexes
        _refused(engine, "UPDATE tlog_leaves SET data = 'x'")
        _refused(engine, "DELETE FROM tlog_leaves")
        with writer(engine).begin() as conn:
            command.downgrade(alembic_config(conn), "0018")
        assert _leaves(engine, "idx, seq, label, data") == [
            (i, i + 1, lb, d) for i, lb, d in LEAVES
        ]
        _refused(engine, "UPDATE tlog_leaves SET seq = seq + 10")
        with pytest.raises(Exception, match=r"(?i)unique"), writer(engine).begin() as conn:
            conn.execute(text("INSERT INTO tlog_leaves (idx, seq, data) VALUES (3, 1, '{}')"))
        init_db(engine)
        assert _leaves(engine) == LEAVES
    finally:
        engine.dispose()

"""Revision 0018: ``tlog_nodes`` becomes ``tlog_tiles`` and back, losing no hash, both backends."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import Engine, inspect, text

from dp_governor.budget import create_db_engine, init_db
from dp_governor.budget.audit.tlog import TransparencyLog
from dp_governor.budget.storage.db import writer
from dp_governor.budget.storage.schema import alembic_config
from dp_governor.mechanisms.merkle import (
    Frontier,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    root_of,
)
from dp_governor.mechanisms.tiles import TileFrontier, TilePath, tile_reader


def _nodes(size: int) -> tuple[Frontier, dict[tuple[int, int], bytes]]:
    """Every complete subtree of a tree of ``size`` leaves, as revision 0010's log stored them."""
    frontier, nodes = Frontier(), {}
    for i in range(size):
        for level, index, digest in frontier.append(leaf_hash(i.to_bytes(4, "big"))):
            nodes[(level, index)] = digest
    return frontier, nodes


def _stored_nodes(engine: Engine) -> dict[tuple[int, int], bytes]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT level, idx, hash FROM tlog_nodes")).all()
    return {(int(level), int(idx)): bytes.fromhex(h) for level, idx, h in rows}


def _stored_tiles(engine: Engine) -> dict[tuple[int, int], bytes]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT level, idx, hashes FROM tlog_tiles")).all()
    return {(int(level), int(idx)): bytes(h) for level, idx, h in rows}


@pytest.mark.parametrize("size", [0, 1, 300, 70_000])
def test_revision_0018_turns_the_nodes_into_tiles_and_back(empty_url: str, size: int) -> None:
    engine = create_db_engine(empty_url)
    try:
        with writer(engine).begin() as conn:
            command.upgrade(alembic_config(conn), "0016")
        frontier, nodes = _nodes(size)
        rows = [{"l": lv, "i": i, "h": h.hex()} for (lv, i), h in nodes.items()]
        with writer(engine).begin() as conn:
            for start in range(0, len(rows), 20_000):
                conn.execute(
                    text("INSERT INTO tlog_nodes (level, idx, hash) VALUES (:l, :i, :h)"),
                    rows[start : start + 20_000],
                )
        init_db(engine)
        assert "tlog_nodes" not in inspect(engine).get_table_names()
        grown = TileFrontier()
        grown.extend([nodes[(0, i)] for i in range(size)])
        assert _stored_tiles(engine) == {(lv, n): h for lv, n, h in grown.tiles()}
        tlog = TransparencyLog(engine, bytes(32))
        with engine.connect() as conn:

            def fetch(tile: TilePath) -> bytes:
                return tlog.tile(conn, tile.level or 0, tile.index)[: tile.width * 32]

            node = tile_reader(size, fetch)
            assert root_of(size, node) == frontier.root()
            for index in {0, size // 3, size - 1} if size else set():
                by_nodes = inclusion_proof(index, size, lambda lv, i: nodes[(lv, i)])
                assert inclusion_proof(index, size, node) == by_nodes
            if size > 1:
                old = size // 2 + 1
                expected = consistency_proof(old, size, lambda lv, i: nodes[(lv, i)])
                assert consistency_proof(old, size, node) == expected
        with writer(engine).begin() as conn:
            command.downgrade(alembic_config(conn), "0017")
        assert "tlog_tiles" not in inspect(engine).get_table_names()
        assert _stored_nodes(engine) == nodes
        if nodes:  # a trigger refuses each row deleted, so it needs one
            with pytest.raises(Exception, match="append-only"), engine.begin() as conn:
                conn.execute(text("DELETE FROM tlog_nodes"))
        init_db(engine)  # and up again: the same tiles
        assert _stored_tiles(engine) == {(lv, n): h for lv, n, h in grown.tiles()}
    finally:
        engine.dispose()

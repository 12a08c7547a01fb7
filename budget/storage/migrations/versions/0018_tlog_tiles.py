"""The transparency log's tree as C2SP tiles: ``tlog_tiles`` replaces ``tlog_nodes``.

A row is one tile (``level``, ``idx``, ``hashes``: up to 256 subtree hashes of height
``8 * level``, 32 bytes each), so a leaf costs the job a share of one row instead of two rows
of ``tlog_nodes``; the hashes between tile levels are computed when a proof needs them. The
table is append-only but for one change: a partial tile grows (every hash it held kept). The
upgrade copies the tile levels' hashes of ``tlog_nodes`` into their tiles and drops it; the
downgrade rebuilds ``tlog_nodes`` (every complete subtree's hash, computed from the tiles).

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision: str | None = "0017"
branch_labels = None
depends_on = None

_WIDTH = 256  # hashes a full tile holds
_HEIGHT = 8  # levels a tile spans
_PAGE = 20_000  # rows read or written at a time
_GROWS = (
    "NEW.level = OLD.level AND NEW.idx = OLD.idx AND length(OLD.hashes) < 8192"
    " AND length(NEW.hashes) > length(OLD.hashes)"
    " AND substr(NEW.hashes, 1, length(OLD.hashes)) = OLD.hashes"
)


def _tiles_table(meta: sa.MetaData) -> sa.Table:
    """``tlog_tiles`` as this revision creates it."""
    return sa.Table(
        "tlog_tiles",
        meta,
        sa.Column("level", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("idx", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("hashes", sa.LargeBinary(), nullable=False),
    )


def _nodes_table(meta: sa.MetaData) -> sa.Table:
    """``tlog_nodes`` as revision 0010 created it."""
    return sa.Table(
        "tlog_nodes",
        meta,
        sa.Column("level", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("idx", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("hash", sa.String(64), nullable=False),
    )


def _tile_triggers(dialect: str) -> None:
    """Refuse DELETE and every UPDATE but a partial tile's growth (and TRUNCATE)."""
    if dialect == "sqlite":
        op.execute(
            "CREATE TRIGGER tlog_tiles_no_update BEFORE UPDATE ON tlog_tiles"
            f" WHEN NOT ({_GROWS}) BEGIN SELECT RAISE(ABORT,"
            " 'tlog_tiles is append-only: UPDATE refused (a partial tile may only grow)'); END"
        )
        op.execute(
            "CREATE TRIGGER tlog_tiles_no_delete BEFORE DELETE ON tlog_tiles"
            " BEGIN SELECT RAISE(ABORT, 'tlog_tiles is append-only: DELETE refused'); END"
        )
        return
    op.execute(
        "CREATE OR REPLACE FUNCTION dpgov_tile_grows() RETURNS trigger LANGUAGE plpgsql AS $$"
        f" BEGIN IF TG_OP = 'UPDATE' AND {_GROWS} THEN RETURN NEW; END IF;"
        " RAISE EXCEPTION '% is append-only: % refused (a partial tile may only grow)',"
        " TG_TABLE_NAME, TG_OP; END $$"
    )
    op.execute(
        "CREATE TRIGGER tlog_tiles_append_only BEFORE UPDATE OR DELETE ON tlog_tiles"
        " FOR EACH ROW EXECUTE FUNCTION dpgov_tile_grows()"
    )
    op.execute(
        "CREATE TRIGGER tlog_tiles_no_truncate BEFORE TRUNCATE ON tlog_tiles"
        " FOR EACH STATEMENT EXECUTE FUNCTION dpgov_append_only()"
    )


def _node_triggers(dialect: str) -> None:
    """Revision 0010's triggers on ``tlog_nodes``: UPDATE, DELETE and TRUNCATE refused."""
    if dialect == "sqlite":
        for verb in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER tlog_nodes_no_{verb.lower()} BEFORE {verb} ON tlog_nodes"
                f" BEGIN SELECT RAISE(ABORT, 'tlog_nodes is append-only: {verb} refused'); END"
            )
        return
    op.execute(
        "CREATE TRIGGER tlog_nodes_append_only BEFORE UPDATE OR DELETE ON tlog_nodes"
        " FOR EACH ROW EXECUTE FUNCTION dpgov_append_only()"
    )
    op.execute(
        "CREATE TRIGGER tlog_nodes_no_truncate BEFORE TRUNCATE ON tlog_nodes"
        " FOR EACH STATEMENT EXECUTE FUNCTION dpgov_append_only()"
    )


def _stored_tiles(conn: sa.Connection) -> Iterator[tuple[int, int, bytes]]:
    """The tiles of the hashes ``tlog_nodes`` holds at the tile levels, level by level."""
    select = sa.text(
        "SELECT idx, hash FROM tlog_nodes WHERE level = :level AND idx >= :after"
        " ORDER BY idx LIMIT :n"
    )
    levels = conn.execute(sa.text("SELECT DISTINCT level FROM tlog_nodes")).scalars()
    for level in sorted(int(x) for x in levels if int(x) % _HEIGHT == 0):
        tile, index, after = bytearray(), 0, 0
        while rows := conn.execute(select, {"level": level, "after": after, "n": _PAGE}).all():
            for idx, digest in rows:
                if int(idx) // _WIDTH != index:
                    yield level // _HEIGHT, index, bytes(tile)
                    tile, index = bytearray(), int(idx) // _WIDTH
                tile += bytes.fromhex(digest)
            after = int(rows[-1][0]) + 1
        if tile:
            yield level // _HEIGHT, index, bytes(tile)


def _subtrees(level: int, index: int, hashes: bytes) -> Iterator[tuple[int, int, str]]:
    """Every complete subtree inside one tile, ``(level, idx, hash hex)``, from its hashes."""
    row = [hashes[i : i + 32] for i in range(0, len(hashes), 32)]
    first = index * _WIDTH
    for rise in range(_HEIGHT):
        for i, digest in enumerate(row):
            yield level * _HEIGHT + rise, (first >> rise) + i, digest.hex()
        if rise == _HEIGHT - 1:
            break  # the next height is the tile's parent, a hash of the level above
        row = [
            hashlib.sha256(b"\x01" + row[i] + row[i + 1]).digest()
            for i in range(0, len(row) - 1, 2)
        ]


def _write(conn: sa.Connection, table: sa.Table, rows: Iterator[dict[str, object]]) -> None:
    """Insert ``rows`` a page at a time."""
    page: list[dict[str, object]] = []
    for row in rows:
        page.append(row)
        if len(page) == _PAGE:
            conn.execute(table.insert(), page)
            page = []
    if page:
        conn.execute(table.insert(), page)


def upgrade() -> None:
    """Create ``tlog_tiles`` from ``tlog_nodes``'s tile-level hashes, then drop ``tlog_nodes``."""
    conn = op.get_bind()
    if "tlog_tiles" in set(sa.inspect(conn).get_table_names()):
        return
    tiles = _tiles_table(sa.MetaData())
    tiles.create(conn)
    _tile_triggers(conn.dialect.name)
    _write(
        conn,
        tiles,
        ({"level": lv, "idx": n, "hashes": h} for lv, n, h in _stored_tiles(conn)),
    )
    op.drop_table("tlog_nodes")  # its triggers go with it


def downgrade() -> None:
    """Rebuild ``tlog_nodes`` (every complete subtree's hash) from the tiles; drop the tiles."""
    conn = op.get_bind()
    nodes = _nodes_table(sa.MetaData())
    nodes.create(conn)
    _node_triggers(conn.dialect.name)
    select = sa.text(
        "SELECT level, idx, hashes FROM tlog_tiles WHERE level > :level"
        " OR (level = :level AND idx > :idx) ORDER BY level, idx LIMIT 64"
    )
    after = {"level": -1, "idx": -1}
    while page := conn.execute(select, after).all():
        _write(
            conn,
            nodes,
            (
                {"level": lv, "idx": i, "hash": h}
                for level, index, hashes in page
                for lv, i, h in _subtrees(int(level), int(index), bytes(hashes))
            ),
        )
        after = {"level": int(page[-1][0]), "idx": int(page[-1][1])}
    op.drop_table("tlog_tiles")
    if conn.dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS dpgov_tile_grows()")

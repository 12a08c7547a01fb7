"""The transparency log as C2SP ``tlog-tiles``: tiles and entry bundles read from the stored tree.

Every hash a tile holds is a complete subtree the checkpoint job stored (``tlog_nodes``: a
level-``L`` tile's hashes are the subtrees of height ``8 * L``), so a tile is one indexed range
read, and an entry bundle one range of ``tlog_leaves``. Only what the newest signed checkpoint
covers is served: a full tile once its 256 hashes are complete, a partial one of any width up
to what that checkpoint's size gives (the partials of earlier checkpoints included).
"""

from __future__ import annotations

from sqlalchemy import text

from dp_governor.budget.audit.tlog import TransparencyLog
from dp_governor.mechanisms.tiles import TILE_HEIGHT, TILE_WIDTH, TilePath, tile_width

__all__ = ["MAX_ENTRY", "read_tile"]

MAX_ENTRY = 0xFFFF  # an entry bundle's length prefix is a big-endian uint16


def read_tile(tlog: TransparencyLog, tile: TilePath) -> bytes | None:
    """The tile's or entry bundle's bytes, or ``None`` if the newest checkpoint lacks it.

    Raises ``ValueError`` for a bundle holding a leaf longer than 65,535 bytes (no uint16
    length can say it; ``/v1/tlog/leaves`` serves it).
    """
    point = tlog.latest()
    size = 0 if point is None else point.size
    if tile.width > tile_width(tile.level or 0, tile.index, size):
        return None
    first = tile.index * TILE_WIDTH
    bounds = {"a": first, "b": first + tile.width}
    with tlog.engine.connect() as conn:
        if tile.level is not None:
            rows = conn.execute(
                text(
                    "SELECT hash FROM tlog_nodes WHERE level = :level AND idx >= :a AND idx < :b"
                    " ORDER BY idx"
                ),
                {"level": TILE_HEIGHT * tile.level, **bounds},
            ).scalars()
            return b"".join(bytes.fromhex(h) for h in rows)
        leaves = conn.execute(
            text("SELECT idx, data FROM tlog_leaves WHERE idx >= :a AND idx < :b ORDER BY idx"),
            bounds,
        ).all()
    bundle = bytearray()
    for index, data in leaves:
        entry = str(data).encode()
        if len(entry) > MAX_ENTRY:
            raise ValueError(
                f"leaf {index} is {len(entry):,} bytes, more than an entry bundle's {MAX_ENTRY:,}:"
                f" read it from /v1/tlog/leaves"
            )
        bundle += len(entry).to_bytes(2, "big") + entry
    return bytes(bundle)

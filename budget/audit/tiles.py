"""The transparency log as C2SP ``tlog-tiles``: tiles and entry bundles read from the stored tree.

The checkpoint job stores the tree as these tiles (``tlog_tiles``, one row a tile, a partial
one grown in place), so a tile is one row read (cut to the width asked), and an entry bundle
one range of ``tlog_leaves``. Only what the newest signed checkpoint
covers is served: a full tile once its 256 hashes are complete, a partial one of any width up
to what that checkpoint's size gives (the partials of earlier checkpoints included).
:func:`write_tiles` writes the same resources as static files, for a static host or a CDN,
and the log's verifier key beside them (``vkey``: C2SP signed-note format, for the operator to
copy into devices' and witnesses' configuration; docs/transparency.md).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import text

from dp_governor.budget.audit.tlog import TransparencyLog
from dp_governor.mechanisms.tiles import TILE_HEIGHT, TILE_WIDTH, TilePath, tile_width

__all__ = ["MAX_ENTRY", "TilesWritten", "read_tile", "write_tiles"]

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
    return _tile_bytes(tlog, tile)


def _tile_bytes(tlog: TransparencyLog, tile: TilePath) -> bytes:
    """The bytes of a tile or bundle the stored tree covers (one range read)."""
    first = tile.index * TILE_WIDTH
    bounds = {"a": first, "b": first + tile.width}
    with tlog.engine.connect() as conn:
        if tile.level is not None:
            return tlog.tile(conn, tile.level, tile.index)[: tile.width * 32]
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


@dataclass(slots=True)
class TilesWritten:
    """What :func:`write_tiles` did: the checkpoint's size, the files it wrote and kept."""

    size: int
    written: list[str] = field(default_factory=list)  # paths under the folder, in writing order
    kept: int = 0  # tiles and bundles already there (immutable: never written again)
    skipped: list[str] = field(default_factory=list)  # bundles no uint16 length can hold
    checkpoint: bool = False  # whether the checkpoint file changed
    vkey: bool = False  # whether the verifier key file was written (new, or another key's)

    @property
    def tiles(self) -> int:
        """The tiles and entry bundles written (the checkpoint and the vkey aside)."""
        return len(self.written) - self.checkpoint - self.vkey


def _tiles_of(size: int) -> list[TilePath]:
    """Every tile and entry bundle a tree of ``size`` leaves has, full and partial, bottom up."""
    wanted: list[TilePath] = []
    level = 0
    while size >> (TILE_HEIGHT * level):
        below = size >> (TILE_HEIGHT * level)
        for index in range(-(-below // TILE_WIDTH)):
            width = tile_width(level, index, size)
            wanted.append(TilePath(level, index, width))
            if level == 0:
                wanted.append(TilePath(None, index, width))
        level += 1
    return wanted


def _replace(folder: Path, name: str, data: bytes) -> None:
    """Write ``folder/name`` through a temporary file and a rename, so no reader sees half."""
    target = folder / name
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def write_tiles(tlog: TransparencyLog, folder: Path) -> TilesWritten:
    """Write the newest checkpoint's C2SP ``tlog-tiles`` tree under ``folder``, checkpoint last.

    The files are those the routes serve, at their paths (``tile/<L>/<N>[.p/<W>]``,
    ``tile/entries/<N>[.p/<W>]``, ``checkpoint``), each written through a rename. A tile's
    path says its width, so a file once written never changes: one already there is kept, and
    a run writes only the tiles new since the last. ``checkpoint`` is replaced last, once every
    tile it needs is in place, so a host serving ``folder`` is consistent at every moment.
    ``vkey`` (the log's verifier key, ``<origin>+<key id>+<key>`` and a newline) is written
    first, when it is missing or differs.
    """
    point = tlog.latest()
    if point is None:
        return TilesWritten(0)
    done = TilesWritten(point.size)
    vkey = f"{tlog.verifier.vkey()}\n".encode()
    if not (folder / "vkey").exists() or (folder / "vkey").read_bytes() != vkey:
        _replace(folder, "vkey", vkey)
        done.written.append("vkey")
        done.vkey = True
    for tile in _tiles_of(point.size):
        name = tile.path()
        if (folder / name).exists():
            done.kept += 1
            continue
        try:
            data = _tile_bytes(tlog, tile)
        except ValueError:
            done.skipped.append(name)
            continue
        _replace(folder, name, data)
        done.written.append(name)
    note = point.note.encode()
    current = folder / "checkpoint"
    if not current.exists() or current.read_bytes() != note:
        _replace(folder, "checkpoint", note)
        done.written.append("checkpoint")
        done.checkpoint = True
    return done

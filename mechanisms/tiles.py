"""C2SP ``tlog-tiles``: tile paths, tile widths, and a Merkle tree read back from tiles.

A tile at level ``L`` holds up to 256 consecutive hashes of complete subtrees of ``256**L``
leaves (level 0: leaf hashes); its index ``N`` is written in 3-digit path elements, all but the
last prefixed ``x`` (``x001/x234/067``), and a partial tile of ``W`` hashes ends in ``.p/W``.
Entry bundles (``tile/entries/N``) hold the leaves of a level-0 tile, each prefixed by its
length as a big-endian uint16. :func:`tile_reader` turns fetched tiles into the ``node``
callback of :mod:`dp_governor.mechanisms.merkle`, so a client computes any inclusion or
consistency proof, or the root, from tiles alone. Pure: the caller fetches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dp_governor.mechanisms.merkle import NodeReader, node_hash

__all__ = ["TILE_HEIGHT", "TILE_WIDTH", "TilePath", "bundle_entries", "tile_reader", "tile_width"]

TILE_HEIGHT = 8
TILE_WIDTH = 256
_HASH = 32


@dataclass(frozen=True, slots=True)
class TilePath:
    """One tile (``level`` 0-63) or entry bundle (``level`` ``None``), index and width."""

    level: int | None
    index: int
    width: int = TILE_WIDTH

    def path(self) -> str:
        """The resource's path under the log's prefix: ``tile/<L>/<N>[.p/<W>]``."""
        digits = f"{self.index:03d}"
        digits = "0" * (-len(digits) % 3) + digits
        parts = [digits[i : i + 3] for i in range(0, len(digits), 3)]
        n = "/".join([*(f"x{p}" for p in parts[:-1]), parts[-1]])
        level = "entries" if self.level is None else str(self.level)
        suffix = "" if self.width == TILE_WIDTH else f".p/{self.width}"
        return f"tile/{level}/{n}{suffix}"

    @classmethod
    def parse(cls, path: str) -> TilePath:
        """Read ``<L>/<N>[.p/<W>]`` or ``entries/<N>[.p/<W>]`` (after ``tile/``); ``ValueError``."""
        parts = path.split("/")
        width = TILE_WIDTH
        if len(parts) >= 3 and parts[-2].endswith(".p"):
            w = parts.pop()
            if not w.isdigit() or w.startswith("0") or not 1 <= int(w) < TILE_WIDTH:
                raise ValueError(f"a partial tile's width is 1 to 255, got {w!r}")
            width = int(w)
            parts[-1] = parts[-1].removesuffix(".p")
        if len(parts) < 2:
            raise ValueError("a tile path is <L>/<N>[.p/<W>] or entries/<N>[.p/<W>]")
        head, elements = parts[0], parts[1:]
        if head == "entries":
            level = None
        elif head.isdigit() and (head == "0" or not head.startswith("0")) and int(head) < 64:
            level = int(head)
        else:
            raise ValueError(f"a tile's level is 0 to 63 or 'entries', got {head!r}")
        digits = ""
        for i, element in enumerate(elements):
            last = i == len(elements) - 1
            bare = element if last else element.removeprefix("x")
            if (not last and not element.startswith("x")) or len(bare) != 3 or not bare.isdigit():
                raise ValueError(
                    f"a tile index is 3-digit elements, all but the last x-prefixed: {path!r}"
                )
            digits += bare
        made = cls(level, int(digits), width)
        if made.path() != f"tile/{path}":  # e.g. extra leading x000 elements
            raise ValueError(f"not the canonical path of tile {made.index}: {path!r}")
        return made


def tile_width(level: int, index: int, size: int) -> int:
    """The width of tile ``index`` at ``level`` in a tree of ``size`` leaves (0: none yet)."""
    below = size >> (TILE_HEIGHT * level)  # complete subtrees of 256**level leaves
    return max(0, min(TILE_WIDTH, below - index * TILE_WIDTH))


def bundle_entries(bundle: bytes) -> list[bytes]:
    """The entries of an entry bundle (big-endian uint16 length, then the entry); ``ValueError``."""
    entries, at = [], 0
    while at < len(bundle):
        if at + 2 > len(bundle):
            raise ValueError("an entry bundle ends inside a length prefix")
        n = int.from_bytes(bundle[at : at + 2], "big")
        if at + 2 + n > len(bundle):
            raise ValueError("an entry bundle ends inside an entry")
        entries.append(bundle[at + 2 : at + 2 + n])
        at += 2 + n
    return entries


def tile_reader(size: int, fetch: Callable[[TilePath], bytes]) -> NodeReader:
    """The ``node(level, index)`` callback of a tree of ``size`` leaves, from fetched tiles.

    A subtree of height ``h`` is ``2**(h % 8)`` hashes of one tile at level ``h // 8``, hashed
    up; each tile is fetched once, at the width the tree's size gives it, and checked to be
    that many hashes.
    """
    tiles: dict[tuple[int, int], bytes] = {}

    def node(level: int, index: int) -> bytes:
        tier, rise = divmod(level, TILE_HEIGHT)
        first = index << rise
        n, offset = divmod(first, TILE_WIDTH)
        data = tiles.get((tier, n))
        if data is None:
            width = tile_width(tier, n, size)
            if width == 0:
                raise ValueError(f"subtree ({level}, {index}) is beyond a tree of {size} leaves")
            data = fetch(TilePath(tier, n, width))
            if len(data) != width * _HASH:
                raise ValueError(f"tile {tier}/{n} is {len(data)} bytes, not {width} hashes")
            tiles[(tier, n)] = data
        hashes = [data[(offset + i) * _HASH : (offset + i + 1) * _HASH] for i in range(1 << rise)]
        while len(hashes) > 1:
            hashes = [node_hash(hashes[i], hashes[i + 1]) for i in range(0, len(hashes), 2)]
        return hashes[0]

    return node

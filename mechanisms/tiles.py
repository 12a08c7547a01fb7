"""C2SP ``tlog-tiles``: tile paths, tile widths, and a Merkle tree read back from tiles.

A tile at level ``L`` holds up to 256 consecutive hashes of complete subtrees of ``256**L``
leaves (level 0: leaf hashes); its index ``N`` is written in 3-digit path elements, all but the
last prefixed ``x`` (``x001/x234/067``), and a partial tile of ``W`` hashes ends in ``.p/W``.
Entry bundles (``tile/entries/N``) hold the leaves of a level-0 tile, each prefixed by its
length as a big-endian uint16. :func:`tile_reader` turns fetched tiles into the ``node``
callback of :mod:`dp_governor.mechanisms.merkle`, so a client computes any inclusion or
consistency proof, or the root, from tiles alone; :class:`TileFrontier` grows a tree and the
tiles it fills, which is how the log stores it. Pure: the caller fetches and stores.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dp_governor.mechanisms.merkle import NodeReader, edge_root, node_hash, range_nodes

__all__ = [
    "TILE_HEIGHT",
    "TILE_WIDTH",
    "TileFrontier",
    "TilePath",
    "bundle_entries",
    "partial_tiles",
    "tile_reader",
    "tile_width",
]

TILE_HEIGHT = 8
TILE_WIDTH = 256
_HASH = 32
_FULL = TILE_WIDTH * _HASH


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


def partial_tiles(size: int) -> dict[int, tuple[int, int]]:
    """The rightmost tile of each level that a tree of ``size`` leaves has partial: ``(N, W)``.

    >>> partial_tiles(70_000)
    {0: (273, 112), 1: (1, 17), 2: (0, 1)}
    """
    found: dict[int, tuple[int, int]] = {}
    level = 0
    while size >> (TILE_HEIGHT * level):
        below = size >> (TILE_HEIGHT * level)
        if below % TILE_WIDTH:
            found[level] = (below // TILE_WIDTH, below % TILE_WIDTH)
        level += 1
    return found


class TileFrontier:
    """A growing tree kept as its tiles: appends leaf hashes, fills tiles, knows its root.

    Starts from a tree's partial tiles (:func:`partial_tiles`: one a level at most, which hold
    its whole right edge) and keeps, as :class:`~dp_governor.mechanisms.merkle.Frontier` does,
    one hash per set bit of the size; each leaf hash, and each subtree hash of height ``8 * L``
    it completes, is appended to the level-``L`` tile it belongs to. :meth:`tiles` gives every
    tile written since the start, full or partial, at its new width: what a log stores.
    """

    def __init__(self, size: int = 0, tiles: Mapping[int, bytes] | None = None) -> None:
        """Resume the tree of ``size`` leaves from its partial tiles, ``{level: hashes}``."""
        partial, tiles = partial_tiles(size), tiles or {}
        self.size = size
        self._open: list[bytearray] = []  # the tile each level is filling, from the level 0
        self._index: list[int] = []  # each of those tiles' index
        for level in range(max(partial, default=-1) + 1):
            index, width = partial.get(level, ((size >> (TILE_HEIGHT * level)) // TILE_WIDTH, 0))
            data = bytes(tiles.get(level, b"")) if width else b""
            if len(data) != width * _HASH:
                raise ValueError(f"tile {level}/{index} must hold {width} hashes at size {size}")
            self._open.append(bytearray(data))
            self._index.append(index)
        self._changed = [False] * len(self._open)
        self._full: list[tuple[int, int, bytes]] = []
        node = tile_reader(size, lambda tile: bytes(self._open[tile.level or 0]))
        self.edge = [node(level, index) for level, index in range_nodes(0, size)]

    def _add(self, level: int, hashes: bytes) -> None:
        """Append hashes to the level's open tile; each tile that fills is kept, a new one begun."""
        if level == len(self._open):
            self._open.append(bytearray())
            self._index.append(0)
            self._changed.append(False)
        while hashes:
            tile = self._open[level]
            room = _FULL - len(tile)
            tile += hashes[:room]
            hashes = hashes[room:]
            self._changed[level] = True
            if len(tile) == _FULL:
                self._full.append((level, self._index[level], bytes(tile)))
                self._open[level] = bytearray()
                self._index[level] += 1
                self._changed[level] = False

    def extend(self, leaves: Sequence[bytes]) -> None:
        """Append leaf hashes in order (RFC 9162 interior hashes computed as subtrees close)."""
        self._add(0, b"".join(leaves))
        # node_hash inlined: this loop runs once a leaf on the checkpoint job's path
        edge, add, sha256 = self.edge, self._add, hashlib.sha256
        size = self.size
        for leaf in leaves:
            current, index, height = leaf, size, 0
            while index & 1:  # the new node closes its parent: merge with the edge's last
                current = sha256(b"\x01" + edge.pop() + current).digest()
                index >>= 1
                height += 1
                if not height % TILE_HEIGHT:
                    add(height // TILE_HEIGHT, current)
            edge.append(current)
            size += 1
        self.size = size

    def root(self) -> bytes:
        """``MTH`` of the tree so far."""
        return edge_root(self.edge)

    def tiles(self) -> list[tuple[int, int, bytes]]:
        """``(level, index, hashes)`` of every tile filled or grown since the start, in order."""
        grown = [
            (level, self._index[level], bytes(tile))
            for level, tile in enumerate(self._open)
            if self._changed[level] and tile
        ]
        return self._full + grown

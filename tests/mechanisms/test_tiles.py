"""C2SP tlog-tiles paths, widths and bundles as the specification's examples give them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_governor.mechanisms.merkle import Frontier, leaf_hash, root_of
from dp_governor.mechanisms.tiles import (
    TileFrontier,
    TilePath,
    bundle_entries,
    partial_tiles,
    tile_reader,
    tile_width,
)


def test_paths_are_the_specifications() -> None:
    assert TilePath(0, 1234067).path() == "tile/0/x001/x234/067"
    assert TilePath(None, 5, 3).path() == "tile/entries/005.p/3"
    for text in ("0/x001/x234/067", "entries/005.p/3", "63/000", "1/x001/000.p/255"):
        assert TilePath.parse(text).path() == f"tile/{text}"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("0/1", "3-digit"),
        ("0/x000/001", "canonical"),
        ("0/001/002", "x-prefixed"),
        ("64/000", "0 to 63"),
        ("01/000", "0 to 63"),
        ("0/000.p/0", "1 to 255"),
        ("0/000.p/256", "1 to 255"),
        ("0", "a tile path is"),
    ],
)
def test_a_malformed_path_is_refused_saying_why(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        TilePath.parse(text)


def test_widths_follow_the_specifications_example_of_70000_leaves() -> None:
    assert [tile_width(0, n, 70_000) for n in (0, 272, 273, 274)] == [256, 256, 112, 0]
    assert [tile_width(1, n, 70_000) for n in (0, 1)] == [256, 17]
    assert tile_width(2, 0, 70_000) == 1
    assert (tile_width(0, 0, 256), tile_width(1, 0, 256), tile_width(0, 1, 256)) == (256, 1, 0)


def test_bundles_are_uint16_length_prefixed() -> None:
    assert bundle_entries(b"\x00\x02ab\x00\x00\x00\x01c") == [b"ab", b"", b"c"]
    with pytest.raises(ValueError, match="inside an entry"):
        bundle_entries(b"\x00\x05ab")
    with pytest.raises(ValueError, match="inside a length"):
        bundle_entries(b"\x00\x01a\x00")


def test_a_tree_read_from_tiles_has_the_frontiers_root() -> None:
    size = 256 * 3 + 7
    frontier = Frontier()
    nodes = {}
    for i in range(size):
        for level, index, digest in frontier.append(leaf_hash(str(i).encode())):
            nodes[(level, index)] = digest

    def fetch(tile: TilePath) -> bytes:
        assert tile.level is not None
        first = tile.index * 256
        return b"".join(nodes[(8 * tile.level, first + i)] for i in range(tile.width))

    assert root_of(size, tile_reader(size, fetch)) == frontier.root()
    with pytest.raises(ValueError, match="tile 0/3 is 0 bytes, not 7 hashes"):
        tile_reader(size, lambda tile: b"")(0, 3 * 256)


def _tiles_of(leaves: list[bytes], start: int) -> tuple[TileFrontier, dict[tuple[int, int], bytes]]:
    """Grow a tree to ``start`` leaves, store its tiles, resume from the partial ones, grow on."""
    first = TileFrontier()
    first.extend(leaves[:start])
    stored = {(level, index): data for level, index, data in first.tiles()}
    resumed = TileFrontier(
        start,
        {lv: stored[(lv, n)][: w * 32] for lv, (n, w) in partial_tiles(start).items()},
    )
    resumed.extend(leaves[start:])
    stored.update({(level, index): data for level, index, data in resumed.tiles()})
    return resumed, stored


@settings(max_examples=60, deadline=None)
@given(start=st.integers(0, 70_000), more=st.integers(0, 600))
def test_a_tile_frontier_resumed_from_its_partial_tiles_is_the_frontiers_tree(
    start: int, more: int
) -> None:
    """Resuming a tree from its stored partial tiles gives the Frontier's tree and its tiles."""
    size = start + more
    leaves = [leaf_hash(i.to_bytes(4, "big")) for i in range(size)]
    frontier, nodes = Frontier(), {}
    for leaf in leaves:
        for level, index, digest in frontier.append(leaf):
            nodes[(level, index)] = digest
    resumed, stored = _tiles_of(leaves, start)
    assert (resumed.size, resumed.edge, resumed.root()) == (size, frontier.edge, frontier.root())
    for (level, index), data in stored.items():  # every tile holds its level's subtrees, in order
        assert len(data) == tile_width(level, index, size) * 32
        first = index * 256
        assert [data[i : i + 32] for i in range(0, len(data), 32)] == [
            nodes[(8 * level, first + i)] for i in range(len(data) // 32)
        ]
    expected = sum(1 for level, _ in nodes if level % 8 == 0)
    assert sum(len(data) // 32 for data in stored.values()) == expected


def test_a_tile_frontier_refuses_partial_tiles_of_another_width() -> None:
    with pytest.raises(ValueError, match="tile 0/1 must hold 4 hashes at size 260"):
        TileFrontier(260, {0: bytes(32 * 3), 1: bytes(32)})

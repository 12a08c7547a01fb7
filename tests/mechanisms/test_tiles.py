"""C2SP tlog-tiles paths, widths and bundles as the specification's examples give them."""

from __future__ import annotations

import pytest

from dp_governor.mechanisms.merkle import Frontier, leaf_hash, root_of
from dp_governor.mechanisms.tiles import TilePath, bundle_entries, tile_reader, tile_width


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

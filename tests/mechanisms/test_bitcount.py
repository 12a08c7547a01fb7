"""The bit-sliced fold counts exactly what unpacking the bits would."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_governor.mechanisms import CMS, HashFamily, _bitcount
from dp_governor.mechanisms._bitcount import add_bit_counts


def reference(
    k: int, m: int, rows: npt.NDArray[np.int64], bits: npt.NDArray[np.uint8]
) -> npt.NDArray[np.int64]:
    """Unpack every vector and add it to its row: the definition."""
    counts = np.zeros((k, m), dtype=np.int64)
    np.add.at(counts, rows, np.unpackbits(bits, axis=1, count=m).astype(np.int64))
    return counts


def random_input(
    k: int, m: int, n: int, seed: int, *, skew: bool = False
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8]]:
    rng = np.random.default_rng(seed)
    if skew:  # a few rows take most vectors, most rows none
        rows = np.minimum(rng.geometric(0.3, n) - 1, k - 1)
    else:
        rows = rng.integers(0, k, n)
    bits = rng.integers(0, 256, (n, (m + 7) // 8), dtype=np.uint8)
    return rows, bits


@pytest.mark.parametrize(
    ("k", "m", "n"),
    [
        (1, 2, 1),
        (1, 8, 10),
        (3, 2, 50),
        (7, 100, 1_000),  # m not a multiple of 8: bits past m ignored
        (5, 1030, 3_000),  # m not a multiple of 64
        (16, 256, 5_000),
        (2048, 1024, 20_000),
        (65536, 64, 500),  # sparse: most rows untouched
        (1 << 20, 64, 5_000),  # 64-bit sort keys
        (4, 64, 200_000),  # deep rows: several carry-save levels
    ],
)
@pytest.mark.parametrize("skew", [False, True])
def test_counts_equal_unpacking(k: int, m: int, n: int, skew: bool) -> None:
    rows, bits = random_input(k, m, n, seed=k + m + n, skew=skew)
    counts = np.zeros((k, m), dtype=np.int32)
    add_bit_counts(counts, rows, bits)
    np.testing.assert_array_equal(counts, reference(k, m, rows, bits))


@pytest.mark.parametrize("block_bytes", [64, 1 << 12, 1 << 16])
@pytest.mark.parametrize("threads", [1, 2])
def test_block_size_and_threads_do_not_change_counts(block_bytes: int, threads: int) -> None:
    rows, bits = random_input(300, 512, 30_000, seed=3, skew=True)
    counts = np.zeros((300, 512), dtype=np.int64)
    add_bit_counts(counts, rows, bits, threads=threads, block_bytes=block_bytes)
    np.testing.assert_array_equal(counts, reference(300, 512, rows, bits))


@pytest.mark.parametrize("block_bytes", [1 << 12, 1 << 26])
def test_a_row_with_more_vectors_than_a_16_bit_lane_holds(block_bytes: int) -> None:
    # 70,000 all-ones vectors in one row: the 16-bit lanes would overflow at 65,536, so ranks
    # are taken 65,535 at most at a time (1 << 26 makes that the only limit).
    n = 70_000
    rows = np.zeros(n, dtype=np.int64)
    bits = np.full((n, 8), 0xFF, dtype=np.uint8)
    counts = np.zeros((2, 64), dtype=np.int64)
    add_bit_counts(counts, rows, bits, block_bytes=block_bytes)
    assert (counts[0] == n).all() and (counts[1] == 0).all()


def test_counts_add_to_what_is_there_and_accept_views() -> None:
    rows, bits = random_input(40, 128, 4_000, seed=9)
    counts = np.arange(40 * 256, dtype=np.int64).reshape(40, 256)
    before = counts.copy()
    add_bit_counts(counts[:, ::2], rows, bits)  # a strided counts view
    expected = before.copy()
    expected[:, ::2] += reference(40, 128, rows, bits)
    np.testing.assert_array_equal(counts, expected)
    wide = np.zeros((4_000, 32), dtype=np.uint8)
    wide[:, ::2] = bits
    strided = np.zeros((40, 128), dtype=np.int32)
    add_bit_counts(strided, rows, wide[:, ::2])  # a non-contiguous bits view
    np.testing.assert_array_equal(strided, reference(40, 128, rows, bits))


def test_input_is_taken_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_bitcount, "_CHUNK", 1_000)
    rows, bits = random_input(64, 256, 4_500, seed=4)
    counts = np.zeros((64, 256), dtype=np.int64)
    add_bit_counts(counts, rows, bits)
    np.testing.assert_array_equal(counts, reference(64, 256, rows, bits))


def test_narrow_row_dtypes_are_widened_before_the_sort_keys_shift_them() -> None:
    rows, bits = random_input(1 << 17, 64, 70_000, seed=6)  # 17 index bits + 17 row bits
    counts = np.zeros((1 << 17, 64), dtype=np.int32)
    add_bit_counts(counts, rows.astype(np.int32), bits)
    np.testing.assert_array_equal(counts, reference(1 << 17, 64, rows, bits))


@pytest.mark.parametrize("k", [1, 2, 2048, 65536, 65537, 1 << 20])
def test_the_grouping_order_is_a_stable_sort_of_the_rows(k: int) -> None:
    # up to 65,536 rows a radix sort of 16-bit row numbers, above a sort of (row, index) words
    rng = np.random.default_rng(k)
    rows = np.concatenate([rng.integers(0, k, 50_000), [k - 1, 0, k - 1]])
    order = _bitcount._group_order(rows, k)
    np.testing.assert_array_equal(order, np.argsort(rows, kind="stable"))


def test_rows_past_16_bits_are_not_truncated() -> None:
    # k = 65,537: row 65,536 would wrap to row 0 in a 16-bit radix sort
    rows = np.array([65536, 0, 65536, 1], dtype=np.int64)
    bits = np.array([[0xFF], [0x01], [0x80], [0x00]], dtype=np.uint8)
    counts = np.zeros((65537, 8), dtype=np.int32)
    add_bit_counts(counts, rows, bits)
    np.testing.assert_array_equal(counts, reference(65537, 8, rows, bits))


def test_empty_input_changes_nothing() -> None:
    counts = np.ones((4, 16), dtype=np.int32)
    add_bit_counts(counts, np.zeros(0, dtype=np.int64), np.zeros((0, 2), dtype=np.uint8))
    assert (counts == 1).all()


def test_bad_bits_are_refused() -> None:
    counts = np.zeros((4, 16), dtype=np.int32)
    with pytest.raises(ValueError, match="uint8 of shape"):
        add_bit_counts(counts, np.zeros(3, dtype=np.int64), np.zeros((3, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="uint8 of shape"):
        add_bit_counts(counts, np.zeros(3, dtype=np.int64), np.zeros((3, 2), dtype=np.int16))


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(1, 40),
    m=st.integers(2, 200),
    rows=st.lists(st.integers(0, 39), max_size=400),
    seed=st.integers(0, 2**32 - 1),
    block_bytes=st.sampled_from([8, 512, 1 << 20]),
)
def test_any_input_counts_exactly(
    k: int, m: int, rows: list[int], seed: int, block_bytes: int
) -> None:
    r = np.array([x % k for x in rows], dtype=np.int64)
    bits = np.random.default_rng(seed).integers(0, 256, (r.size, (m + 7) // 8), dtype=np.uint8)
    counts = np.zeros((k, m), dtype=np.int64)
    add_bit_counts(counts, r, bits, block_bytes=block_bytes)
    np.testing.assert_array_equal(counts, reference(k, m, r, bits))


def test_cms_sketch_counts_are_the_unpacked_reports() -> None:
    mech = CMS(epsilon=4.0, k=256, m=1024, hash_family=HashFamily(3))
    reports = mech.privatize_indices(
        [f"v{i}" for i in range(50)],
        np.random.default_rng(1).integers(0, 50, 20_000),
        rng=np.random.default_rng(2),
    )
    one = mech.sketch().add(reports)
    two = mech.sketch().add(reports, threads=2)
    expected = reference(256, 1024, np.asarray(reports.j, dtype=np.int64), reports.bits)
    np.testing.assert_array_equal(one.counts, expected)
    np.testing.assert_array_equal(two.counts, expected)
    np.testing.assert_array_equal(one.row_counts, np.bincount(reports.j, minlength=256))

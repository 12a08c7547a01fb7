"""The hash family: pinned bytes, exact arithmetic, range, uniformity and row independence."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from dp_governor.mechanisms.hashing import (
    ALGORITHM,
    MERSENNE_31,
    Fingerprints,
    HashFamily,
    _mod_p,
    factorize,
)

Z = 5.0  # tolerance in standard deviations for the statistical checks in this file


def reference_hash(seed: int, item: bytes, j: int, m: int) -> int:
    """The algorithm written out with Python integers, from the module docstring."""
    digest = hashlib.blake2b(
        item, key=seed.to_bytes(32, "big"), person=b"dpgov.fp.v1", digest_size=24
    ).digest()
    a, b, c = (int.from_bytes(digest[i : i + 8], "little") % MERSENNE_31 for i in (0, 8, 16))
    return ((a + b * j + c * j * j) % MERSENNE_31) % m


def test_pinned_values_do_not_change_across_versions_or_platforms() -> None:
    # If these change, every deployed sketch and every device in the field disagree: never edit.
    fam = HashFamily(seed=0)
    assert fam.hash(["😂", "www.example.com", b"\x00"], [0, 1, 65535], 1024).tolist() == [
        reference_hash(0, "😂".encode(), 0, 1024),
        reference_hash(0, b"www.example.com", 1, 1024),
        reference_hash(0, b"\x00", 65535, 1024),
    ]
    assert fam.hash(["😂"], [0], 1 << 24).tolist() == [13491993]
    assert HashFamily(7).hash(["www.example.com"], [3], 32768).tolist() == [3206]


@given(
    seed=st.integers(0, 2**256 - 1),
    item=st.binary(max_size=40),
    j=st.integers(0, 2**20 - 1),
    m=st.sampled_from([2, 3, 256, 1000, 1024, 32768, 65536, 1 << 24]),
)
def test_vectorised_evaluation_equals_the_integer_reference(
    seed: int, item: bytes, j: int, m: int
) -> None:
    fam = HashFamily(seed)
    assert fam.hash([item], [j], m)[0] == reference_hash(seed, item, j, m)
    block = fam.evaluate_block(fam.fingerprint([item]), j, j + 1, m)
    assert block[0, 0] == reference_hash(seed, item, j, m)


@given(st.lists(st.integers(0, (1 << 63) - 1), min_size=1, max_size=50))
def test_mersenne_reduction_is_exact(values: list[int]) -> None:
    t = np.array(values, dtype=np.uint64)
    assert _mod_p(t.copy()).tolist() == [v % MERSENNE_31 for v in values]


def test_mersenne_reduction_edge_cases() -> None:
    p = MERSENNE_31
    edge = [0, 1, p - 1, p, p + 1, p + 2, 2 * p, 3 * (1 << 31) - 1, (1 << 63) - 1, p * p]
    t = np.array(edge, dtype=np.uint64)
    assert _mod_p(t).tolist() == [v % p for v in edge]


def test_str_is_hashed_as_utf8_bytes() -> None:
    fam = HashFamily(3)
    assert fam.hash(["é"], [5], 1024)[0] == fam.hash(["é".encode()], [5], 1024)[0]
    with pytest.raises(TypeError, match="str or bytes"):
        fam.fingerprint([3])  # type: ignore[list-item]


def test_matrix_equals_elementwise_evaluation() -> None:
    fam = HashFamily(11)
    items = [f"x{i}" for i in range(30)]
    mat = fam.matrix(items, 64, 1000)
    rows, cols = np.meshgrid(np.arange(64), np.arange(30), indexing="ij")
    elementwise = fam.hash([items[c] for c in cols.ravel()], rows.ravel(), 1000)
    assert np.array_equal(mat.ravel(), elementwise)
    assert mat.min() >= 0 and mat.max() < 1000


def test_buckets_are_uniform() -> None:
    m = 64
    values = HashFamily(5).matrix([f"v{i}" for i in range(2000)], 32, m).ravel()
    counts = np.bincount(values, minlength=m)
    assert stats.chisquare(counts).pvalue > 1e-6


def test_pairwise_collisions_occur_at_rate_one_over_m_and_independently_across_rows() -> None:
    # For a pair of items, the k collision indicators must be i.i.d. Bernoulli(1/m) over families:
    # mean 1/m, and the variance of the per-pair collision count is that of a Binomial(k, 1/m).
    k, m, families = 16, 8, 4000
    counts = np.empty(families)
    for s in range(families):
        h = HashFamily(s).matrix(["alpha", "beta"], k, m)
        counts[s] = np.count_nonzero(h[:, 0] == h[:, 1])
    p = 1.0 / m
    assert abs(counts.mean() - k * p) < Z * np.sqrt(k * p * (1 - p) / families)
    var_binomial = k * p * (1 - p)
    # sd of a sample variance ~ var * sqrt(2 / T) (near-normal counts)
    assert abs(counts.var(ddof=1) - var_binomial) < Z * var_binomial * np.sqrt(2.0 / families)


def test_three_items_are_jointly_uniform_in_a_row() -> None:
    # Three-wise independence: over random families, (h(x), h(y), h(z)) is uniform on [m]^3.
    m, families = 4, 6400
    triples = np.empty(families, dtype=np.int64)
    for s in range(families):
        h = HashFamily(s).hash(["x", "y", "z"], [2, 2, 2], m)
        triples[s] = h[0] * m * m + h[1] * m + h[2]
    counts = np.bincount(triples, minlength=m**3)
    assert stats.chisquare(counts).pvalue > 1e-6


def test_seed_validation_and_serialisation() -> None:
    fam = HashFamily(2**200 + 5)
    assert HashFamily.from_dict(fam.to_dict()) == fam
    assert fam.to_dict()["algorithm"] == ALGORITHM
    assert fam.derive("a") != fam.derive("b")
    assert fam.derive("a") == HashFamily(2**200 + 5).derive("a")
    with pytest.raises(ValueError, match="seed"):
        HashFamily(-1)
    with pytest.raises(ValueError, match="seed"):
        HashFamily(2**256)
    with pytest.raises(TypeError, match="seed"):
        HashFamily(True)
    with pytest.raises(ValueError, match="algorithm"):
        HashFamily(0, "md5")


def test_factorize_keeps_first_seen_order() -> None:
    distinct, inverse = factorize(["b", "a", "b", b"b"])
    assert distinct == ["b", "a", b"b"]
    assert inverse.tolist() == [0, 1, 0, 2]


def test_fingerprints_take() -> None:
    fp = HashFamily(0).fingerprint(["a", "b"])
    assert isinstance(fp, Fingerprints) and len(fp) == 2
    again = fp.take([1, 0, 1])
    assert again.a.tolist() == [fp.a[1], fp.a[0], fp.a[1]]

"""RFC 9162 hashing and proofs against the RFC's recursive definitions, for every small tree."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dp_governor.mechanisms.merkle import (
    EMPTY_ROOT,
    Frontier,
    consistency_proof,
    decode_hashes,
    encode_hashes,
    inclusion_proof,
    leaf_hash,
    node_hash,
    root_of,
    verify_consistency,
    verify_inclusion,
)


def _mth(leaves: list[bytes]) -> bytes:
    """``MTH(D[n])`` as RFC 9162, 2.1.1 defines it, over leaf data."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaf_hash(leaves[0])
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    return node_hash(_mth(leaves[:k]), _mth(leaves[k:]))


def _path(m: int, leaves: list[bytes]) -> list[bytes]:
    """``PATH(m, D[n])`` (RFC 9162, 2.1.3.1)."""
    if len(leaves) == 1:
        return []
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    if m < k:
        return [*_path(m, leaves[:k]), _mth(leaves[k:])]
    return [*_path(m - k, leaves[k:]), _mth(leaves[:k])]


def _subproof(m: int, leaves: list[bytes], b: bool) -> list[bytes]:
    """``SUBPROOF(m, D[n], b)`` (RFC 9162, 2.1.4.1)."""
    n = len(leaves)
    if m == n:
        return [] if b else [_mth(leaves)]
    k = 1 << ((n - 1).bit_length() - 1)
    if m <= k:
        return [*_subproof(m, leaves[:k], b), _mth(leaves[k:])]
    return [*_subproof(m - k, leaves[k:], False), _mth(leaves[:k])]


def _tree(n: int) -> tuple[list[bytes], dict[tuple[int, int], bytes]]:
    leaves = [f"leaf {i}".encode() for i in range(n)]
    frontier = Frontier()
    nodes = {}
    for leaf in leaves:
        for level, index, digest in frontier.append(leaf_hash(leaf)):
            nodes[(level, index)] = digest
    return leaves, nodes


def test_the_empty_tree_hashes_the_empty_string() -> None:
    assert root_of(0, lambda level, index: b"") == EMPTY_ROOT == _mth([])


@pytest.mark.parametrize("n", range(1, 34))
def test_roots_and_proofs_match_the_rfc_definitions(n: int) -> None:
    leaves, nodes = _tree(n)
    reader = nodes.__getitem__
    frontier = Frontier()
    for leaf in leaves:
        frontier.append(leaf_hash(leaf))
    root = _mth(leaves)
    assert root_of(n, lambda lv, ix: reader((lv, ix))) == root == frontier.root()
    for m in range(n):
        proof = inclusion_proof(m, n, lambda lv, ix: reader((lv, ix)))
        assert proof == _path(m, leaves)
        assert verify_inclusion(leaf_hash(leaves[m]), m, n, proof, root)
        assert not verify_inclusion(leaf_hash(b"other"), m, n, proof, root)
        if n > 1:
            assert not verify_inclusion(leaf_hash(leaves[m]), (m + 1) % n, n, proof, root)
    for old in range(1, n + 1):
        proof = consistency_proof(old, n, lambda lv, ix: reader((lv, ix)))
        assert proof == _subproof(old, leaves, True)
        assert verify_consistency(old, _mth(leaves[:old]), n, root, proof)
        if old < n:
            assert not verify_consistency(old, _mth([*leaves[: old - 1], b"x"]), n, root, proof)


def test_a_forked_tree_fails_consistency() -> None:
    """Two trees that agree up to 5 leaves and then differ: no proof joins 6 to the fork."""
    leaves, nodes = _tree(9)
    forked = [*leaves[:5], b"altered", *leaves[6:]]
    proof = consistency_proof(6, 9, lambda lv, ix: nodes[(lv, ix)])
    assert not verify_consistency(6, _mth(forked[:6]), 9, _mth(leaves), proof)


@given(st.integers(1, 300), st.data())
def test_any_inclusion_proof_verifies(n: int, data: st.DataObject) -> None:
    leaves, nodes = _tree(n)
    m = data.draw(st.integers(0, n - 1))
    proof = inclusion_proof(m, n, lambda lv, ix: nodes[(lv, ix)])
    assert verify_inclusion(leaf_hash(leaves[m]), m, n, proof, _mth(leaves))
    assert len(proof) <= (n - 1).bit_length()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="`index` must be in"):
        inclusion_proof(3, 3, lambda lv, ix: b"")
    with pytest.raises(ValueError, match="`old` must be in"):
        consistency_proof(0, 3, lambda lv, ix: b"")
    with pytest.raises(ValueError, match="edge nodes"):
        Frontier(3, [])
    assert not verify_inclusion(b"", 5, 5, [], b"")
    assert not verify_consistency(2, b"", 1, b"", [])
    assert not verify_consistency(2, b"a", 3, b"b", [])


def test_hashes_travel_as_padded_base64_and_nothing_else_is_read() -> None:
    digest = hashlib.sha256(b"x").digest()
    [text] = encode_hashes([digest])
    assert len(text) == 44 and text.endswith("=")
    assert decode_hashes([text]) == [digest]
    for bad in (digest.hex(), text.rstrip("="), text[:-2] + "!=", "AAAA"):
        with pytest.raises(ValueError, match=r"base64|SHA-256"):
            decode_hashes([bad])

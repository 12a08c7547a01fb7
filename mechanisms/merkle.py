"""RFC 9162 (RFC 6962) Merkle tree hashing, inclusion and consistency proofs.

The hashes of a certificate-transparency log (RFC 9162, section 2.1): a leaf hashes as
``SHA-256(0x00 || data)``, an interior node as ``SHA-256(0x01 || left || right)``, and the tree
over ``n`` leaves splits at ``k``, the largest power of two below ``n``. Proofs are computed
from a ``node`` callback returning the hash of a *complete* aligned subtree ``(level, index)``
(the ``2**level`` leaves from ``index * 2**level``), which is what the transparency log stores
(:mod:`dp_governor.budget.audit.tlog`): any proof then needs ``O(log n)`` stored nodes.
Verification follows RFC 9162 sections 2.1.3.2 and 2.1.4.2 and needs nothing but hashes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable, Iterable, Sequence

__all__ = [
    "Frontier",
    "NodeReader",
    "consistency_proof",
    "consistency_ranges",
    "decode_hashes",
    "edge_root",
    "encode_hashes",
    "inclusion_proof",
    "leaf_hash",
    "node_hash",
    "path_ranges",
    "range_nodes",
    "root_of",
    "verify_consistency",
    "verify_inclusion",
]

NodeReader = Callable[[int, int], bytes]
"""``node(level, index)``: the hash of the complete subtree of ``2**level`` leaves at ``index``."""

EMPTY_ROOT = hashlib.sha256(b"").digest()


def encode_hashes(hashes: Iterable[bytes]) -> list[str]:
    """Hashes as the wire carries them: standard padded base64 (as C2SP notes write hashes)."""
    return [base64.b64encode(h).decode("ascii") for h in hashes]


def decode_hashes(texts: Iterable[str]) -> list[bytes]:
    """The hashes of :func:`encode_hashes`; ``ValueError`` unless each is base64 of 32 bytes."""
    out = []
    for t in texts:
        try:
            raw = base64.b64decode(t.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raise ValueError(f"{t!r} is not standard base64") from None
        if len(raw) != 32:
            raise ValueError(f"{t!r} is not a SHA-256 hash ({len(raw)} bytes)")
        out.append(raw)
    return out


def leaf_hash(data: bytes) -> bytes:
    """``SHA-256(0x00 || data)``: the hash of one leaf (RFC 9162, 2.1.1)."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """``SHA-256(0x01 || left || right)``: the hash of an interior node (RFC 9162, 2.1.1)."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two strictly below ``n`` (``n >= 2``)."""
    return 1 << ((n - 1).bit_length() - 1)


def range_nodes(start: int, end: int) -> list[tuple[int, int]]:
    """The complete aligned subtrees whose hashes make ``MTH(D[start:end])``, left to right.

    ``[start, end)`` must be a subtree of RFC 9162's recursion (``start`` a multiple of a power
    of two at least ``end - start``), as every range a proof names is.

    >>> range_nodes(0, 6)
    [(2, 0), (1, 2)]
    """
    nodes = []
    while start < end:
        size = end - start
        level = size.bit_length() - 1  # the largest power of two in it; aligned by the recursion
        nodes.append((level, start >> level))
        start += 1 << level
    return nodes


def _range_hash(start: int, end: int, node: NodeReader) -> bytes:
    """``MTH(D[start:end])`` from the stored complete subtrees (folded right to left)."""
    parts = [node(level, index) for level, index in range_nodes(start, end)]
    result = parts[-1]
    for part in reversed(parts[:-1]):
        result = node_hash(part, result)
    return result


def root_of(size: int, node: NodeReader) -> bytes:
    """``MTH(D[0:size])``; the hash of the empty string for an empty tree."""
    return EMPTY_ROOT if size == 0 else _range_hash(0, size, node)


def inclusion_proof(index: int, size: int, node: NodeReader) -> list[bytes]:
    """``PATH(index, D[0:size])``: the audit path of leaf ``index`` (RFC 9162, 2.1.3.1)."""
    if not 0 <= index < size:
        raise ValueError(f"`index` must be in [0, {size}), got {index}")
    proof: list[bytes] = []
    start, end = 0, size
    while end - start > 1:
        k = _split(end - start)
        if index - start < k:
            proof.append(_range_hash(start + k, end, node))
            end = start + k
        else:
            proof.append(_range_hash(start, start + k, node))
            start += k
    proof.reverse()
    return proof


def consistency_proof(old: int, new: int, node: NodeReader) -> list[bytes]:
    """``PROOF(old, D[0:new])``: the consistency proof between two sizes (RFC 9162, 2.1.4.1)."""
    if not 0 < old <= new:
        raise ValueError(f"`old` must be in (0, {new}], got {old}")
    proof: list[bytes] = []
    start, end, complete = 0, new, True
    m = old
    while m != end:
        k = _split(end - start)
        if m - start <= k:
            proof.append(_range_hash(start + k, end, node))
            end = start + k
        else:
            proof.append(_range_hash(start, start + k, node))
            start += k
            complete = False
    if not complete:
        proof.append(_range_hash(start, end, node))
    proof.reverse()
    return proof


def verify_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> bool:
    """Whether ``proof`` shows the leaf hash ``leaf`` at ``index`` of the tree ``(size, root)``.

    RFC 9162, section 2.1.3.2, step by step.
    """
    if not 0 <= index < size:
        return False
    fn, sn = index, size - 1
    r = leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


def verify_consistency(
    old: int, old_root: bytes, new: int, new_root: bytes, proof: Sequence[bytes]
) -> bool:
    """Whether ``proof`` shows the tree ``(old, old_root)`` a prefix of ``(new, new_root)``.

    RFC 9162, section 2.1.4.2; equal sizes need an empty proof and equal roots, and the empty
    tree is a prefix of every tree.
    """
    if old == 0:
        return not proof and old <= new
    if old > new:
        return False
    if old == new:
        return not proof and old_root == new_root
    if not proof:
        return False
    path = list(proof)
    if old & (old - 1) == 0:  # a power of two: the old root is the first node of the proof
        path.insert(0, old_root)
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return fr == old_root and sr == new_root and sn == 0


class Frontier:
    """The right edge of a growing tree: appends leaves and yields the subtrees they complete.

    Holds one hash per set bit of the size (the complete subtrees the tree is made of, largest
    first), so a log of ``n`` leaves appends in ``O(1)`` amortised hashing and keeps
    ``log2(n)`` hashes; :meth:`append` returns every new complete node ``(level, index, hash)``
    for the caller to store.
    """

    def __init__(self, size: int = 0, edge: Iterable[bytes] = ()) -> None:
        self.size = size
        self.edge = list(edge)  # the hashes of range_nodes(0, size), left to right
        if len(self.edge) != bin(size).count("1"):
            raise ValueError(f"a tree of {size} leaves has {bin(size).count('1')} edge nodes")

    @staticmethod
    def edge_nodes(size: int) -> list[tuple[int, int]]:
        """The ``(level, index)`` of the edge of a tree of ``size`` leaves, left to right."""
        return range_nodes(0, size)

    def append(self, leaf: bytes) -> list[tuple[int, int, bytes]]:
        """Add one leaf hash; returns the complete nodes it made, the leaf's own first."""
        index = self.size
        made = [(0, index, leaf)]
        current, level = leaf, 0
        while index & 1:  # the new node closes its parent: merge with the edge's last
            current = node_hash(self.edge.pop(), current)
            level += 1
            index >>= 1
            made.append((level, index, current))
        self.edge.append(current)
        self.size += 1
        return made

    def root(self) -> bytes:
        """``MTH`` of the tree so far."""
        return edge_root(self.edge)


def edge_root(edge: Sequence[bytes]) -> bytes:
    """``MTH`` of a tree from its right edge (the perfect subtrees' roots, largest first)."""
    if not edge:
        return EMPTY_ROOT
    result = edge[-1]
    for part in reversed(edge[:-1]):
        result = node_hash(part, result)
    return result


def path_ranges(index: int, size: int) -> list[tuple[int, int]]:
    """The leaf ranges whose hashes an inclusion proof names (RFC 9162's recursion)."""
    ranges = []
    start, end = 0, size
    while end - start > 1:
        k = 1 << ((end - start - 1).bit_length() - 1)
        if index - start < k:
            ranges.append((start + k, end))
            end = start + k
        else:
            ranges.append((start, start + k))
            start += k
    return ranges


def consistency_ranges(old: int, new: int) -> list[tuple[int, int]]:
    """The leaf ranges whose hashes a consistency proof names."""
    ranges = []
    start, end, complete = 0, new, True
    while old != end:
        k = 1 << ((end - start - 1).bit_length() - 1)
        if old - start <= k:
            ranges.append((start + k, end))
            end = start + k
        else:
            ranges.append((start, start + k))
            start += k
            complete = False
    if not complete:
        ranges.append((start, end))
    return ranges

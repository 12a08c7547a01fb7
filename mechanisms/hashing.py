"""A keyed, versioned hash family ``h_0..h_{k-1}: D -> [m]`` shared by devices and the server.

Algorithm ``blake2b-poly31-v1`` (ours, not Apple's; Apple's paper only asks for k functions drawn
from a three-wise independent family):

1. Each item ``d`` (``str`` as UTF-8, or ``bytes``) is hashed *once* with keyed BLAKE2b
   (key = the family's 32-byte seed, personalisation ``b"dpgov.fp.v1"``, 24-byte digest). The digest
   is read as three little-endian ``uint64`` words, each reduced mod ``p = 2**31 - 1``, giving the
   item's fingerprint ``(a, b, c)`` in ``GF(p)**3``.
2. Row ``j`` of the family is the degree-2 polynomial in the row index:
   ``h_j(d) = ((a + b*j + c*j**2) mod p) mod m``.

Why this shape. Under the standard assumption that keyed BLAKE2b is a pseudorandom function, the
fingerprints of distinct items are independent and uniform, so for every fixed row the values
``h_j(d)`` of distinct items are *fully* independent (stronger than the three-wise independence the
paper's variance analysis uses). Across rows, a random degree-2 polynomial evaluated at distinct
points ``j`` is exactly three-wise independent in ``GF(p)``, so the rows are three-wise (hence
pairwise) independent, which is what the ``1/k`` terms of the exact variances need. Evaluating the
k rows is three multiply-adds and a Mersenne reduction on ``uint64`` arrays: no per-item Python
work after the fingerprint, and no 61-bit multiplications.

Documented deviations from the ideal: the ``mod p`` of a 64-bit word biases each fingerprint
coordinate by at most ``2**-33``; the final ``mod m`` is exact for ``m`` a power of two except
that bucket ``m - 1`` has one preimage fewer out of ``p`` (relative deviation ``m / 2**31``), and
for other ``m`` the relative deviation per bucket is at most ``m / p``. Two distinct items collide
in every row only if their fingerprints coincide (probability ``p**-3``, about ``2**-93``). The
statistical tests in ``tests/mechanisms`` check the resulting unbiasedness and variances.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "ALGORITHM",
    "MERSENNE_31",
    "Fingerprints",
    "HashFamily",
    "Item",
]

ALGORITHM: Final = "blake2b-poly31-v1"
MERSENNE_31: Final = (1 << 31) - 1
MAX_ROWS: Final = 1 << 20
MAX_BUCKETS: Final = 1 << 24

_P = np.uint64(MERSENNE_31)
_S31 = np.uint64(31)
_ONE = np.uint64(1)
_PERSON = b"dpgov.fp.v1"

Item = str | bytes
IntArray = npt.NDArray[np.int64]
U64Array = npt.NDArray[np.uint64]


def _mod_p(t: U64Array) -> U64Array:
    """Reduce ``t < 2**63`` exactly modulo ``2**31 - 1``, in place (Mersenne reduction).

    Two folds leave ``u <= p + 2``; ``(u + ((u + 1) >> 31)) & p`` then maps ``p, p+1, p+2`` to
    ``0, 1, 2`` and leaves smaller values alone.
    """
    tmp = np.bitwise_and(t, _P)
    t >>= _S31
    t += tmp
    np.bitwise_and(t, _P, out=tmp)
    t >>= _S31
    t += tmp
    np.add(t, _ONE, out=tmp)
    tmp >>= _S31
    t += tmp
    t &= _P
    return t


@dataclass(frozen=True, slots=True)
class Fingerprints:
    """Per-item coefficients ``(a, b, c)`` in ``GF(2**31 - 1)``, one column per item."""

    a: U64Array
    b: U64Array
    c: U64Array

    def __len__(self) -> int:
        return int(self.a.shape[0])

    def take(self, index: npt.ArrayLike) -> Fingerprints:
        """Return the fingerprints at ``index`` (e.g. the inverse of a factorisation)."""
        idx = np.asarray(index, dtype=np.intp)
        return Fingerprints(self.a[idx], self.b[idx], self.c[idx])


@dataclass(frozen=True, slots=True)
class HashFamily:
    """A versioned, keyed family of hash functions; see the module docstring for the algorithm.

    Attributes:
        seed: the key, an integer in ``[0, 2**256)``; devices and the server must agree on it.
        algorithm: the algorithm name; only ``"blake2b-poly31-v1"`` exists.
    """

    seed: int = 0
    algorithm: str = ALGORITHM

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"`seed` must be an int, got {self.seed!r}")
        if not 0 <= self.seed < (1 << 256):
            raise ValueError(f"`seed` must be in [0, 2**256), got {self.seed}")
        if self.algorithm != ALGORITHM:
            raise ValueError(f"`algorithm` must be {ALGORITHM!r}, got {self.algorithm!r}")

    @property
    def key(self) -> bytes:
        """The 32-byte BLAKE2b key (the seed, big-endian)."""
        return self.seed.to_bytes(32, "big")

    def derive(self, label: str) -> HashFamily:
        """Return an independent family for a named sub-use (e.g. SFP's fragment sketches).

        >>> HashFamily(1).derive("fragment") == HashFamily(1).derive("fragment")
        True
        """
        digest = hashlib.blake2b(
            label.encode("utf-8"), key=self.key, person=b"dpgov.derive.v1", digest_size=32
        ).digest()
        return HashFamily(int.from_bytes(digest, "big"), self.algorithm)

    @property
    def seed_hex(self) -> str:
        """The key as exactly 64 lowercase hex digits, leading zeros kept (what is published).

        >>> HashFamily(0xAB).seed_hex == "0" * 62 + "ab"
        True
        """
        return self.key.hex()

    def to_dict(self) -> dict[str, str]:
        """The identity form ``{"algorithm": ..., "seed": hex without leading zeros}``.

        ``family_id`` and the service's sketch keys hash this form, so it never changes; what
        devices read is :meth:`to_published`.
        """
        return {"algorithm": self.algorithm, "seed": format(self.seed, "x")}

    def to_published(self) -> dict[str, str]:
        """The published form ``{"algorithm": ..., "seed": 64 hex digits}`` (docs/device.md).

        >>> HashFamily(1).to_published()["seed"] == "0" * 63 + "1"
        True
        """
        return {"algorithm": self.algorithm, "seed": self.seed_hex}

    @classmethod
    def from_dict(cls, data: dict[str, str]) -> HashFamily:
        """Inverse of :meth:`to_dict` and :meth:`to_published` (the seed's hex, 1-64 digits)."""
        return cls(int(data["seed"], 16), data["algorithm"])

    # -- fingerprints -------------------------------------------------------------------------

    def fingerprint_bytes(self, items: Iterable[Item]) -> Fingerprints:
        """Fingerprint items (one keyed BLAKE2b call each; ``str`` is hashed as UTF-8)."""
        keyed = hashlib.blake2b(key=self.key, person=_PERSON, digest_size=24)
        copy = keyed.copy
        parts: list[bytes] = []
        append = parts.append
        for it in items:
            h = copy()
            if isinstance(it, str):
                h.update(it.encode("utf-8"))
            elif isinstance(it, bytes):
                h.update(it)
            else:
                raise TypeError(f"items must be str or bytes, got {type(it).__name__}")
            append(h.digest())
        raw = b"".join(parts)
        words = np.frombuffer(raw, dtype="<u8").reshape(-1, 3).astype(np.uint64)
        words %= _P
        return Fingerprints(
            np.ascontiguousarray(words[:, 0]),
            np.ascontiguousarray(words[:, 1]),
            np.ascontiguousarray(words[:, 2]),
        )

    def fingerprint(self, items: Sequence[Item] | npt.NDArray[np.object_]) -> Fingerprints:
        """Fingerprint each item (``str`` or ``bytes``) once."""
        return self.fingerprint_bytes(items)

    # -- evaluation ---------------------------------------------------------------------------

    @staticmethod
    def evaluate(fp: Fingerprints, rows: npt.ArrayLike, m: int) -> IntArray:
        """Return ``h_rows[i](item_i)`` elementwise, as ``int64`` in ``[0, m)``."""
        j = np.asarray(rows).astype(np.uint64, copy=False)
        j2 = (j * j) % _P
        t = j * fp.b
        t += fp.a
        t += j2 * fp.c
        return _reduce_to_buckets(_mod_p(t), m)

    @staticmethod
    def evaluate_block(fp: Fingerprints, row_start: int, row_stop: int, m: int) -> IntArray:
        """Return the ``(row_stop - row_start, len(fp))`` matrix ``h_j(item)`` for a row block."""
        j = np.arange(row_start, row_stop, dtype=np.uint64)[:, None]
        j2 = (j * j) % _P
        t = j * fp.b[None, :]
        t += fp.a[None, :]
        tmp = j2 * fp.c[None, :]
        t += tmp
        return _reduce_to_buckets(_mod_p(t), m)

    def hash(self, items: Sequence[Item], rows: npt.ArrayLike, m: int) -> IntArray:
        """Convenience: ``h_rows[i](items[i])`` for raw items."""
        return self.evaluate(self.fingerprint(items), rows, m)

    def matrix(self, items: Sequence[Item], k: int, m: int) -> IntArray:
        """The full ``(k, len(items))`` table of the first ``k`` rows (for tests and small k)."""
        return self.evaluate_block(self.fingerprint(items), 0, k, m)


def _reduce_to_buckets(u: U64Array, m: int) -> IntArray:
    """Map residues in ``[0, p)`` to buckets in ``[0, m)``."""
    if m & (m - 1) == 0:
        u &= np.uint64(m - 1)
    else:
        u %= np.uint64(m)
    return u.view(np.int64)


def factorize(values: Sequence[Item] | npt.NDArray[np.object_]) -> tuple[list[Item], IntArray]:
    """Return the distinct values (first-seen order) and each value's index among them.

    Hashing then costs one BLAKE2b call per *distinct* value, as in a simulation of a fleet
    drawing from a vocabulary.

    >>> factorize(["a", "b", "a"])
    (['a', 'b'], array([0, 1, 0]))
    """
    codes: dict[Item, int] = {}
    setdefault = codes.setdefault
    inverse = np.fromiter(
        (setdefault(v, len(codes)) for v in values), dtype=np.int64, count=len(values)
    )
    return list(codes), inverse

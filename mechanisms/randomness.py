"""Exact Bernoulli sampling from a seeded generator (simulations) or the OS CSPRNG (devices).

A Bernoulli(p) draw compares a uniform random integer ``U`` of ``8*B`` bits against
``T = floor(p * 2**(8*B))``: the draw is 1 iff ``U < T``, so ``P(1) = T / 2**(8*B)``, which differs
from the float ``p`` by less than ``2**-53 * p`` (``B`` is chosen from ``p``'s exponent). The
comparison is done byte by byte, most significant first: the batch path draws one byte per
Bernoulli and only the ties (probability 1/256 each round) draw more, which is several times faster
than drawing a float per bit. The device path draws all ``B`` bytes of every Bernoulli up front,
so the number of random bytes it consumes never depends on the input or on earlier draws.
"""

from __future__ import annotations

import math
import secrets
from fractions import Fraction
from functools import lru_cache

import numpy as np
import numpy.typing as npt

__all__ = ["bernoulli", "flip_probability", "os_bernoulli", "os_randbelow", "threshold_bytes"]

BoolArray = npt.NDArray[np.bool_]


def flip_probability(epsilon: float) -> float:
    """``1 / (1 + e^epsilon)`` for ``epsilon > 0``, without cancellation for large epsilon.

    >>> flip_probability(4.0)
    0.017986209962091555
    """
    tail = math.exp(-epsilon)
    return tail / (1.0 + tail)


@lru_cache(maxsize=256)
def _threshold(p: float) -> bytes:
    if not (0.0 < p < 1.0) or math.isnan(p):
        raise ValueError(f"`p` must be in (0, 1), got {p}")
    exponent = math.frexp(p)[1]  # p >= 2**(exponent - 1)
    n_bytes = max(7, math.ceil((55 - exponent) / 8))
    t = math.floor(Fraction(p) * (1 << (8 * n_bytes)))
    return t.to_bytes(n_bytes, "big")


def threshold_bytes(p: float) -> npt.NDArray[np.uint8]:
    """Return the big-endian bytes of ``T = floor(p * 2**(8*B))``; ``P(U < T) = T / 2**(8*B)``.

    >>> threshold_bytes(0.5)[:2].tolist()
    [128, 0]
    """
    return np.frombuffer(_threshold(float(p)), dtype=np.uint8)


def bernoulli(p: float, shape: int | tuple[int, ...], *, rng: np.random.Generator) -> BoolArray:
    """Draw i.i.d. Bernoulli(``p``) booleans of ``shape`` from ``rng``, exact to float precision."""
    t = threshold_bytes(p)
    size = math.prod(shape) if isinstance(shape, tuple) else int(shape)
    u = np.frombuffer(rng.bytes(size), dtype=np.uint8)
    out = u < t[0]
    undecided = np.flatnonzero(u == t[0])
    for byte in t[1:]:
        if undecided.size == 0:
            break
        u = np.frombuffer(rng.bytes(undecided.size), dtype=np.uint8)
        out[undecided[u < byte]] = True
        undecided = undecided[u == byte]
    result: BoolArray = out.reshape(shape)
    return result


def os_bernoulli(p: float, size: int) -> BoolArray:
    """Draw ``size`` Bernoulli(``p``) booleans from the OS CSPRNG with a fixed number of bytes."""
    t = threshold_bytes(p).astype(np.int16)
    raw = np.frombuffer(secrets.token_bytes(size * t.size), dtype=np.uint8).reshape(size, t.size)
    diff = raw.astype(np.int16) - t
    nonzero = diff != 0
    first = np.argmax(nonzero, axis=1)
    decided = diff[np.arange(size), first]
    out: BoolArray = np.logical_and(nonzero.any(axis=1), decided < 0)
    return out


def os_randbelow(n: int) -> int:
    """Return a uniform integer in ``[0, n)`` from the OS CSPRNG."""
    return secrets.randbelow(n)

"""Exact Bernoulli sampling from a seeded generator (simulations) or the OS CSPRNG (devices).

A Bernoulli(p) draw compares a uniform random integer ``U`` of ``8*B`` bits against
``T = floor(p * 2**(8*B))``: the draw is 1 iff ``U < T``, so ``P(1) = T / 2**(8*B)``, which differs
from the float ``p`` by less than ``2**-53 * p`` (``B`` is chosen from ``p``'s exponent). The
comparison is done byte by byte, most significant first: the batch path draws one byte per
Bernoulli and only the ties (probability 1/256 each round) draw more, which is several times faster
than drawing a float per bit. The device path draws all ``B`` bytes of every Bernoulli up front,
so the number of random bytes it consumes never depends on the input or on earlier draws.

The flip probability ``p = 1 / (1 + e^epsilon)`` is computed from exact rationals and rounded once
(:func:`flip_probability`), so every platform and every implementation of docs/device.md derives
the same ``p`` and the same ``T`` from the same epsilon (a platform's ``exp`` may differ in the last
place). The device path takes its randomness from :class:`Coins`: the ``secrets`` module, or the
recorded draws of a test vector.
"""

from __future__ import annotations

import math
import secrets
from fractions import Fraction
from functools import lru_cache
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt

__all__ = [
    "OS_COINS",
    "Coins",
    "bernoulli",
    "flip_probability",
    "os_bernoulli",
    "os_randbelow",
    "threshold_bytes",
]

BoolArray = npt.NDArray[np.bool_]

_TAIL_BITS: Final = 100  # the exponential's series stops at a term below 2**-100
_UNDERFLOW: Final = 746  # e^-746 < 2**-1075: the nearest double to 1 / (1 + e^x) is 0


class Coins(Protocol):
    """Where a device's randomness comes from: uniform integers and random bytes.

    The ``secrets`` module is one (:data:`OS_COINS`, the default everywhere); tests replay the
    recorded draws of docs/device.md's test vectors through the same two calls.
    """

    def randbelow(self, exclusive_upper_bound: int, /) -> int:
        """A uniform integer in ``[0, exclusive_upper_bound)``."""
        ...

    def token_bytes(self, nbytes: int, /) -> bytes:
        """``nbytes`` uniform random bytes."""
        ...


OS_COINS: Final[Coins] = secrets


@lru_cache(maxsize=256)
def flip_probability(epsilon: float) -> float:
    """``1 / (1 + e^epsilon)`` for ``epsilon > 0``, the double nearest an exact rational.

    With ``epsilon = x`` exactly (a double is a dyadic rational), ``S = sum_{i<=K} x**i / i!`` for
    the first ``K >= 2x`` whose term is below ``2**-100`` (then the tail is smaller than that
    term), and the result is the double nearest ``1 / (1 + S)`` (round half to even; 0.0 for
    ``x >= 746``). It is within one rounding of the true value, and the same on every platform.

    >>> flip_probability(4.0)
    0.01798620996209156
    """
    if not (math.isfinite(epsilon) and epsilon > 0.0):
        raise ValueError(f"`epsilon` must be finite and > 0, got {epsilon!r}")
    if epsilon >= _UNDERFLOW:
        return 0.0
    num, den = epsilon.as_integer_ratio()  # x = num / den, den a power of two
    power = 1  # num**k
    total = 1  # S_k = total / scale, scale = den**k * k!
    scale = 1
    k = 0
    while True:
        k += 1
        power *= num
        total = total * den * k + power
        scale *= den * k
        if k * den >= 2 * num and power << _TAIL_BITS < scale:
            break
    return scale / (scale + total)  # int / int is correctly rounded


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


def os_bernoulli(p: float, size: int, coins: Coins = OS_COINS) -> BoolArray:
    """Draw ``size`` Bernoulli(``p``) booleans from the OS CSPRNG with a fixed number of bytes.

    One call ``coins.token_bytes(size * B)``: draw ``i`` is 1 iff bytes ``[i*B, (i+1)*B)``, read
    big-endian, are below ``T`` (:func:`threshold_bytes`).
    """
    t = threshold_bytes(p).astype(np.int16)
    raw = np.frombuffer(coins.token_bytes(size * t.size), dtype=np.uint8).reshape(size, t.size)
    diff = raw.astype(np.int16) - t
    nonzero = diff != 0
    first = np.argmax(nonzero, axis=1)
    decided = diff[np.arange(size), first]
    out: BoolArray = np.logical_and(nonzero.any(axis=1), decided < 0)
    return out


def os_randbelow(n: int, coins: Coins = OS_COINS) -> int:
    """Return a uniform integer in ``[0, n)`` from the OS CSPRNG (or ``coins``)."""
    return coins.randbelow(n)

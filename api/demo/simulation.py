"""End-to-end collection simulations on the real mechanisms (the ``dpgov simulate`` job).

A fleet of devices draws values from a Zipf distribution over a vocabulary, privatizes them
with a seeded generator, and the server side sketches and estimates, as the service will.
"""

from __future__ import annotations

import string
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dp_governor.mechanisms import CMS, HCMS, SFP, HashFamily

__all__ = [
    "EMOJI_TOP10",
    "EstimateRow",
    "SimulationResult",
    "emoji_vocabulary",
    "made_up_words",
    "simulate_frequency",
    "zipf_indices",
]

# Apple's published US-English top 10 (Differential Privacy Technical Overview), in order.
EMOJI_TOP10 = ("😂", "❤", "😭", "😍", "😘", "🙄", "💀", "😊", "😩", "🤔")
_EMOJI_RANGES = (
    (0x1F600, 0x1F650),
    (0x1F300, 0x1F600),
    (0x1F680, 0x1F700),
    (0x1F900, 0x1FA00),
    (0x1FA70, 0x1FB00),
    (0x2600, 0x27C0),
)
_SKIN_TONES = tuple(chr(c) for c in range(0x1F3FB, 0x1F400))


def emoji_vocabulary(size: int = 2600) -> list[str]:
    """``size`` distinct emoji strings, Apple's top 10 first (then code points and skin tones)."""
    vocab = list(EMOJI_TOP10)
    seen = set(vocab)
    bases = [chr(c) for lo, hi in _EMOJI_RANGES for c in range(lo, hi)]
    for s in bases + [b + t for t in _SKIN_TONES for b in bases]:
        if len(vocab) >= size:
            break
        if s not in seen:
            seen.add(s)
            vocab.append(s)
    if len(vocab) < size:
        raise ValueError(f"`size` must be at most {len(vocab)}, got {size}")
    return vocab


def made_up_words(count: int, *, rng: np.random.Generator) -> list[str]:
    """``count`` distinct lowercase words of 3 to 10 letters, unknown to any dictionary."""
    letters = np.array(list(string.ascii_lowercase))
    words: set[str] = set()
    out: list[str] = []
    while len(out) < count:
        w = "".join(rng.choice(letters, int(rng.integers(3, 11))))
        if w not in words:
            words.add(w)
            out.append(w)
    return out


def zipf_indices(
    d: int, n: int, exponent: float, *, rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    """``n`` draws from a Zipf law over ranks ``0..d-1`` (``P(r) ~ (r+1)**-exponent``)."""
    weights = np.arange(1, d + 1, dtype=np.float64) ** -exponent
    cdf = np.cumsum(weights / weights.sum())
    cdf[-1] = 1.0
    out: npt.NDArray[np.int64] = np.searchsorted(cdf, rng.random(n), side="right").astype(np.int64)
    return out


@dataclass(frozen=True, slots=True)
class EstimateRow:
    """One line of a simulation's result: an item, its true and estimated counts."""

    rank: int
    item: str
    true_count: int
    estimate: float
    stderr: float


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """What a simulated collection produced, and how long each stage took."""

    mechanism: str
    epsilon: float
    n: int
    top: list[EstimateRow]
    true_top: list[str]
    seconds: dict[str, float]


CHUNK = 100_000  # devices privatized and sketched at a time


def simulate_frequency(
    mechanism: CMS | HCMS,
    vocabulary: list[str],
    n: int,
    *,
    exponent: float = 1.1,
    rng: np.random.Generator,
    top: int = 10,
    progress: Callable[[int, int], None] | None = None,
) -> SimulationResult:
    """Simulate ``n`` devices reporting one value each; estimate every vocabulary item.

    The fleet privatizes and is sketched :data:`CHUNK` devices at a time (memory stays
    bounded whatever ``n``); ``progress`` is called with the devices done and ``n`` after each.
    """
    seconds = {"privatize": 0.0, "aggregate": 0.0}
    t0 = time.perf_counter()
    index = zipf_indices(len(vocabulary), n, exponent, rng=rng)
    truth = np.bincount(index, minlength=len(vocabulary))
    sketch = mechanism.sketch()
    seconds["privatize"] += time.perf_counter() - t0
    for start in range(0, n, CHUNK):
        t1 = time.perf_counter()
        reports = mechanism.privatize_indices(vocabulary, index[start : start + CHUNK], rng=rng)
        t2 = time.perf_counter()
        sketch.add(reports)  # type: ignore[arg-type]
        seconds["privatize"] += t2 - t1
        seconds["aggregate"] += time.perf_counter() - t2
        if progress is not None:
            progress(min(n, start + CHUNK), n)
    t3 = time.perf_counter()
    est = sketch.estimate(vocabulary)
    seconds["estimate"] = time.perf_counter() - t3
    order = np.argsort(-est.counts, kind="stable")[:top]
    rows = [
        EstimateRow(r + 1, vocabulary[i], int(truth[i]), float(est.counts[i]), float(est.stderr[i]))
        for r, i in enumerate(order.tolist())
    ]
    true_top = [vocabulary[i] for i in np.argsort(-truth, kind="stable")[:top].tolist()]
    return SimulationResult(mechanism.name, mechanism.epsilon, n, rows, true_top, seconds)


def default_mechanism(use_case: str, seed: int) -> CMS | HCMS | SFP:
    """Apple's published parameters for the simulated use cases."""
    family = HashFamily(seed)
    if use_case == "emoji":
        return CMS(epsilon=4.0, k=65536, m=1024, hash_family=family)
    if use_case == "safari":
        return HCMS(epsilon=4.0, k=1024, m=32768, hash_family=family)
    if use_case == "quicktype":
        return SFP(epsilon_word=2.0, epsilon_fragment=6.0, hash_family=family)
    raise ValueError(f"`use_case` must be emoji, safari or quicktype, got {use_case!r}")

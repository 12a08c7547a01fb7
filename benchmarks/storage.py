"""A day's sketch as the store keeps it: its size, and the time to write and read it; a table.

Usage: ``python -m benchmarks.storage [--n 20000 1000000] [--workload emoji safari]
[--level 1 6]``.

Workloads as :mod:`benchmarks.mechanisms`' (Emoji: CMS, k = 65,536, m = 1,024; Safari domains:
HCMS, k = 1,024, m = 32,768; Zipf(1.1) values). For each day of ``n`` reports: the stored
blob's size, the time of :func:`~dp_governor.pipeline.codec.sketch_to_bytes` (what the
``aggregate`` job pays at each run for every day it folds into) and of
:func:`~dp_governor.pipeline.codec.sketch_from_bytes` (what every estimate, discovery and
verification of a stored day pays), the better of three runs each. ``--level`` also writes
the same sketch at other zlib levels, to show what the stored level trades.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from benchmarks.mechanisms import workload
from dp_governor.api.demo.simulation import zipf_indices
from dp_governor.mechanisms import Sketch
from dp_governor.pipeline import codec


def best_of(fn: Callable[[], Any], runs: int = 3) -> tuple[Any, float]:
    """The result of ``fn`` and its shortest wall time over ``runs`` calls."""
    best, out = float("inf"), None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best


def rows(name: str, n: int, levels: list[int], seed: int) -> list[str]:
    """One row a zlib level for one workload's day of ``n`` reports."""
    mech, vocab = workload(name)
    rng = np.random.default_rng(seed)
    sketch: Sketch = mech.sketch()
    for s in range(0, n, 1_000_000):  # privatized in slices: a slice's reports stay small
        index = zipf_indices(len(vocab), min(n, s + 1_000_000) - s, 1.1, rng=rng)
        sketch.add(mech.privatize_indices(vocab, index, rng=rng))
    out = []
    for level in levels:
        blob, write = best_of(partial(codec.sketch_to_bytes, sketch, level=level))
        back, read = best_of(partial(codec.sketch_from_bytes, mech, blob))
        assert codec.sketches_equal(back, sketch), "the stored sketch reads back different"
        stored = "stored" if level == codec.COMPRESS_LEVEL else "other"
        out.append(
            f"| {name} {mech.name.upper()} | {n:,d} | {level} ({stored}) |"
            f" {len(blob) / 2**20:.1f} MiB | {write:.2f} s | {read:.2f} s |"
        )
    return out


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, measure each workload and size, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[20_000, 1_000_000])
    parser.add_argument(
        "--workload", nargs="+", choices=["emoji", "safari"], default=["emoji", "safari"]
    )
    parser.add_argument(
        "--level",
        type=int,
        nargs="+",
        default=[codec.COMPRESS_LEVEL],
        help=f"zlib levels (0-9) to write at; the store's is {codec.COMPRESS_LEVEL}",
    )
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.n) or any(not 0 <= lv <= 9 for lv in args.level):
        parser.error("--n must be at least 1 and --level between 0 and 9")
    print("| sketch | reports in the day | zlib level | stored | write | read |")
    print("|---|---:|---|---:|---:|---:|")
    for name in args.workload:
        for n in args.n:
            for row in rows(name, n, args.level, args.seed):
                print(row, flush=True)


if __name__ == "__main__":
    main()

"""Mechanism throughput and memory on Apple's workloads; prints a Markdown table.

Usage: ``python -m benchmarks.mechanisms [--n 1000000 10000000] [--workload emoji safari]``.

Workloads: Emoji (CMS eps 4, k=65536, m=1024, d=2600 values) and Safari domains (HCMS eps 4,
k=1024, m=32768, d=250,000), values Zipf(1.1). Stages, each timed on one core:
- privatize: client batch privatization of n reports (``privatize_indices``);
- aggregate: folding the n reports into a sketch whose pages are already mapped (the steady
  state of a long-running aggregator; a cold sketch additionally pays the kernel's page faults);
- estimate: estimating all d candidates from scratch (fingerprints, FWHT for HCMS, gathers);
- floor: ``np.bincount`` over the same flat cell index, for HCMS, the practical lower bound.
Peak memory is the tracemalloc peak of a second, traced run of the stage (numpy buffers
included; for HCMS ``estimate`` it includes the transformed sketch).
"""

from __future__ import annotations

import argparse
import gc
import os
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dp_governor.api.demo.simulation import emoji_vocabulary, zipf_indices
from dp_governor.mechanisms import CMS, HCMS, FrequencyEstimate, HashFamily, HcmsSketch, Sketch


@dataclass(frozen=True)
class Stage:
    """One measured stage."""

    seconds: float
    peak_mib: float


def measure(fn: Callable[[], Any], again: Callable[[], Any] | None = None) -> tuple[Any, Stage]:
    """Time ``fn`` untraced, then run ``again`` (or ``fn``) under tracemalloc for the peak.

    tracemalloc slows Python-level allocation (the fingerprints' bytes objects), so the time
    and the memory come from two runs of the same work.
    """
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t0
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    (again or fn)()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return out, Stage(seconds, peak / 2**20)


def workload(name: str) -> tuple[CMS | HCMS, list[str]]:
    """The mechanism and vocabulary of a named workload."""
    if name == "emoji":
        return CMS(epsilon=4.0, k=65536, m=1024, hash_family=HashFamily(1)), emoji_vocabulary()
    if name == "safari":
        vocab = [f"www.domain{i}.example" for i in range(250_000)]
        return HCMS(epsilon=4.0, k=1024, m=32768, hash_family=HashFamily(2)), vocab
    raise SystemExit(f"unknown workload {name!r}")


def run(name: str, n: int, seed: int) -> list[str]:
    """Measure one workload at one size; return table rows."""
    mech, vocab = workload(name)
    rng = np.random.default_rng(seed)
    index = zipf_indices(len(vocab), n, 1.1, rng=rng)
    reports, priv = measure(lambda: mech.privatize_indices(vocab, index, rng=rng))

    def fresh() -> Sketch:
        out: Sketch = mech.sketch()
        out.add(mech.privatize_indices(vocab, index[:1], rng=rng))  # map its pages first
        return out

    sketch, spares = fresh(), [fresh()]
    _, agg = measure(lambda: sketch.add(reports), lambda: spares[0].add(reports))
    spares.clear()

    def estimate_cold() -> FrequencyEstimate:
        if isinstance(sketch, HcmsSketch):
            sketch._transformed = None  # measure the transform too
        return sketch.estimate(vocab)

    est, estimate = measure(lambda: sketch.estimate(vocab), estimate_cold)
    truth = np.bincount(index, minlength=len(vocab))
    rmse_top = float(np.sqrt(np.mean((est.counts - truth)[np.argsort(-truth)[:50]] ** 2)))
    rows = [
        f"| {name} | {mech.name.upper()} | {n:.0e} | privatize | {n / priv.seconds / 1e6:8.2f} M/s"
        f" | {priv.seconds:7.2f} s | {priv.peak_mib:8.0f} |",
        f"| {name} | {mech.name.upper()} | {n:.0e} | aggregate | {n / agg.seconds / 1e6:8.2f} M/s"
        f" | {agg.seconds:7.2f} s | {agg.peak_mib:8.0f} |",
        f"| {name} | {mech.name.upper()} | {n:.0e} | estimate {len(vocab):,d} | -"
        f" | {estimate.seconds:7.2f} s | {estimate.peak_mib:8.0f} |",
    ]
    if isinstance(mech, HCMS):
        flat = reports.j * mech.m + reports.l
        _, floor = measure(lambda: np.bincount(flat, minlength=mech.k * mech.m))
        rows.append(
            f"| {name} | floor | {n:.0e} | np.bincount | {n / floor.seconds / 1e6:8.2f} M/s"
            f" | {floor.seconds:7.2f} s | {floor.peak_mib:8.0f} |"
        )
    rows.append(
        f"| {name} | {mech.name.upper()} | {n:.0e} | RMSE top 50 | {rmse_top:,.0f}"
        f" (analytic sd {float(np.median(est.stderr)):,.0f}) | | |"
    )
    return rows


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run the workloads, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=float, nargs="+", default=[1e6, 1e7])
    parser.add_argument("--workload", nargs="+", default=["emoji", "safari"])
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    print(f"numpy {np.__version__}, {os.cpu_count()} CPUs visible, one core used")
    print("| workload | mechanism | n | stage | throughput | time | peak MiB |")
    print("|---|---|---|---|---|---|---|")
    for name in args.workload:
        for n in args.n:
            for row in run(name, int(n), args.seed):
                print(row, flush=True)


if __name__ == "__main__":
    main()

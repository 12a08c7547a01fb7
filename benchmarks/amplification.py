"""Amplification by shuffling: time and value of the central bound; prints Markdown tables.

Usage: ``python -m benchmarks.amplification [--sizes 4 5 6 7 8] [--eps0 1 2 4 8]
[--delta 1e-6] [--no-compose]``, ``python -m benchmarks.amplification --apple`` or
``python -m benchmarks.amplification --variation [--sizes 5 6 7] [--eps0 1 2 4 8]``.

- bound: ``shuffle_epsilon(eps0, n, delta)`` for ``n = 10^k``: the first call on empty caches,
  then the cached call (median of 1,000), with FMT21's closed form beside it where it applies;
- composed (unless ``--no-compose``): ``compose_shuffled`` of one batch a day over 1, 90 and
  365 days at Apple's default local epsilons (2, 4, 8) and ``n`` of 10^5 to 10^7 devices a day,
  with the PLD of FMT21's pair (``"curve"``), and for the year with ``(eps, delta)`` pairs;
- cached central figures: :func:`dp_governor.budget.privacy.sub_batches.compose_sizes` of a year of
daily batches at
  ``n = 10^6`` and ``10^8``, first call and cached call;
- ``--variation``: beside FMT21 (what the service shows), what Wang et al.'s variation-ratio
  pair would claim at the reference points (generic, CMS and HCMS parameters) and the time of
  its first evaluation; not valid bounds for the service (docs/amplification.md);
- ``--apple``: the central epsilon of Apple's default policies
(:mod:`dp_governor.policies.defaults`) at
  10^5, 10^6 and 10^7 devices a day, each device sending its policy's daily maximum, one batch
  a day, over one day, 90 days and a year, at each policy's delta (the table in
  docs/amplification.md).
"""

from __future__ import annotations

import argparse
import statistics
import time

from dp_governor.budget.privacy.amplification import (
    clear_caches,
    compose_shuffled,
    fmt21_closed_form_epsilon,
    shuffle_epsilon,
)
from dp_governor.budget.privacy.sub_batches import compose_sizes
from dp_governor.budget.privacy.variation_ratio import (
    VariationParameters,
    variation_ratio_epsilon,
)
from dp_governor.policies import default_policies


def bound_table(sizes: list[int], eps0s: list[float], delta: float) -> None:
    """One row per ``(eps0, n)``: the bound, its first-call and cached times."""
    print(f"central epsilon at delta = {delta:g} (FMT21 Theorem 3.2, numerical)\n")
    print("| eps0 | n | epsilon | closed form | first call (s) | cached (us) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for eps0 in eps0s:
        for k in sizes:
            n = 10**k
            clear_caches()
            start = time.perf_counter()
            bound = shuffle_epsilon(eps0, n, delta)
            first = time.perf_counter() - start
            cached = []
            for _ in range(1_000):
                start = time.perf_counter()
                shuffle_epsilon(eps0, n, delta)
                cached.append(time.perf_counter() - start)
            closed = fmt21_closed_form_epsilon(eps0, n, delta)
            shown = f"{bound.epsilon:.4g}" if bound.amplified else f"{eps0:g} (none)"
            closed_shown = "n/a" if closed is None else f"{closed:.4g}"
            print(
                f"| {eps0:g} | 10^{k} | {shown} | {closed_shown} | {first:.3f} "
                f"| {statistics.median(cached) * 1e6:.1f} |"
            )


def composed_table(delta: float) -> None:
    """One batch a day composed over a day, 90 days and a year (dp-accounting PLD)."""
    print(f"\ncomposed central epsilon at total delta = {delta:g}, one batch a day")
    print("(PLD of FMT21's pair per batch; the last column composes (eps, delta) pairs instead)\n")
    print("| eps0 | devices a day | 1 day | 90 days | 365 days | 365 days, pairs | time (s) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for eps0 in (2.0, 4.0, 8.0):
        for k in (5, 6, 7):
            start = time.perf_counter()
            days = [(eps0, 10**k)]
            row = [compose_shuffled(days * d, delta, method="curve") for d in (1, 90, 365)]
            pairs = compose_shuffled(days * 365, delta, method="pairs")
            took = time.perf_counter() - start
            cells = " | ".join(f"{r.epsilon:.3g}" for r in [*row, pairs])
            print(f"| {eps0:g} | 10^{k} | {cells} | {took:.1f} |")


def cached_table(delta: float) -> None:
    """The service's central figure of a year of daily batches: first call, then cached."""
    print(f"\ncentral figure of 365 daily batches, eps0 = 4, delta = {delta:g}\n")
    print("| n a batch | epsilon | first call (s) | cached (us) |")
    print("|---:|---:|---:|---:|")
    for k in (6, 8):
        clear_caches()
        start = time.perf_counter()
        epsilon, _ = compose_sizes(4.0, [10**k] * 365, delta)
        first = time.perf_counter() - start
        cached = []
        for _ in range(1_000):
            start = time.perf_counter()
            compose_sizes(4.0, [10**k] * 365, delta)
            cached.append(time.perf_counter() - start)
        print(f"| 10^{k} | {epsilon:.4g} | {first:.2f} | {statistics.median(cached) * 1e6:.1f} |")


def apple_table() -> None:
    """Central epsilon of Apple's default policies, one batch a day of ``n`` devices."""
    print("central epsilon of Apple's default policies (policies/defaults.py): one shuffled")
    print("batch a day, n distinct devices each sending the policy's daily maximum k (k")
    print("sub-batches of n a day, composed); FMT21 Theorem 3.2 per sub-batch, composed with")
    print("dp-accounting PLD (the smaller of the pair-curve and (eps, delta)-pair compositions);")
    print("at each policy's delta\n")
    print("| use case | eps0/report | k/day | delta | devices a day | 1 day | 90 days | 365 days |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    figures: dict[tuple[float, int, float, int, int], float] = {}
    for policy in default_policies():
        eps0, k, delta = policy.epsilon_per_report, policy.max_reports_per_day, policy.delta
        for exponent in (5, 6, 7):
            cells = []
            for days in (1, 90, 365):
                key = (eps0, k, delta, exponent, days)
                if key not in figures:
                    batches = [(eps0, 10**exponent)] * (k * days)
                    figures[key] = compose_shuffled(batches, delta).epsilon
                cells.append(f"{figures[key]:.3g}")
            print(
                f"| {policy.name} | {eps0:g} | {k} | {delta:g} | 10^{exponent} | "
                + " | ".join(cells)
                + " |",
                flush=True,
            )


def variation_table(sizes: list[int], eps0s: list[float], delta: float) -> None:
    """FMT21 (valid, shown) beside the variation-ratio pair's claims (not valid for sketches)."""
    print(f"central epsilon at delta = {delta:g}: FMT21 beside the variation-ratio pair\n")
    print("| eps0 | n | FMT21 (shown) | VR generic | VR CMS | VR HCMS | VR first calls (s) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    makers = (VariationParameters.generic, VariationParameters.cms, VariationParameters.hcms)
    for eps0 in eps0s:
        for k in sizes:
            n = 10**k
            fmt21 = shuffle_epsilon(eps0, n, delta)
            start = time.perf_counter()
            claims = [variation_ratio_epsilon(make(eps0), n, delta) for make in makers]
            took = time.perf_counter() - start
            shown = f"{fmt21.epsilon:.4g}" if fmt21.amplified else f"{eps0:g} (none)"
            cells = " | ".join(f"{claim:.4g}" for claim in claims)
            print(f"| {eps0:g} | 10^{k} | {shown} | {cells} | {took:.2f} |", flush=True)


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 5, 6, 7, 8])
    parser.add_argument("--eps0", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--delta", type=float, default=1e-6)
    parser.add_argument("--no-compose", action="store_true")
    parser.add_argument("--apple", action="store_true", help="only the default policies' table")
    parser.add_argument(
        "--variation", action="store_true", help="only FMT21 beside the variation-ratio pair"
    )
    args = parser.parse_args(argv)
    if args.apple:
        apple_table()
        return
    if any(k < 0 or k > 12 for k in args.sizes):
        parser.error("--sizes are exponents of 10 between 0 and 12")
    if args.variation:
        variation_table(args.sizes, args.eps0, args.delta)
        return
    bound_table(args.sizes, args.eps0, args.delta)
    if not args.no_compose:
        cached_table(args.delta)
        composed_table(args.delta)


if __name__ == "__main__":
    main()

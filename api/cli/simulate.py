"""``dpgov simulate``: a fleet privatizing with the real mechanism, no service."""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING, Annotated

import typer

from dp_governor.api.cli.common import Progress, finite, print_table, result_table

if TYPE_CHECKING:
    import numpy as np

    from dp_governor.mechanisms import CMS, HCMS, SFP


class UseCase(enum.StrEnum):
    """The collections ``dpgov simulate`` can run, with Apple's published parameters."""

    emoji = "emoji"
    safari = "safari"
    quicktype = "quicktype"


def simulate(
    use_case: Annotated[
        UseCase, typer.Option("--use-case", "-u", help="Which collection to simulate.")
    ] = UseCase.emoji,
    devices: Annotated[
        int,
        typer.Option("--devices", "-n", min=1, max=100_000_000, help="Devices, one report each."),
    ] = 1_000_000,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the simulation's generator.")] = 7,
    hash_seed: Annotated[int, typer.Option(min=0, help="Seed of the shared hash family.")] = 0,
    exponent: Annotated[
        float, typer.Option(parser=finite(0.0, 10.0), help="Zipf exponent, 0 to 10.")
    ] = 1.1,
    top: Annotated[int, typer.Option(min=1, max=1000, help="How many items to print.")] = 10,
) -> None:
    """Simulate a fleet privatizing with the real mechanism; print the top estimates and truth."""
    import numpy as np

    from dp_governor.api.demo.simulation import (
        default_mechanism,
        emoji_vocabulary,
        simulate_frequency,
    )
    from dp_governor.mechanisms import SFP

    rng = np.random.default_rng(seed)
    mechanism = default_mechanism(use_case.value, hash_seed)
    if isinstance(mechanism, SFP):
        _simulate_sfp(mechanism, devices, exponent, top, rng)
        return
    if use_case is UseCase.emoji:
        vocabulary = emoji_vocabulary()
    else:
        vocabulary = [f"www.domain{i}.example" for i in range(250_000)]
    _print_header(mechanism, devices, len(vocabulary))
    with Progress("simulate: privatize and sketch", "devices") as progress:
        result = simulate_frequency(
            mechanism, vocabulary, devices, exponent=exponent, rng=rng, top=top, progress=progress
        )
    table = result_table("rank", "item", "true count", "estimate", "95% +-", "true rank")
    for row in result.top:
        true_rank = result.true_top.index(row.item) + 1 if row.item in result.true_top else "-"
        table.add_row(
            str(row.rank),
            row.item,
            f"{row.true_count:,d}",
            f"{row.estimate:,.0f}",
            f"{1.96 * row.stderr:,.0f}",
            str(true_rank),
        )
    print_table(table)
    hits = len(set(result.true_top) & {r.item for r in result.top})
    print(f"\n{hits}/{top} of the true top {top} recovered.")
    _print_timing(result.seconds, devices)
    _print_spend(mechanism.epsilon)


def _print_header(mechanism: CMS | HCMS | SFP, devices: int, d: int) -> None:
    from dp_governor.mechanisms import SFP

    if isinstance(mechanism, SFP):
        params = (
            f"SFP eps={mechanism.epsilon_word:g}+{mechanism.epsilon_fragment:g},"
            f" k={mechanism.k}, m={mechanism.m},"
            f" k'={mechanism.k_fragment}, m'={mechanism.m_fragment}"
        )
    else:
        name = mechanism.name.upper()
        params = f"{name} eps={mechanism.epsilon:g}, k={mechanism.k}, m={mechanism.m}"
    print(f"Simulating {devices:,d} devices, {d:,d} possible values, {params}.\n")


def _print_timing(seconds: dict[str, float], devices: int) -> None:
    parts = ", ".join(f"{k} {v:.2f} s" for k, v in seconds.items())
    print(f"Timing ({devices:,d} reports): {parts}.")


def _print_spend(epsilon: float) -> None:
    print(
        f"Each report is {epsilon:g}-LDP (the mechanism's parameter). This simulation keeps no"
        " ledger; `dpgov demo` charges every report to a real one and prints the spend."
    )


def _simulate_sfp(
    sfp: SFP, devices: int, exponent: float, top: int, rng: np.random.Generator
) -> None:
    import numpy as np

    from dp_governor.api.demo.simulation import CHUNK, made_up_words, zipf_indices

    words = made_up_words(5000, rng=rng)
    _print_header(sfp, devices, len(words))
    seconds = {"privatize": 0.0, "aggregate": 0.0}
    t0 = time.perf_counter()
    index = zipf_indices(len(words), devices, exponent, rng=rng)
    truth = np.bincount(index, minlength=len(words))
    values = np.asarray(words, dtype=object)
    sketch = sfp.sketch()
    seconds["privatize"] += time.perf_counter() - t0
    with Progress("simulate: privatize and sketch", "devices") as progress:
        for start in range(0, devices, CHUNK):
            t1 = time.perf_counter()
            reports = sfp.privatize(values[index[start : start + CHUNK]], rng=rng)
            t2 = time.perf_counter()
            sketch.add(reports)
            seconds["privatize"] += t2 - t1
            seconds["aggregate"] += time.perf_counter() - t2
            progress(min(devices, start + CHUNK), devices)
    t3 = time.perf_counter()
    found = sketch.discover_detailed()
    seconds["discover"] = time.perf_counter() - t3
    position = {w: i for i, w in enumerate(words)}
    true_top = [words[i] for i in np.argsort(-truth, kind="stable")[:top].tolist()]
    table = result_table("rank", "discovered word", "true count", "estimate", "95% +-")
    for r, d in enumerate(found[:top], start=1):
        true_count = int(truth[position[d.word]]) if d.word in position else 0
        table.add_row(
            str(r), d.word, f"{true_count:,d}", f"{d.count:,.0f}", f"{1.96 * d.stderr:,.0f}"
        )
    print_table(table)
    hits = len(set(true_top) & {d.word for d in found})
    print(f"\n{len(found)} words discovered; {hits}/{top} of the true top {top} among them.")
    _print_timing(seconds, devices)
    _print_spend(sfp.epsilon)

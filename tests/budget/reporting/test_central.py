"""Central figures of published batches: layers for k reports a device, worst sub-batches composed.

Exact reference for k reports per device: binary randomized response, every report of a device
randomizing the device's one bit with fresh coins. The shuffled batch is the count of ones, so
the central curve for device 1's bit flipped is exact: ``P`` and ``Q`` are the laws of device
1's ``k`` reports plus the other devices' reports (``Bin`` sums for each group of others with
the same number of reports and the same bit). The layered bound (one FMT21 bound per sub-batch,
composed) must never be below it at its own ``epsilon``.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

import numpy as np
import numpy.typing as npt
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dp_governor.budget.clock import utc_day
from dp_governor.budget.privacy.accountant import Accountant
from dp_governor.budget.privacy.amplification import (
    CURVE_METHOD,
    clear_caches,
    compose_shuffled,
    shuffle_epsilon,
)
from dp_governor.budget.reporting.central import (
    ADAPTIVE,
    FIXED_SCHEDULE,
    MAX_BATCHES_SHOWN,
    ONE_BATCH,
    PRECONDITIONS,
    RUNNING_TOTAL,
    _compose,
    batch_layers,
    central_line,
    compose_sizes,
    consistent,
    render_central,
)
from dp_governor.budget.storage.tables import ShuffledBatch
from dp_governor.policies import PolicyCreate
from dp_governor.policies.model import Policy
from tests.budget.privacy.test_amplification import exact_rr_delta, others_grid

FloatArray = npt.NDArray[np.float64]
ROUNDING = 1e-14
DELTA = 1e-6


def _others(q: float, groups: list[tuple[int, int, int]]) -> FloatArray:
    """Law of the ones sent by other devices: ``(devices, reports each, ones-bit devices)``."""
    law = np.ones(1)
    for devices, reports, ones in groups:
        law = np.convolve(law, stats.binom.pmf(np.arange(ones * reports + 1), ones * reports, q))
        zeros = (devices - ones) * reports
        law = np.convolve(law, stats.binom.pmf(np.arange(zeros + 1), zeros, 1.0 - q))
    return np.asarray(law, dtype=np.float64)


def exact_delta(eps0: float, k: int, groups: list[tuple[int, int, int]], epsilon: float) -> float:
    """Exact ``delta(epsilon)`` of the count of ones, device 1 (``k`` reports) flipped."""
    q = 1.0 / (1.0 + math.exp(-eps0))
    others = _others(q, groups)
    mine_1 = stats.binom.pmf(np.arange(k + 1), k, q)
    mine_0 = stats.binom.pmf(np.arange(k + 1), k, 1.0 - q)
    p, r = np.convolve(others, mine_1), np.convolve(others, mine_0)
    forward = float(np.maximum(p - math.exp(epsilon) * r, 0.0).sum())
    backward = float(np.maximum(r - math.exp(epsilon) * p, 0.0).sum())
    return max(forward, backward)


@pytest.mark.parametrize("eps0", [1.0, 2.0, 4.0])
@pytest.mark.parametrize(("n", "twos"), [(20, 20), (100, 2), (100, 50), (400, 400), (400, 10)])
def test_layered_bound_never_below_exact_two_reports(eps0: float, n: int, twos: int) -> None:
    """A device with 2 reports among ``n`` devices of which ``twos`` (itself included) sent 2."""
    epsilon, _ = compose_sizes(eps0, [n, twos], DELTA)
    assert epsilon <= 2 * eps0 + 1e-9  # never worse than the local guarantee of two reports
    singles = n - twos
    for frac_one in (0.0, 0.25, 0.5, 1.0):
        for frac_two in (0.0, 0.5, 1.0):
            groups = [
                (singles, 1, round(frac_one * singles)),
                (twos - 1, 2, round(frac_two * (twos - 1))),
            ]
            exact = exact_delta(eps0, 2, groups, epsilon)
            assert exact <= DELTA + ROUNDING * math.exp(epsilon), (groups, epsilon, exact)


@settings(max_examples=15)
@given(
    eps0=st.sampled_from([0.5, 1.0, 3.0]),
    k=st.integers(1, 3),
    n=st.integers(5, 120),
    data=st.data(),
)
def test_layered_bound_never_below_exact_random_batches(
    eps0: float, k: int, n: int, data: st.DataObject
) -> None:
    """Random report counts (device 1 has ``k``) and bits: the layered bound dominates."""
    counts = [k, *data.draw(st.lists(st.integers(1, k), min_size=n - 1, max_size=n - 1))]
    bits = data.draw(st.lists(st.booleans(), min_size=n - 1, max_size=n - 1))
    layers = batch_layers(counts)
    epsilon, _ = compose_sizes(eps0, layers, DELTA)
    groups = [(1, c, int(b)) for c, b in zip(counts[1:], bits, strict=True)]
    exact = exact_delta(eps0, k, groups, epsilon)
    assert exact <= DELTA + ROUNDING * math.exp(epsilon)


@pytest.mark.parametrize("delta", [1e-3, 1e-9])
@pytest.mark.parametrize(("eps0", "n"), [(1.0, 300), (2.0, 1000), (4.0, 3000), (0.5, 50)])
def test_certified_epsilon_holds_exactly_at_other_deltas(eps0: float, n: int, delta: float) -> None:
    """At the service's delta (1e-9) and a loose one: the exact RR curve is within delta."""
    bound = shuffle_epsilon(eps0, n, delta)
    assert exact_rr_delta(eps0, n, bound.epsilon, others_grid(n)) <= delta + 1e-14 * math.exp(
        bound.epsilon
    )


def test_one_layer_is_the_plain_bound_and_rounding_only_weakens() -> None:
    plain = shuffle_epsilon(4.0, 10**6, DELTA).epsilon
    rounded, method = compose_sizes(4.0, [10**6], DELTA)
    assert rounded >= plain and rounded < 1.05 * plain  # 10^6 rounds down by < 9%
    assert "FMT21" in method
    assert compose_sizes(4.0, [12], DELTA)[0] == shuffle_epsilon(4.0, 12, DELTA).epsilon


def test_layers_count_devices_with_at_least_i_reports() -> None:
    assert batch_layers([]) == []
    assert batch_layers([1, 1, 1]) == [3]
    assert batch_layers([2, 1, 3, 2]) == [4, 3, 1]
    with pytest.raises(ValueError, match="sizes"):
        compose_sizes(4.0, [], DELTA)


def _policy(**extra: object) -> Policy:
    fields = {
        "name": "emoji",
        "mechanism": "cms",
        "k": 16,
        "m": 64,
        "epsilon_per_report": 4.0,
        "max_reports_per_day": 2,
        "retention_days": 30,
        "min_batch_devices": 1000,
        **extra,
    }
    return Policy(version=1, **PolicyCreate.model_validate(fields).model_dump())


def _batch(day: int, layers: list[int], *, untagged: int = 0) -> ShuffledBatch:
    return ShuffledBatch(
        use_case="emoji",
        day=day,
        first_day=day,
        last_day=day,
        devices=layers[0],
        reports=sum(layers) + untagged,
        max_per_device=len(layers),
        layers=orjson.dumps(layers).decode(),
        untagged=untagged,
        epsilon_micro=4_000_000,
        min_batch_devices=1000,
    )


def test_central_line_composes_the_smallest_sub_batches() -> None:
    today = utc_day(datetime(2026, 11, 22, tzinfo=UTC))
    policy = _policy()
    batches = [_batch(today - d, [10**6, 10**4]) for d in range(40)] + [_batch(today, [10**5])]
    line = central_line(policy, [policy], batches, today)
    assert [d.day for d in line.days][-1] == "2026-11-22" and len(line.days) == 30
    first = line.days[-1]
    assert sorted(b.devices for b in first.batches) == [10**5, 10**6]
    # a device sends at most 2 reports a day: the day's two smallest sub-batches
    assert first.composed is not None and first.composed.sub_batches == 2
    assert first.composed.epsilon == pytest.approx(compose_sizes(4.0, [10**4, 10**5], 1e-9)[0])
    assert line.window is not None and line.year is not None
    assert line.window.sub_batches == 2 * 30 and line.year.sub_batches == 2 * 40
    assert line.window.epsilon < line.year.epsilon
    assert line.delta == policy.delta and "honest" in line.preconditions
    mine = central_line(policy, [policy], batches, today, reports=(3, 5))
    assert mine.window is not None and mine.window.sub_batches == 3
    assert mine.window.epsilon < line.window.epsilon


def _untagged(day: int, reports: int) -> ShuffledBatch:
    """A batch as the flush records one of a policy with no ``min_batch_devices``."""
    batch = _batch(day, [0], untagged=reports)
    batch.devices, batch.reports, batch.max_per_device, batch.layers = 0, reports, 0, "[]"
    return batch


def test_batches_of_uncounted_devices_alone_get_no_central_figure() -> None:
    today = 20_000
    policy = _policy()
    line = central_line(policy, [policy], [_untagged(today, 5000)], today)
    assert line.window is None and line.days[0].batches[0].central is None
    assert line.days[0].composed is None
    assert line.notes and "pseudonym" in line.notes[0]
    assert "distinct devices the adversary does not control" in PRECONDITIONS


def test_uncounted_reports_count_unamplified_beside_counted_batches() -> None:
    today = 20_000
    policy = _policy()  # 2 reports a device a day
    batches = [_batch(today - 1, [5000]), _untagged(today - 1, 3), _batch(today, [6000, 10])]
    line = central_line(policy, [policy], batches, today)
    # two days, 4 reports at most: the uncounted batch's 3 reports (alone each), then 10
    assert line.window is not None and line.window.sub_batches == 4
    assert line.window.epsilon == compose_sizes(4.0, [1, 1, 1, 10], 1e-9)[0]
    assert "3 of them reports queued without a device pseudonym" in line.window.note
    yesterday = line.days[0]
    assert yesterday.composed is not None and yesterday.composed.sub_batches == 2
    assert yesterday.composed.epsilon == compose_sizes(4.0, [1, 1], 1e-9)[0]
    mixed = _batch(today, [5000], untagged=3)  # a batch that counted most of its devices
    figure = central_line(policy, [policy], [mixed], today).days[0].batches[0].central
    assert figure is not None and figure.epsilon == compose_sizes(4.0, [1], 1e-9)[0]


def test_a_day_of_frequent_flushes_lists_its_smallest_batches() -> None:
    today = 20_000
    policy = _policy(max_reports_per_day=1)
    batches = [_batch(today, [1000 + 10 * i]) for i in range(MAX_BATCHES_SHOWN + 6)]
    (day,) = central_line(policy, [policy], batches, today).days
    assert day.published == MAX_BATCHES_SHOWN + 6 and len(day.batches) == MAX_BATCHES_SHOWN
    assert max(b.devices for b in day.batches) == 1000 + 10 * (MAX_BATCHES_SHOWN - 1)
    assert day.devices == sum(b.devices for b in batches)
    # one report a device a day: the day's single smallest batch bounds it
    assert day.composed is not None and day.composed.sub_batches == 1
    assert day.composed.epsilon == compose_sizes(4.0, [1000], 1e-9)[0]


def test_batches_published_in_parts_count_unamplified() -> None:
    """A batch of before revision 0009 whose parts were not counted hides none of its reports.

    Its record counts the whole batch's devices, but a report was hidden only among its part,
    which could be one report: each of its reports is a sub-batch of one device.
    """
    today = 20_000
    policy = _policy()  # 2 reports a device a day
    split = _batch(today - 1, [5000, 40])
    split.split = True
    line = central_line(policy, [policy], [split, _batch(today, [6000])], today)
    assert line.days[0].batches[0].central is None  # no figure of its own
    assert line.days[1].batches[0].central is not None
    assert line.window is not None and line.window.sub_batches == 4
    assert line.window.epsilon == compose_sizes(4.0, [1, 1, 1, 1], 1e-9)[0]
    assert "batches published in parts before revision 0009" in line.window.note
    assert any("revision 0009" in note for note in line.notes)
    alone = central_line(policy, [policy], [split], today - 1)
    assert alone.window is None and alone.days[0].composed is None


def test_every_figure_is_labelled_and_adaptive_composes_the_smallest() -> None:
    today = 20_000
    policy = _policy()  # 2 reports a device a day
    batches = [_batch(today - d, [10**5, 10**3]) for d in range(10)]
    line = central_line(policy, [policy], batches, today)
    assert line.days[0].batches[0].central is not None
    assert line.days[0].batches[0].central.kind == ONE_BATCH
    assert line.days[0].composed is not None and line.days[0].composed.kind == FIXED_SCHEDULE
    assert line.window is not None and line.window.kind == FIXED_SCHEDULE
    assert line.window_adaptive is not None and line.window_adaptive.kind == ADAPTIVE
    assert line.year_adaptive is not None and line.year_adaptive.kind == ADAPTIVE
    # the fixed schedule: 10 days of (10^5, 10^3); adaptive: 20 copies of 10^3
    assert line.window.epsilon == compose_sizes(4.0, [10**5, 10**3] * 10, 1e-9)[0]
    assert line.window_adaptive.epsilon == compose_sizes(4.0, [10**3] * 20, 1e-9)[0]
    assert line.window.epsilon < line.window_adaptive.epsilon
    assert ADAPTIVE in line.window_adaptive.note and "copies of the smallest" in (
        line.window_adaptive.note
    )
    mine = central_line(policy, [policy], batches, today, reports=(3, 5))
    assert mine.window is not None and mine.window.kind == RUNNING_TOTAL
    assert mine.window_adaptive == line.window_adaptive  # the policy's cap, not the count
    text = "\n".join(render_central([line]))
    assert FIXED_SCHEDULE in text and ADAPTIVE in text


@pytest.mark.parametrize(
    "damage",
    [
        {"layers": "[10, 500]"},  # increasing: not a batch's layers
        {"devices": 20_000},  # more devices than the first layer counts
        {"reports": 7},  # fewer reports than the layers hold
        {"max_per_device": 3},
        {"layers": "not json"},
        {"layers": "[500, 0]"},
    ],
)
def test_a_batch_record_that_fails_its_counts_hides_nobody(damage: dict[str, object]) -> None:
    today = 20_000
    policy = _policy(max_reports_per_day=1)
    bad = _batch(today, [500, 10])
    for name, value in damage.items():
        setattr(bad, name, value)
    assert not consistent(bad) and consistent(_batch(today, [500, 10]))
    line = central_line(policy, [policy], [_batch(today - 1, [6000]), bad], today)
    assert line.window is not None and line.window.epsilon == compose_sizes(4.0, [1, 1], 1e-9)[0]
    assert any("fail the check" in n for n in line.notes)
    assert line.days[1].batches[0].central is None


def test_a_year_of_daily_batches_composes_fast_and_is_cached() -> None:
    """365 batches of 10^6 at eps0 = 4: well under 2 s on a first call, then from the cache."""
    clear_caches()
    _compose.cache_clear()
    started = time.perf_counter()
    year = compose_sizes(4.0, [10**6] * 365, 1e-6)
    first = time.perf_counter() - started
    started = time.perf_counter()
    assert compose_sizes(4.0, [10**6] * 365, 1e-6) == year
    cached = time.perf_counter() - started
    assert first < 2.0 and cached < 0.05, (first, cached)
    assert 1.0 < year[0] < 1.3 and "FMT21 pair" in year[1]


def test_ninety_days_beat_advanced_and_local_composition() -> None:
    """The issue's check: 90 daily batches of 10^6 at eps0 = 4, delta 1e-6."""
    composed = compose_shuffled([(4.0, 10**6)] * 90, 1e-6)
    assert composed.method == CURVE_METHOD
    assert 0.5 < composed.epsilon < 0.56  # the FMT21 pair composed (0.549 on a finer grid)
    # advanced composition (Dwork, Rothblum and Vadhan 2010), its best split of delta
    advanced = min(
        math.sqrt(2 * 90 * math.log(1 / ((1 - f) * 1e-6))) * e + 90 * e * math.expm1(e)
        for f in (0.1, 0.25, 0.5, 0.75, 0.9)
        for e in [shuffle_epsilon(4.0, 10**6, f * 1e-6 / 90).epsilon]
    )
    assert composed.epsilon < advanced / 5 and advanced > 2.45
    assert Accountant().loss({4.0: 90}, delta=1e-6).epsilon > 359.0

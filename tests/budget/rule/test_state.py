"""The packed device state against a plain list of charges (exact: no randomness involved)."""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from hypothesis import given
from hypothesis import strategies as st

from dp_governor.budget.rule.state import (
    ANY_BUDGET,
    AccountState,
    decode,
    lifetime_counts,
    window_counts,
)

USE_CASES = ["emoji", "safari-energy-domains", "safari-crash-domains"]
Charge = tuple[str, int, int, int]  # use case, day, micro-epsilon, group size
charges = st.lists(
    st.tuples(
        st.sampled_from(USE_CASES),
        st.integers(20_000, 20_200),  # day
        st.sampled_from([1_000_000, 2_000_000, 4_000_000]),  # micro-epsilon per report
        st.sampled_from([1, 5]),  # group size
    ),
    max_size=60,
)
horizons = st.dictionaries(st.sampled_from(USE_CASES), st.integers(19_990, 20_210))


def _roundtrip(state: AccountState) -> AccountState:
    return decode(state.count, state.epsilon_micro, state.encode_days(), state.encode_lifetime())


def _charged(made: list[Charge]) -> AccountState:
    state = AccountState()
    for use_case, d, eps, g in made:  # in any order: a clock set back adds an earlier day
        state.charge(use_case, d, eps, g)
    return _roundtrip(state)


@given(
    charges,
    st.integers(20_000, 20_300),
    st.integers(1, 120),
    st.sets(st.sampled_from(USE_CASES), min_size=1),
    horizons,
)
def test_every_question_matches_the_charges_it_holds(
    made: list[Charge], day: int, retention: int, members: set[str], held: dict[str, int]
) -> None:
    state = _charged(made)
    assert [entry[0] for entry in state.days] == sorted({d for _, d, _, _ in made})
    assert state.count == len(made) and state.epsilon_micro == sum(e for _, _, e, _ in made)
    idx = state.members(frozenset(members))
    mine = [c for c in made if c[0] in members]
    today = [e for _, d, e, _ in mine if d == day]
    assert state.today(day, idx) == (len(today), sum(today))
    assert state.reports_on(day, idx) == len(today)

    def counted(c: Charge) -> bool:
        return day - retention < c[1] <= day and c[1] > held.get(c[0], -(10**9))

    def undated(c: Charge) -> bool:  # deleted, and the window reaches past the horizon
        horizon = held.get(c[0], -(10**9))
        return day - retention < horizon <= day and c[1] <= horizon

    per_day: Counter[int] = Counter()
    for c in mine:
        if counted(c):
            per_day[c[1]] += c[2]
        elif undated(c):
            per_day[held[c[0]]] += c[2]
    merged: Counter[int] = Counter()
    for d, e in state.window(day, retention, idx, held):
        merged[d] += e
    assert merged == per_day
    assert state.window_spend(day, retention, idx, held) == sum(per_day.values())
    assert state.lifetime_spend(idx) == sum(e for _, _, e, _ in mine)
    assert lifetime_counts(state) == dict(Counter((u, e, g, "") for u, _, e, g in made))
    daily = state.daily()
    for use_case, d, _, _ in made:
        same = [e for u, dd, e, _ in made if u == use_case and dd == d]
        assert daily[use_case][d] == (len(same), sum(same))


@given(charges, horizons)
def test_prune_clears_exactly_the_days_on_or_before_each_horizon(
    made: list[Charge], held: dict[str, int]
) -> None:
    state = _charged(made)
    gone = {(u, d, e, g) for u, d, e, g in made if d <= held.get(u, -(10**9))}
    cleared = state.prune(held)
    assert cleared == len(gone)
    after = _roundtrip(state)
    kept = Counter((u, d) for u, d, e, g in made if (u, d, e, g) not in gone)
    days = after.daily()
    assert {(u, d): n for u, per in days.items() for d, (n, _) in per.items()} == dict(kept)
    assert lifetime_counts(after) == dict(Counter((u, e, g, "") for u, _, e, g in made))
    assert all(any(entry[1:]) for entry in after.days)  # no empty day entry is kept


def test_slots_keep_the_terms_of_each_charge() -> None:
    state = AccountState()
    state.charge("emoji", 20_000, 4_000_000, 5)
    state.charge("emoji", 20_001, 4_000_000, 1)  # group size edited 5 -> 1
    assert lifetime_counts(state) == {
        ("emoji", 4_000_000, 5, ""): 1,
        ("emoji", 4_000_000, 1, ""): 1,
    }


def test_days_are_packed_as_differences_without_trailing_zeros() -> None:
    state = AccountState()
    state.charge("safari-energy-domains", 20_000, 4_000_000, budget="safari-domains")
    state.charge("safari-crash-domains", 20_000, 4_000_000, budget="safari-domains")
    state.charge("safari-energy-domains", 20_001, 4_000_000, budget="safari-domains")
    assert state.encode_days() == "[[20000,1,1],[1,1]]"
    assert state.encode_lifetime() == (
        '[["safari-energy-domains",4000000,1,2,"safari-domains"],'
        '["safari-crash-domains",4000000,1,1,"safari-domains"]]'
    )


def test_rows_written_before_budgets_were_recorded_count_under_every_budget_ever_held() -> None:
    state = decode(1, 4_000_000, "[[20000,1]]", '[["energy",4000000,1,1]]')
    assert state.slots == [["energy", 4_000_000, 1, 1, ANY_BUDGET]]

    class Budget(NamedTuple):
        budget: str
        members: frozenset[str]
        ever_members: frozenset[str]

    group = Budget("safari", frozenset({"crash"}), frozenset({"crash", "energy"}))
    assert state.counted(group) == [0]  # energy was once in the group: counted there
    other = Budget("other", frozenset({"x"}), frozenset({"x"}))
    assert state.counted(other) == []
    state.charge("energy", 20_001, 4_000_000, budget="energy")  # energy left: its own budget
    assert state.counted(group) == [0]  # what energy spends now is not the group's
    assert state.counted(Budget("energy", frozenset({"energy"}), frozenset({"energy"}))) == [0, 1]


def test_a_daily_reporter_fits_one_sqlite_page() -> None:
    # SQLite keeps at most ~1,000 bytes of a WITHOUT ROWID row on a 4 KiB page; more spills
    # into an overflow page that every write rewrites too.
    state = AccountState()
    for d in range(20_000, 20_090):
        for _ in range(2):
            state.charge("safari-energy-domains", d, 4_000_000)
            state.charge("safari-crash-domains", d, 4_000_000)
    assert len(state.days) == 90
    size = len(state.encode_days()) + len(state.encode_lifetime()) + 32 + 4 * 8
    assert size < 1_000, size


retentions = st.dictionaries(st.sampled_from(USE_CASES), st.integers(1, 250))


@given(charges, st.integers(20_000, 20_250), retentions, horizons)
def test_window_counts_per_use_case_retention_and_horizon(
    made: list[Charge], day: int, retention: dict[str, int], held: dict[str, int]
) -> None:
    """Each use case in its own window and after its horizon; unlisted ones left out.

    A window reaching back past its horizon counts every deleted report (an upper bound).
    """
    state = _charged(made)

    def counts(u: str, d: int) -> bool:
        horizon = held.get(u, -(10**9))
        if u not in retention:
            return False
        if day - retention[u] < horizon <= day and d <= horizon:
            return True  # deleted: the window cannot tell whether it held it
        return day - retention[u] < d <= day and d > horizon

    expected = Counter((u, e, g, "") for u, d, e, g in made if counts(u, d))
    assert window_counts(state, day, retention, held) == dict(expected)


def test_the_window_boundary() -> None:
    """A 90-day window ending on day D holds days D-89 .. D: D-90 is out, D+1 is not yet in."""
    state = AccountState()
    for d in (20_000 - 90, 20_000 - 89, 20_000, 20_001):
        state.charge("emoji", d, 4_000_000)
    assert window_counts(state, 20_000, {"emoji": 90}, {}) == {("emoji", 4_000_000, 1, ""): 2}
    idx = state.members(frozenset({"emoji"}))
    assert state.window_spend(20_000, 90, idx, {}) == 8_000_000

"""The packed account state against a plain list of charges (exact: no randomness involved)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from budget.state import AccountState, decode, lifetime_counts, window_counts

USE_CASES = ["emoji", "safari-energy-domains", "safari-crash-domains"]
charges = st.lists(
    st.tuples(
        st.sampled_from(USE_CASES),
        st.integers(20_000, 20_200),  # day
        st.sampled_from([1_000_000, 2_000_000, 4_000_000]),  # micro-epsilon per report
    ),
    max_size=60,
)


def _roundtrip(state: AccountState) -> AccountState:
    return decode(state.count, state.epsilon_micro, state.encode_days(), state.encode_lifetime())


@given(charges, st.integers(20_000, 20_300), st.integers(1, 120))
def test_every_question_matches_the_charges_it_holds(
    made: list[tuple[str, int, int]], day: int, retention: int
) -> None:
    state = AccountState()
    for use_case, d, eps in made:  # in any order: a clock set back adds an earlier day
        state.charge(use_case, d, eps, retention=10_000)  # nothing pruned yet
    assert [entry[0] for entry in state.days] == sorted({d for _, d, _ in made})
    state = _roundtrip(state)
    assert state.count == len(made) and state.epsilon_micro == sum(e for _, _, e in made)
    today = [e for _, d, e in made if d == day]
    assert state.today(day) == (len(today), sum(today))
    assert state.reports_on(day) == len(today)
    low = day - retention
    in_window = [(u, d, e) for u, d, e in made if low < d <= day]
    per_day: Counter[int] = Counter()
    for _, d, e in in_window:
        per_day[d] += e
    assert sorted(state.window(day, retention)) == sorted(per_day.items())
    assert state.window_spend(day, retention) == sum(e for _, _, e in in_window)
    for use_case in USE_CASES:
        expected = Counter(e for u, _, e in in_window if u == use_case)
        assert state.use_case_window(use_case, day, retention) == dict(expected)
    assert window_counts([state], day, dict.fromkeys(USE_CASES, retention)) == dict(
        Counter((u, e) for u, _, e in in_window)
    )
    assert lifetime_counts([state]) == dict(Counter((u, e) for u, _, e in made))
    daily = state.daily()
    for use_case, d, _ in made:
        n = sum(1 for u, dd, _ in made if u == use_case and dd == d)
        eps = sum(e for u, dd, e in made if u == use_case and dd == d)
        assert daily[use_case][d] == (n, eps)
    dropped = state.prune(low)
    assert dropped == len({d for _, d, _ in made if d <= low})
    assert all(entry[0] > low for entry in _roundtrip(state).days)


def test_a_charge_prunes_the_days_that_left_its_window() -> None:
    state = AccountState()
    for d in (100, 101, 150, 190):
        state.charge("emoji", d, 4_000_000, retention=90)
    assert [entry[0] for entry in state.days] == [101, 150, 190]  # 100 left with day 190's
    assert state.oldest_day == 101
    assert lifetime_counts([state]) == {("emoji", 4_000_000): 4}


def test_days_are_packed_as_differences_without_trailing_zeros() -> None:
    state = AccountState()
    state.charge("safari-energy-domains", 20_000, 4_000_000, retention=90)
    state.charge("safari-crash-domains", 20_000, 4_000_000, retention=90)
    state.charge("safari-energy-domains", 20_001, 4_000_000, retention=90)
    assert state.encode_days() == "[[20000,1,1],[1,1]]"
    assert state.encode_lifetime() == (
        '[["safari-energy-domains",4000000,2],["safari-crash-domains",4000000,1]]'
    )


def test_a_daily_reporter_fits_one_sqlite_page() -> None:
    # SQLite keeps at most ~1,000 bytes of a WITHOUT ROWID row on a 4 KiB page; more spills
    # into an overflow page that every write rewrites too.
    state = AccountState()
    for d in range(20_000, 20_090):
        for _ in range(2):
            state.charge("safari-energy-domains", d, 4_000_000, retention=90)
            state.charge("safari-crash-domains", d, 4_000_000, retention=90)
    assert len(state.days) == 90
    size = len(state.encode_days()) + len(state.encode_lifetime()) + 32 + 21 + 4 * 8
    assert size < 1_000, size


def test_a_use_case_that_changed_budget_counts_from_both_accounts() -> None:
    before, after = AccountState(), AccountState()  # its own budget, then a group's
    before.charge("emoji", 20_000, 4_000_000, retention=90)
    after.charge("emoji", 20_010, 2_000_000, retention=90)
    after.charge("safari-crash-domains", 20_010, 4_000_000, retention=90)
    both = [before, after]
    assert window_counts(both, 20_010, {"emoji": 90}) == {
        ("emoji", 4_000_000): 1,
        ("emoji", 2_000_000): 1,
    }
    assert window_counts(both, 20_010, {"emoji": 5}) == {("emoji", 2_000_000): 1}
    assert lifetime_counts(both) == {
        ("emoji", 4_000_000): 1,
        ("emoji", 2_000_000): 1,
        ("safari-crash-domains", 4_000_000): 1,
    }


@given(
    charges,
    charges,
    st.integers(20_000, 20_250),
    st.dictionaries(st.sampled_from(USE_CASES), st.integers(1, 250)),
)
def test_window_counts_per_use_case_retention_across_accounts(
    made: list[tuple[str, int, int]],
    elsewhere: list[tuple[str, int, int]],
    day: int,
    retention: dict[str, int],
) -> None:
    """Each use case in its own window, unlisted ones left out, summed over two accounts."""
    states = []
    for charged in (made, elsewhere):
        state = AccountState()
        for use_case, d, eps in charged:
            state.charge(use_case, d, eps, retention=10_000)
        states.append(_roundtrip(state))
    expected = Counter(
        (u, e) for u, d, e in made + elsewhere if u in retention and day - retention[u] < d <= day
    )
    assert window_counts(states, day, retention) == dict(expected)


def test_the_window_boundary() -> None:
    """A 90-day window ending on day D holds days D-89 .. D: D-90 is out, D+1 is not yet in."""
    state = AccountState()
    for d in (20_000 - 90, 20_000 - 89, 20_000, 20_001):
        state.charge("emoji", d, 4_000_000, retention=10_000)
    assert window_counts([state], 20_000, {"emoji": 90}) == {("emoji", 4_000_000): 2}
    assert state.use_case_window("emoji", 20_000, 90) == {4_000_000: 2}

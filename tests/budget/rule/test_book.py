"""The policy book's retention rule: spend kept for the longest retention ever, data for the latest.

Pure: books built from policy versions, no database (the purges that apply the rule are tested
in tests/pipeline/test_pipeline.py).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dp_governor.budget.rule.book import NO_HORIZON, PolicyBook, Retention
from dp_governor.policies.defaults import default_policies
from dp_governor.policies.model import Policy

DAY = 20_000


def _versions(name: str, *retention: int, retired: bool = False) -> list[Policy]:
    """One version per retention, in order; the last one retired if ``retired``."""
    body = default_policies()[0].model_dump()  # any valid policy: its retention is set here
    return [
        Policy(
            **{**body, "name": name, "retention_days": days},
            version=i + 1,
            active=not (retired and i == len(retention) - 1),
        )
        for i, days in enumerate(retention)
    ]


def test_lowering_retention_deletes_data_at_once_and_keeps_spend_for_the_longest() -> None:
    lowered = PolicyBook.build(_versions("emoji", 90, 30), {})
    assert lowered.purge_through(DAY) == {"emoji": Retention(DAY - 90, DAY - 30)}
    raised = PolicyBook.build(_versions("emoji", 90, 30, 90), {})
    assert raised.purge_through(DAY) == {"emoji": Retention(DAY - 90, DAY - 90)}


def test_a_retired_use_case_follows_the_same_rule() -> None:
    book = PolicyBook.build([*_versions("emoji", 30), *_versions("old", 60, 20, retired=True)], {})
    assert book.purge_through(DAY) == {
        "emoji": Retention(DAY - 30, DAY - 30),
        "old": Retention(DAY - 60, DAY - 20),
    }


def test_the_device_window_holds_spend_not_data() -> None:
    book = PolicyBook.build(_versions("emoji", 30), {}, device_window=120)
    assert book.purge_through(DAY)["emoji"] == Retention(DAY - 120, DAY - 30)


def test_nothing_deleted_is_recalled() -> None:
    # a horizon a purge reached under a shorter retention stays, for spend and data alike
    book = PolicyBook.build(_versions("emoji", 30, 90), {"emoji": DAY - 31})
    assert book.purge_through(DAY)["emoji"] == Retention(DAY - 31, DAY - 31)


@given(
    retention=st.lists(st.integers(1, 400), min_size=1, max_size=5),
    retired=st.booleans(),
    device_window=st.integers(0, 400),
    horizon=st.one_of(st.just(NO_HORIZON), st.integers(DAY - 500, DAY - 1)),
)
def test_data_never_outlives_its_spend_and_spend_never_returns(
    retention: list[int], retired: bool, device_window: int, horizon: int
) -> None:
    held = {} if horizon == NO_HORIZON else {"emoji": horizon}
    book = PolicyBook.build(
        _versions("emoji", *retention, retired=retired), held, None, device_window
    )
    kept = book.purge_through(DAY)["emoji"]
    assert kept.spend_through == max(DAY - max(*retention, device_window), horizon)
    assert kept.data_through == max(DAY - retention[-1], kept.spend_through)

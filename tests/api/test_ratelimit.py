"""The rate limiter: its allowance and refill, and a table that never outgrows ``max_keys``."""

from __future__ import annotations

import pytest

from dp_governor.api._ratelimit import RateLimiter


def test_a_burst_of_per_minute_then_one_every_interval() -> None:
    limiter = RateLimiter(2)  # a burst of 2, then one every 30 s
    assert [limiter.hit("k", now=t) for t in (0.0, 1.0, 2.0)] == [0, 0, 28]
    assert limiter.hit("k", now=29.9) == 1  # refused, and a refusal is not counted
    assert limiter.hit("k", now=30.0) == 0
    assert limiter.hit("k", now=30.0) == 30
    assert limiter.hit("other", now=2.0) == 0
    assert limiter.hit("k", now=200.0) == 0 and limiter.hit("k", now=200.0) == 0


def test_blocked_answers_without_counting() -> None:
    limiter = RateLimiter(1)
    assert limiter.blocked("k", now=0.0) == 0 and limiter.blocked("k", now=0.0) == 0
    assert limiter.hit("k", now=0.0) == 0
    assert limiter.blocked("k", now=1.0) == 59 and limiter.hit("k", now=1.0) == 59


def test_no_more_than_twice_per_minute_in_any_minute() -> None:
    limiter = RateLimiter(10)
    allowed = [t / 10 for t in range(0, 1200) if limiter.hit("k", now=t / 10) == 0]
    for start in allowed:
        assert sum(1 for t in allowed if start <= t < start + 60) <= 20
    assert len(allowed) == 10 + 119 // 6  # a burst of 10, then one every 6 s (6 ... 114)


def test_the_table_keeps_at_most_max_keys_forgetting_the_least_recent() -> None:
    limiter = RateLimiter(1, max_keys=100)
    for i in range(100_000):
        limiter.hit(f"device-{i}", now=0.0)
    assert len(limiter) == 100
    assert limiter.hit("device-99999", now=0.0) > 0  # remembered: the most recent
    assert limiter.hit("device-0", now=0.0) == 0  # forgotten long ago


@pytest.mark.parametrize(("per_minute", "max_keys"), [(0, 10), (5, 0)])
def test_bad_parameters_are_refused(per_minute: int, max_keys: int) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        RateLimiter(per_minute, max_keys=max_keys)

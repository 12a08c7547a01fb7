"""Injected time: every day is a UTC day, counted from 1970-01-01."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Protocol

__all__ = ["Clock", "FixedClock", "SystemClock", "date_day", "day_date", "day_start", "utc_day"]

_EPOCH = date(1970, 1, 1)


class Clock(Protocol):
    """Something that tells the current time (timezone-aware)."""

    def now(self) -> datetime:
        """The current time."""
        ...


class SystemClock:
    """The wall clock, in UTC."""

    def now(self) -> datetime:
        """The current UTC time."""
        return datetime.now(UTC)


class FixedClock:
    """A settable clock for tests and simulations."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def now(self) -> datetime:
        """The time it was set to."""
        return self.at

    def advance(self, **delta: float) -> None:
        """Move forward by a ``timedelta(**delta)``."""
        self.at += timedelta(**delta)


def utc_day(at: datetime) -> int:
    """The UTC day number of a timezone-aware time.

    >>> utc_day(datetime(1970, 1, 2, 23, 59, tzinfo=UTC))
    1
    """
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError(f"`now` must be timezone-aware, got {at!r}")
    return (at.astimezone(UTC).date() - _EPOCH).days


def day_start(day: int) -> datetime:
    """Midnight UTC at the start of a day number.

    >>> day_start(1).isoformat()
    '1970-01-02T00:00:00+00:00'
    """
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(days=day)


def day_date(day: int) -> date:
    """The calendar date of a day number."""
    return _EPOCH + timedelta(days=day)


def date_day(day: date) -> int:
    """The day number of a calendar date (the inverse of :func:`day_date`).

    >>> date_day(day_date(20418))
    20418
    """
    return (day - _EPOCH).days

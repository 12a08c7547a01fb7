"""What a stored summary sums over devices: a :class:`Measure`, and the report's.

A measure names functions of (device state, day) whose sums over devices a summary keeps
(:mod:`dp_governor.budget.reporting.summary`): the digest of everything they read besides the
rows, the day and the horizons, the window lengths they read each use case's days over, and a
:class:`Fold` that adds devices' values into :class:`~.population.Sums`. The report's measure
(:data:`REPORT_MEASURE`) is its (window, lifetime) passes, each use case's window its retention;
the what-if's are in :mod:`dp_governor.budget.reporting.what_if_summary`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from typing import Any, Final, Protocol

import orjson

from dp_governor.budget.reporting.population import SpendPass, Sums, slot_rows
from dp_governor.budget.rule.book import PolicyBook
from dp_governor.budget.rule.state import AccountState, lifetime_counts, window_counts

__all__ = ["REPORT", "REPORT_MEASURE", "Fold", "Measure", "versions_digest"]

REPORT: Final = "report"  # the effective-epsilon report's summary


class Fold(Protocol):
    """Devices' values at one day and set of horizons, summed as they are added."""

    def add(self, dk: str, state: AccountState) -> None:
        """Add the values of device ``dk`` (devices in key order, each once)."""

    def finish(self) -> Sums:
        """The finished sums of the devices added."""


class Measure(Protocol):
    """The functions of (device state, day) a summary sums, and what else they read."""

    @property
    def name(self) -> str:
        """The summary's row (``report_summaries.name``, at most 80 characters)."""

    def key(self, book: PolicyBook) -> str:
        """The digest of everything the functions read besides the rows, the day and horizons."""

    def windows(self, book: PolicyBook) -> Mapping[str, Collection[int]]:
        """Per use case, every window length its days are read over (today is a window of 1)."""

    def books(self, book: PolicyBook) -> dict[str, PolicyBook]:
        """The book each of the sums' passes is binned under, by the pass's name."""

    def fold(self, book: PolicyBook, day: int, horizons: Mapping[str, int]) -> Fold:
        """An empty sum of the devices' values on ``day`` with ``horizons``."""

    def spec(self) -> dict[str, Any] | None:
        """What rebuilds the measure, stored with its sums (``None``: nothing to store)."""


def versions_digest(book: PolicyBook) -> str:
    """The SHA-256 of every policy version: what a summary's passes depend on besides the rows.

    The passes read each use case's terms, budget members and retention (all from the versions)
    and the horizons (kept beside, checked apart); a device-wide budget changes no pass.
    """
    versions = [p.model_dump(mode="json") for p in book.versions]
    return hashlib.sha256(orjson.dumps(versions, option=orjson.OPT_SORT_KEYS)).hexdigest()


class _ReportFold:
    """The report's (window, lifetime) passes: each use case's window is its retention."""

    def __init__(self, book: PolicyBook, day: int, horizons: Mapping[str, int]) -> None:
        self._at = (day, book.retention(), horizons)
        self._window, self._lifetime = SpendPass(book), SpendPass(book)

    def add(self, dk: str, state: AccountState) -> None:
        day, retention, horizons = self._at
        self._window.add(slot_rows(dk, window_counts(state, day, retention, horizons)))
        self._lifetime.add(slot_rows(dk, lifetime_counts(state)))

    def finish(self) -> Sums:
        return Sums({"window": self._window.finish(), "lifetime": self._lifetime.finish()})


class _Report:
    """The effective-epsilon report's measure: its passes under the policy book."""

    name = REPORT

    def key(self, book: PolicyBook) -> str:
        return versions_digest(book)

    def windows(self, book: PolicyBook) -> dict[str, frozenset[int]]:
        return {name: frozenset({keep}) for name, keep in book.retention().items()}

    def books(self, book: PolicyBook) -> dict[str, PolicyBook]:
        return {"window": book, "lifetime": book}

    def fold(self, book: PolicyBook, day: int, horizons: Mapping[str, int]) -> Fold:
        return _ReportFold(book, day, horizons)

    def spec(self) -> dict[str, Any] | None:
        return None


REPORT_MEASURE: Final = _Report()

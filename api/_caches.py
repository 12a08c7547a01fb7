"""What read routes keep between requests: reports, spreads, discoveries, figures, the page.

One :class:`Caches` per app (``app.state.caches``, reached through
:func:`dp_governor.api.deps.get_caches`). Each entry lives for its setting's seconds; sizes are
bounded whatever clients ask.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from dp_governor.api._handles import ledger_engine
from dp_governor.api._snapshots import FIGURES, Figures, Snapshots, compute_figures, store_snapshot
from dp_governor.api.settings import Settings
from dp_governor.budget import Clock, Ledger
from dp_governor.budget.gate.prepared import InternalError
from dp_governor.budget.reporting.loss import effective_epsilon_basis
from dp_governor.budget.reporting.report import EffectiveEpsilonReport, ReportBasis, finish_report
from dp_governor.budget.reporting.views import (
    Distribution,
    SpendSpread,
    distribution_of,
    spend_spread,
)
from dp_governor.mechanisms import Discovering
from dp_governor.mechanisms.sfp import DiscoveredWord
from dp_governor.policies import Policy

__all__ = ["REPORT_CACHE_ENTRIES", "Caches"]

REPORT_CACHE_ENTRIES = 32  # effective-epsilon reports kept, one per distinct delta asked
_DISCOVERIES = 16  # discoveries kept before the cache is emptied
_PAGE_SECONDS = 60.0  # the public page is drawn again at least this often: its ages stay true


class Caches:
    """The effective-epsilon report, SFP discoveries, the stored figures, the public page.

    The report's delta-free basis (one scan of the ledger) is kept for ``report_cache_seconds``
    and never past a change of the policy book it was computed from (its revision is read on
    every request, one cheap query, so every worker sees a policy edit at once); each delta's
    report is derived from it (one composition per distinct device ledger) and kept in an LRU of
    :data:`REPORT_CACHE_ENTRIES`, emptied when the basis is renewed. The public page follows the
    same rule. The locks make one thread compute while the others wait for its answer.
    """

    def __init__(self, settings: Settings, clock: Clock) -> None:
        self._settings = settings
        self._clock = clock
        self._basis: list[tuple[float, tuple[int, int], ReportBasis]] = []  # at most one entry
        self.reports: OrderedDict[float | None, EffectiveEpsilonReport] = OrderedDict()
        self._report_lock = threading.Lock()
        self.snapshots = Snapshots()  # the stored figures and verification, parsed once each
        self._first_lock = threading.Lock()  # the figures of a ledger that has none yet
        self._discovered: dict[tuple[str, int, tuple[int, ...], int], list[DiscoveredWord]] = {}
        self._page: list[tuple[float, tuple[str, ...], str]] = []  # the page without estimates
        self._page_lock = threading.Lock()
        self._spreads: dict[tuple[str, str], tuple[float, SpendSpread]] = {}
        self._spread_lock = threading.Lock()

    def discovery(
        self, policy: Policy, days: Sequence[int], sketch: Discovering
    ) -> list[DiscoveredWord]:
        """SFP discovery (seconds on a full sketch) once per policy version, days and size."""
        key = (policy.name, policy.version, tuple(days), sketch.n)
        found = self._discovered.get(key)
        if found is None:
            found = sketch.discover_detailed(threshold=policy.publish_threshold or None)
            if len(self._discovered) > _DISCOVERIES:
                self._discovered.clear()
            self._discovered[key] = found
        return found

    def report(self, ledger: Ledger, delta: float | None) -> EffectiveEpsilonReport:
        """The report at ``delta`` (validated by the route): bounded memory, cheap per delta."""
        revision = ledger.book_revision()
        with self._report_lock:
            if (
                not self._basis
                or time.monotonic() >= self._basis[0][0]
                or self._basis[0][1] != revision
            ):
                basis = effective_epsilon_basis(ledger, now=self._clock.now())
                expires = time.monotonic() + self._settings.report_cache_seconds
                self._basis[:] = [(expires, revision, basis)]
                self.reports.clear()
            found = self.reports.get(delta)
            if found is not None:
                self.reports.move_to_end(delta)
                return found
            report = finish_report(self._basis[0][2], accountant=ledger.accountant, delta=delta)
            self.reports[delta] = report
            while len(self.reports) > REPORT_CACHE_ENTRIES:
                self.reports.popitem(last=False)
            return report

    def distribution(self, ledger: Ledger, use_case: str, scope: str, bins: int) -> Distribution:
        """A use case's public distribution: the ledger read once per ``report_cache_seconds``.

        One reading per (use case, scope), taken by one thread while the others wait for it
        (one at a time, whatever the use case: a flood of callers costs one scan); any bin
        count is then derived from it in ``O(bins log n)``. Entries are bounded by the use
        cases that exist (an unknown one raises before anything is kept) times two scopes.
        """
        key = (use_case, scope)
        with self._spread_lock:
            found = self._spreads.get(key)
            if found is None or time.monotonic() >= found[0]:
                spread = spend_spread(ledger, use_case, now=self._clock.now(), scope=scope)
                expires = time.monotonic() + self._settings.report_cache_seconds
                found = self._spreads[key] = (expires, spread)
        return distribution_of(found[1], bins)

    def figures(self, ledger: Ledger) -> Figures:
        """The latest stored dashboard figures (:mod:`dp_governor.api._snapshots`).

        A request reads them, never computes them: the ``dashboard`` job does. Only when none
        fit (a fresh install before the job's first run, or a policy edit since they were
        computed: an admin's act, never a visitor's) are they computed here, once, by one
        request while the others wait for its row.
        """
        engine = ledger_engine(ledger)
        revision = list(ledger.book_revision())
        found = self.snapshots.figures(engine)
        if found is not None and found.book == revision:
            return found
        with self._first_lock:
            found = self.snapshots.figures(engine)
            if found is None or found.book != revision:
                store_snapshot(engine, FIGURES, compute_figures(ledger, now=self._clock.now()))
                found = self.snapshots.figures(engine)
        if found is None:
            raise InternalError("the dashboard figures just stored cannot be read back")
        return found

    def public_page(self, stamp: tuple[str, ...], render: Callable[[], str]) -> str:
        """The public dashboard page, drawn again when ``stamp`` changes or once a minute.

        ``stamp`` names what the page shows (the figures' and the verification's times, the
        policy book's revision); the minute keeps the ages it states current. One render at a
        time; the others wait for its page.
        """
        with self._page_lock:
            if self._page and time.monotonic() < self._page[0][0] and self._page[0][1] == stamp:
                return self._page[0][2]
            page = render()
            self._page[:] = [(time.monotonic() + _PAGE_SECONDS, stamp, page)]
            return page

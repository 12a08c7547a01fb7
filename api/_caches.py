"""What read routes keep between requests: reports, spreads, discoveries, figures, the page.

One :class:`Caches` per app (``app.state.caches``, reached through
:func:`dp_governor.api.deps.get_caches`). Each entry lives for its setting's seconds; sizes are
bounded whatever clients ask.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from dp_governor.api._handles import ledger_engine
from dp_governor.api._job_process import JobWorker
from dp_governor.api._service import Service
from dp_governor.api._snapshots import Figures, Snapshots, store_figures
from dp_governor.api.errors import SERVICE_UNAVAILABLE, HttpError
from dp_governor.api.settings import Settings
from dp_governor.budget import Clock, Ledger
from dp_governor.budget.reporting.loss import effective_epsilon_basis
from dp_governor.budget.reporting.report import EffectiveEpsilonReport, ReportBasis, finish_report
from dp_governor.mechanisms import Discovering
from dp_governor.mechanisms.sfp import DiscoveredWord
from dp_governor.policies import Policy

__all__ = ["REPORT_CACHE_ENTRIES", "Caches", "FiguresPending"]

log = logging.getLogger("dpgov.api")

REPORT_CACHE_ENTRIES = 32  # effective-epsilon reports kept, one per distinct delta asked
_DISCOVERIES = 16  # discoveries kept before the cache is emptied
_PAGE_SECONDS = 60.0  # the public page is drawn again at least this often: its ages stay true
_RETRY_FAILED = 30.0  # seconds before figures whose computation failed are computed again
_POLL = 0.25  # seconds between two looks at another process's stored figures


class FiguresPending(HttpError):
    """503: the stored figures predate the policies in force (or none exist yet).

    They are being computed in the background; ``Retry-After`` is the last computation's
    length. Never figures computed under other policies than those in force.
    """

    def __init__(self, detail: str, retry_after: int) -> None:
        super().__init__(SERVICE_UNAVAILABLE, detail, {"Retry-After": str(retry_after)})
        self.retry_after = retry_after


class _Refresher:
    """Computes and stores the figures in a thread of its own: at most one at a time.

    What a request waits for instead of computing: it costs the request no CPU, and however
    many requests ask, the ledger is read once per policy revision (a failed attempt is made
    again after :data:`_RETRY_FAILED` seconds). With a job worker (the app's), the thread only
    waits: the worker computes, out of the server's interpreter lock and at its low priority.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._started: tuple[tuple[int, ...], float] | None = None  # revision, when
        self.worker: JobWorker | None = None
        self.finished = threading.Condition()

    def start(self, ledger: Ledger, revision: Sequence[int]) -> None:
        """Start computing unless a computation runs, or this revision's started recently."""
        key = tuple(revision)
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            if self._started is not None and self._started[0] == key:
                if time.monotonic() - self._started[1] < _RETRY_FAILED:
                    return
            self._started = (key, time.monotonic())
            self._thread = threading.Thread(
                target=self._run, args=(ledger,), name="dpgov-figures", daemon=True
            )
            self._thread.start()

    def _run(self, ledger: Ledger) -> None:
        try:
            now = self._clock.now()
            if self.worker is None:
                store_figures(ledger, now=now)
            else:
                self.worker.call(_store_figures, now)
        except Exception:  # logged; the requests waiting for it answer 503
            log.exception("the dashboard figures could not be computed")
        finally:
            with self.finished:
                self.finished.notify_all()


def _store_figures(service: Service, now: datetime) -> dict[str, Any]:
    """In the job worker: compute the figures as of ``now`` and store them."""
    return store_figures(service.ledger, now=now)


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
        self._refresher = _Refresher(clock)
        self._basis: list[tuple[float, tuple[int, int], ReportBasis]] = []  # at most one entry
        self.reports: OrderedDict[float | None, EffectiveEpsilonReport] = OrderedDict()
        self._report_lock = threading.Lock()
        self.snapshots = Snapshots()  # the stored figures and verification, parsed once each
        self._discovered: dict[tuple[str, int, tuple[int, ...], int], list[DiscoveredWord]] = {}
        self._page: list[tuple[float, tuple[str, ...], str]] = []  # the page without estimates
        self._page_lock = threading.Lock()

    def refresh_in(self, worker: JobWorker) -> None:
        """Compute the figures a policy edit calls for in ``worker`` (the app's job worker)."""
        self._refresher.worker = worker

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

    def figures(self, ledger: Ledger) -> Figures:
        """The latest stored dashboard figures (:mod:`dp_governor.api._snapshots`).

        A request reads them, never computes them. When none fit (a fresh install before the
        ``dashboard`` job's first run, or a policy edit since they were computed) the
        refresher computes them in its own thread and the request waits for them at most
        ``figures_wait_seconds``, then answers :class:`FiguresPending` (503).
        """
        engine = ledger_engine(ledger)
        deadline = time.monotonic() + self._settings.figures_wait_seconds
        while True:
            revision = list(ledger.book_revision())
            found = self.snapshots.figures(engine)
            if found is not None and found.book == revision:
                return found
            self._refresher.start(ledger, revision)
            left = deadline - time.monotonic()
            if left <= 0:
                raise _pending(found)
            with self._refresher.finished:
                self._refresher.finished.wait(min(left, _POLL))

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


def _pending(found: Figures | None) -> FiguresPending:
    """The 503 of figures being computed: what is stored, and when to ask again."""
    if found is None:
        why = "no audit figures have been computed yet"
    else:
        why = (
            f"the audit figures stored ({found.computed_at}) were computed under other policies"
            " than those in force"
        )
    retry = 5 if found is None else max(1, math.ceil(found.seconds))
    return FiguresPending(
        f"{why}: they are being computed for the policies now in force (this takes about"
        f" {retry} s); ask again then",
        retry,
    )

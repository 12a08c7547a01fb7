"""The public pages' figures, computed by jobs and stored, so no request scans the ledger.

The ``dashboard`` job computes what the dashboard and the public audit routes show (the
effective-epsilon report at the policies' delta, each use case's cumulative series and
per-device spends in both scopes, the daily activity) and stores them as one JSON row of
``dashboard_snapshots``; the ``verify`` job stores its verification beside them. A request
reads the row's token (one primary-key lookup) and parses the body only when the stamp changed,
so its cost does not depend on the ledger's size. Per-device spends are kept as distinct
values with their counts: micro-epsilon sums of a few per-report epsilons, so a handful of
distinct values stand for any number of devices, and every histogram and quantile derives
from them exactly as :func:`dp_governor.budget.reporting.views.distribution_of` does.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Literal

import numpy as np
from sqlalchemy import Engine, delete, insert, select

from dp_governor.api._handles import ledger_engine, policy_store
from dp_governor.api._integrity import KeptCheckpoints, verify_service
from dp_governor.budget import Ledger
from dp_governor.budget.audit.log import Verification
from dp_governor.budget.reporting.activity import Activity, daily_activity
from dp_governor.budget.reporting.loss import effective_epsilon_passes
from dp_governor.budget.reporting.report import EffectiveEpsilonReport, finish_report
from dp_governor.budget.reporting.series import CumulativeSeries
from dp_governor.budget.reporting.series_forward import series_brought_forward
from dp_governor.budget.reporting.views import Distribution, spend_quantiles
from dp_governor.budget.storage.db import write_step
from dp_governor.budget.storage.tables import DashboardSnapshot
from dp_governor.pipeline.seal import InboxSeal

__all__ = [
    "ACTIVITY_DAYS",
    "FIGURES",
    "VERIFICATION",
    "Figures",
    "Snapshots",
    "Spends",
    "Verified",
    "compute_figures",
    "read_snapshot",
    "store_figures",
    "store_snapshot",
    "store_verification",
]

ACTIVITY_DAYS = 14  # the trend of accepted and refused reports: two weeks, one point a day
FIGURES = "figures"  # the row of the dashboard's figures
VERIFICATION = "verification"  # the row of the last scheduled verification
_TABLE = DashboardSnapshot.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class Spends:
    """One use case's per-device spends in one scope: distinct micro-epsilons and their counts."""

    use_case: str
    scope: str
    values: list[int]
    counts: list[int]
    quantiles: dict[str, float]

    def distribution(self, bins: int) -> Distribution:
        """The histogram of ``bins`` equal bins, as ``numpy.histogram`` draws it over the devices.

        Equal to :func:`dp_governor.budget.reporting.views.distribution_of` on the same reading
        (a test checks it), in ``O(distinct values + bins)``.
        """
        if not 1 <= bins <= 200:
            raise ValueError(f"`bins` must be an integer from 1 to 200, got {bins}")
        if not self.values:
            return Distribution(self.use_case, self.scope, 0, {}, [], [])
        eps = np.asarray(self.values, dtype=np.int64) / 1_000_000
        total = np.concatenate([[0], np.cumsum(np.asarray(self.counts, dtype=np.int64))])
        edges = np.histogram_bin_edges(eps[[0, -1]], bins=bins)
        below = total[np.searchsorted(eps, edges[:-1], side="left")]
        counts = np.diff(np.append(below, total[-1]))
        return Distribution(
            self.use_case,
            self.scope,
            int(total[-1]),
            dict(self.quantiles),
            [float(e) for e in edges],
            [int(c) for c in counts],
        )


@dataclass(frozen=True, slots=True)
class Figures:
    """Everything the public dashboard and routes show, as of ``computed_at`` (ISO, UTC).

    ``book``: the policy book's revision they were computed under (read before the ledger),
    so figures are never served past a policy edit.
    """

    computed_at: str
    seconds: float
    book: list[int]
    report: EffectiveEpsilonReport
    series: list[CumulativeSeries]
    spends: list[Spends]
    activity: Activity

    def spends_of(self, use_case: str, scope: str) -> Spends | None:
        """The reading of ``use_case`` in ``scope``; None for a use case newer than these."""
        return next((s for s in self.spends if (s.use_case, s.scope) == (use_case, scope)), None)


@dataclass(frozen=True, slots=True)
class Verified:
    """The last scheduled verification: its verdict, when it ran and how long it took."""

    at: str
    seconds: float
    verification: Verification


def _spends(use_case: str, scope: str, devices: Mapping[int, int]) -> Spends:
    """A use case's spend distribution from the report's histogram ``{micro-epsilon: devices}``.

    The same reading as :func:`dp_governor.budget.reporting.views.spend_spread` gives (the
    histogram holds each device's spend on the use case, in the same window), without another
    scan of the ledger.
    """
    values = sorted(devices)
    counts = [devices[v] for v in values]
    if not values:
        return Spends(use_case, scope, [], [], {})
    spread = np.repeat(np.array(values, dtype=np.int64), counts)
    return Spends(use_case, scope, values, counts, spend_quantiles(spread))


def compute_figures(ledger: Ledger, *, now: datetime) -> Figures:
    """Read the ledger once for each figure the public pages show (the ``dashboard`` job)."""
    started = time.monotonic()
    book = list(ledger.book_revision())
    basis, window, lifetime = effective_epsilon_passes(ledger, now=now)
    report = finish_report(basis, accountant=ledger.accountant, delta=None)
    policies = policy_store(ledger).list()
    series = series_brought_forward(ledger, [p.name for p in policies], now=now)
    spends = [
        _spends(p.name, scope, spend.use_case.get(p.name, {}))
        for p in policies
        for scope, spend in (("window", window), ("lifetime", lifetime))
    ]
    activity = daily_activity(ledger_engine(ledger), now=now, days=ACTIVITY_DAYS)
    seconds = time.monotonic() - started
    return Figures(now.isoformat(), seconds, book, report, series, spends, activity)


def store_snapshot(engine: Engine, name: str, figures: Figures | Verified) -> None:
    """Replace the row ``name`` with ``figures`` (one short write transaction, fenced in jobs)."""
    at = figures.computed_at if isinstance(figures, Figures) else figures.at
    body = json.dumps(asdict(figures), separators=(",", ":"))
    with write_step(engine) as conn:
        conn.execute(delete(_TABLE).where(_TABLE.c.name == name))
        conn.execute(
            insert(_TABLE).values(
                name=name,
                token=uuid.uuid4().hex,
                computed_at=at,
                seconds=figures.seconds,
                body=body,
            )
        )


def store_figures(ledger: Ledger, *, now: datetime) -> dict[str, Any]:
    """Compute the figures and store them (the ``dashboard`` job); its result line."""
    figures = compute_figures(ledger, now=now)
    store_snapshot(ledger_engine(ledger), FIGURES, figures)
    return {"computed_at": figures.computed_at, "seconds": round(figures.seconds, 3)}


def store_verification(
    ledger: Ledger,
    *,
    now: datetime,
    kept: KeptCheckpoints,
    seal: InboxSeal | None,
    on_verified: Callable[[bool], None] | None = None,
) -> dict[str, Any]:
    """Verify the chain, the state and the pipeline, and store the verdict (the ``verify`` job).

    Incremental: from the signed checkpoint the last accepted verification reached.

    A failed verification is the job's result, not its failure: it is stored and shown.
    ``on_verified`` is told the verdict (the metrics).
    """
    started = time.monotonic()
    verdict = verify_service(ledger, now=now, kept=kept, seal=seal, full=False)
    verified = Verified(now.isoformat(), time.monotonic() - started, verdict)
    store_snapshot(ledger_engine(ledger), VERIFICATION, verified)
    if on_verified is not None:
        on_verified(verdict.ok)
    return {
        "ok": verdict.ok,
        "entries": verdict.entries,
        "checkpoint": verdict.latest_checkpoint_seq,
        "problem": verdict.problem,
    }


class _Reader:
    """The latest row of one name, parsed again only when its token (new per write) changes."""

    def __init__(self, name: str, cls: type[Any]) -> None:
        self._name = name
        self._cls = cls
        self._kept: tuple[str, Any] | None = None
        self._lock = threading.Lock()

    def read(self, engine: Engine) -> Any:
        with engine.connect() as conn:
            stamp = conn.execute(select(_TABLE.c.token).where(_TABLE.c.name == self._name)).scalar()
            if stamp is None:
                return None
            with self._lock:
                if self._kept is not None and self._kept[0] == stamp:
                    return self._kept[1]
                row = conn.execute(
                    select(_TABLE.c.token, _TABLE.c.body).where(_TABLE.c.name == self._name)
                ).one()
                value = _load(self._cls, json.loads(row.body))
                self._kept = (str(row.token), value)
                return value


class Snapshots:
    """A process's readers of the stored figures and verification (``Caches.snapshots``)."""

    def __init__(self) -> None:
        self._figures = _Reader(FIGURES, Figures)
        self._verified = _Reader(VERIFICATION, Verified)

    def figures(self, engine: Engine) -> Figures | None:
        """The latest dashboard figures; None before the first ``dashboard`` job."""
        found: Figures | None = self._figures.read(engine)
        return found

    def verified(self, engine: Engine) -> Verified | None:
        """The last scheduled verification; None before the first ``verify`` job."""
        found: Verified | None = self._verified.read(engine)
        return found


def read_snapshot(engine: Engine, name: str) -> Figures | Verified | None:
    """The stored row ``name`` parsed, without a process's memo (tests and commands)."""
    cls = Figures if name == FIGURES else Verified
    return _Reader(name, cls).read(engine)  # type: ignore[no-any-return]


def _load(hint: Any, value: Any) -> Any:
    """Rebuild a value of type ``hint`` (dataclasses, lists, dicts, optionals) from JSON."""
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        hints = typing.get_type_hints(hint)
        return hint(
            **{f.name: _load(hints[f.name], value[f.name]) for f in dataclasses.fields(hint)}
        )
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        arms = [a for a in typing.get_args(hint) if a is not type(None)]
        return _load(arms[0], value)
    if origin is list:
        (item,) = typing.get_args(hint)
        return [_load(item, v) for v in value]
    if origin is dict:
        _, item = typing.get_args(hint)
        return {k: _load(item, v) for k, v in value.items()}
    if origin is Literal or hint is Any:
        return value
    if hint is float and isinstance(value, int):
        return float(value)
    return value

"""Report health: the share of each use case's reports that its policy makes implausible.

A CMS report's ``m`` coordinates are a ``-1`` vector with one ``+1``, each flipped with
probability ``p = 1 / (1 + e^(eps/2))``: its count of ``+1`` coordinates is
``Bernoulli(1 - p) + Binomial(m - 1, p)`` whatever the device's value, with mean
``1 - p + (m - 1) p`` and variance ``m p (1 - p)``. A device built with another epsilon draws
counts far outside that band (``m = 1024``, epsilon 4: 122 +- 10; a device with epsilon 1:
about 387), so a fleet-wide misbuild shows as a share near 1 within its first reports, while
a correct fleet's share stays near 0 (``Z = 6``: about 2e-9 a report). SFP's word and fragment
reports are two such CMS reports. An HCMS report is one bit whose mean depends on the value,
so no single report is implausible: its use cases show no figure. Another hash seed moves no
count either: that misbuild is what ``family`` catches
(:mod:`dp_governor.pipeline._family_mismatch`).

Counted per process since it started (each worker its own), for the dashboard and Prometheus.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from dp_governor.mechanisms import Mechanism, Report

__all__ = ["HealthLine", "ReportHealth", "Z"]

Z = 6.0  # standard deviations of the band: a correct report falls outside it about 2e-9 of the time


Check = Callable[[Report], bool]


@dataclass(frozen=True, slots=True)
class HealthLine:
    """One use case's reports checked since this process started, and those implausible."""

    use_case: str
    checked: int
    implausible: int

    @property
    def share(self) -> float:
        """The share of checked reports that are implausible (0 when none was checked)."""
        return self.implausible / self.checked if self.checked else 0.0


class ReportHealth(Collector):
    """Counts, per use case, checked and implausible reports; a Prometheus collector of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, list[int]] = {}  # use case -> [checked, implausible]
        self._tests: dict[str, Check | None] = {}  # parameter fingerprint -> its test

    def test(self, params: str, mech: Mechanism) -> Check | None:
        """The plausibility test of reports under ``mech`` (``params`` its fingerprint).

        ``None``: its reports are not checked (HCMS). Built once per parameter set, so a report
        costs one popcount per sketch row it carries.
        """
        if params not in self._tests:
            self._tests[params] = mech.plausibility(Z)
        return self._tests[params]

    def add(self, tallies: dict[str, list[int]]) -> None:
        """Add ``{use case: [checked, implausible]}`` (a group's reports, counted together)."""
        with self._lock:
            for use_case, (checked, implausible) in tallies.items():
                counts = self._counts.setdefault(use_case, [0, 0])
                counts[0] += checked
                counts[1] += implausible

    def observe(self, use_case: str, mech: Mechanism, report: Report) -> None:
        """Count one parsed report of ``use_case`` under its policy's ``mech`` (HCMS: ignored)."""
        test = mech.plausibility(Z)
        if test is not None:
            self.add({use_case: [1, int(not test(report))]})

    def lines(self) -> list[HealthLine]:
        """Every use case with a checked report, by name."""
        with self._lock:
            return [HealthLine(name, c[0], c[1]) for name, c in sorted(self._counts.items())]

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """The counts and shares as Prometheus series labelled by use case."""
        checked = CounterMetricFamily(
            "dpgov_reports_checked",
            "Reports whose distribution was checked against their policy (CMS, SFP).",
            labels=["use_case"],
        )
        implausible = CounterMetricFamily(
            "dpgov_reports_implausible",
            "Reports implausible under their policy's epsilon (docs/operations.md).",
            labels=["use_case"],
        )
        share = GaugeMetricFamily(
            "dpgov_reports_implausible_share",
            "Share of checked reports implausible under their policy, since the process started.",
            labels=["use_case"],
        )
        for line in self.lines():
            checked.add_metric([line.use_case], line.checked)
            implausible.add_metric([line.use_case], line.implausible)
            share.add_metric([line.use_case], line.share)
        yield checked
        yield implausible
        yield share

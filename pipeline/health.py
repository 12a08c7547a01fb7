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
(:mod:`dp_governor.pipeline.family_mismatch`).

Counted per process since it started (each worker its own), for the dashboard and Prometheus.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from dp_governor.mechanisms import CMS, SFP, Mechanism, Report
from dp_governor.mechanisms.cms import CmsReport
from dp_governor.mechanisms.sfp import SfpReport

__all__ = ["HealthLine", "ReportHealth", "Z", "plausible_ones"]

Z = 6.0  # standard deviations of the band: a correct report falls outside it about 2e-9 of the time


def plausible_ones(mech: CMS) -> tuple[int, int]:
    """The band ``[low, high]`` of ``+1`` counts a CMS report under ``mech`` falls in.

    >>> plausible_ones(CMS(4.0, 16, 1024))
    (59, 187)
    """
    p = mech.flip_probability
    mean = 1 - p + (mech.m - 1) * p
    spread = Z * math.sqrt(mech.m * p * (1 - p)) + 1  # + 1: the Bernoulli and rounding
    return max(0, math.floor(mean - spread)), min(mech.m, math.ceil(mean + spread))


def _ones(report: CmsReport) -> int:
    return int.from_bytes(report.bits, "big").bit_count()


Check = Callable[[Report], bool]


def _test(mech: Mechanism) -> Check | None:
    """Whether a report's ``+1`` counts fall in their bands (``None``: HCMS, not checked)."""
    if isinstance(mech, SFP):
        (wl, wh), (fl, fh) = plausible_ones(mech.word_cms), plausible_ones(mech.fragment_cms)

        def sfp(report: Report) -> bool:
            assert isinstance(report, SfpReport)
            return wl <= _ones(report.word) <= wh and fl <= _ones(report.fragment) <= fh

        return sfp
    if isinstance(mech, CMS):
        low, high = plausible_ones(mech)

        def cms(report: Report) -> bool:
            assert isinstance(report, CmsReport)
            return low <= _ones(report) <= high

        return cms
    return None


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
            self._tests[params] = _test(mech)
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
        test = _test(mech)
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

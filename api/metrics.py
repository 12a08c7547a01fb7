"""The service's Prometheus metrics, one registry per app (held on ``app.state.metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Metrics"]


class Metrics:
    """Reports by use case and outcome, request latency by route, the inbox's depth.

    A registry of its own per app, so two apps in one process (tests) never share series.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reports_total = Counter(
            "dpgov_reports_total",
            "Reports by use case and outcome.",
            ["use_case", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "dpgov_request_seconds",
            "Request latency by route.",
            ["route", "method"],
            registry=self.registry,
        )
        self.inbox_depth = Gauge(
            "dpgov_inbox_depth", "Reports waiting in the inbox.", registry=self.registry
        )

"""The service's Prometheus metrics, one registry per app (held on ``app.state.metrics``).

Each process keeps its own figures: with several workers, scrape each one (a job's figures
come from the process that schedules it: ``scheduler`` and ``scheduled_jobs``; the last
verification is the database's record, :meth:`Metrics.follow`, in every worker).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["JOB_OUTCOMES", "Metrics"]

# How a job run ends (the ``outcome`` of its log line): ``done``; ``skipped``, another process
# ran it; ``failed``, an error; ``busy``, the database stayed locked; ``lease_lost``, another
# process took its lease over. The last three count as failures.
JOB_OUTCOMES = ("done", "skipped", "failed", "busy", "lease_lost")
_FAILURES = frozenset({"failed", "busy", "lease_lost"})
# job durations: a flush of a few reports to an aggregate of a large backlog
_JOB_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


class Metrics:
    """Reports, request latency, the inbox's depth, scheduled jobs and the audit verification.

    A registry of its own per app, so two apps in one process (tests) never share series.
    ``wall`` is the clock of the timestamps and ages (the real one; tests pass their own).
    """

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self.registry = CollectorRegistry()
        self._wall = wall
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
        self.job_runs = Counter(
            "dpgov_job_runs_total",
            "Scheduled job runs in this process by job and outcome"
            " (done, skipped, failed, busy, lease_lost).",
            ["job", "outcome"],
            registry=self.registry,
        )
        self.job_failures = Counter(
            "dpgov_job_failures_total",
            "Job runs that stopped without finishing (outcome failed, busy or lease_lost).",
            ["job"],
            registry=self.registry,
        )
        self.job_duration = Histogram(
            "dpgov_job_duration_seconds",
            "Duration of the job runs that ran (done or stopped), by job.",
            ["job"],
            buckets=_JOB_BUCKETS,
            registry=self.registry,
        )
        self.job_last_success = Gauge(
            "dpgov_job_last_success_timestamp_seconds",
            "When the job last finished in this process (Unix time); absent: not yet.",
            ["job"],
            registry=self.registry,
        )
        self.witness_failures = Counter(
            "dpgov_witness_failures_total",
            "Checkpoint submissions a witness did not cosign (down, or refused), by witness.",
            ["witness"],
            registry=self.registry,
        )
        self.verification_ok = Gauge(
            "dpgov_audit_verification_ok",
            "The last audit verification's result: 1 the chain and state verified, 0 failed;"
            " NaN: none yet in this process.",
            registry=self.registry,
        )
        self.verification_ok.set(math.nan)
        self.verification_at = Gauge(
            "dpgov_audit_verification_timestamp_seconds",
            "When the last audit verification ran (Unix time); NaN: none yet.",
            registry=self.registry,
        )
        self.verification_at.set(math.nan)
        self._verified: float | None = None
        self._ok = math.nan
        self._recorded: Callable[[], tuple[bool, float] | None] = lambda: None
        self.verification_ok.set_function(lambda: self._latest()[0])
        self.verification_at.set_function(lambda: self._latest()[1])
        age = Gauge(
            "dpgov_audit_verification_age_seconds",
            "Seconds since the last audit verification; NaN: none yet in this process.",
            registry=self.registry,
        )
        age.set_function(self._verification_age)

    def job_finished(self, job: str, outcome: str, seconds: float | None) -> None:
        """Count one run of ``job`` ending in ``outcome``; ``seconds``: how long it ran."""
        if outcome not in JOB_OUTCOMES:
            raise ValueError(f"`outcome` must be one of {', '.join(JOB_OUTCOMES)}, got {outcome!r}")
        self.job_runs.labels(job, outcome).inc()
        if outcome in _FAILURES:
            self.job_failures.labels(job).inc()
        if seconds is not None:
            self.job_duration.labels(job).observe(seconds)
        if outcome == "done":
            self.job_last_success.labels(job).set(self._wall())

    def verified(self, ok: bool) -> None:
        """Record an audit verification that just ran, and its result."""
        self._verified = self._wall()
        self._ok = 1.0 if ok else 0.0

    def follow(self, recorded: Callable[[], tuple[bool, float] | None]) -> None:
        """Also show the last verification the database records (``(ok, Unix time)``).

        The ``verify`` job stores its verdict whichever process runs it, so every worker's
        scrape shows it, not only the scheduler's; the later of it and this process's wins.
        """
        self._recorded = recorded

    def _latest(self) -> tuple[float, float]:
        """``(ok, Unix time)`` of the latest verification known here; NaN, NaN: none."""
        found = self._recorded()
        if found is not None and (self._verified is None or found[1] > self._verified):
            return (1.0 if found[0] else 0.0), found[1]
        return self._ok, math.nan if self._verified is None else self._verified

    def _verification_age(self) -> float:
        at = self._latest()[1]
        return math.nan if math.isnan(at) else max(0.0, self._wall() - at)

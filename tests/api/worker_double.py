"""A job worker that runs each call in the caller's thread, for tests that count work in-process.

``monkeypatch.setattr(dp_governor.api.app, "JobWorker", InProcessWorker)`` before the app starts:
its population jobs and figures' refresher then run in this process, where a test's counters
and stand-ins see them (the real worker: ``tests/api/test_job_process.py``).
"""

from __future__ import annotations

from typing import Any

from dp_governor.api._keys import ServiceKeys
from dp_governor.api._service import open_service_parts, service_engine
from dp_governor.api.settings import Settings

__all__ = ["InProcessWorker"]


class InProcessWorker:
    """:class:`dp_governor.api._job_process.JobWorker`'s calls, on a service opened here."""

    def __init__(self, settings: Settings, keys: ServiceKeys) -> None:
        self._service = open_service_parts(settings, keys, service_engine(settings))

    def call(self, target: Any, *args: Any) -> dict[str, Any]:
        """``target(service, *args)`` in the calling thread."""
        result: dict[str, Any] = target(self._service, *args)
        return result

    def pid(self) -> int | None:
        """No process of its own."""
        return None

    def close(self) -> None:
        """Close the service's connections."""
        self._service.ledger.close()

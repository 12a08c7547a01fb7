"""The blocking :class:`Client` and the awaitable :class:`AsyncClient`: the same calls, retried."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from datetime import date
from typing import Any

import httpx

from dp_governor.api.client._calls import (
    Api,
    JobResult,
    Mechanism,
    RelayItem,
    ReportBody,
    SubmitResult,
    auth_headers,
    build_randomizer,
)
from dp_governor.api.client._transport import Call, Retry, decide, finish
from dp_governor.api.schemas import (
    BatchResult,
    ConsistencyProof,
    DeviceBudget,
    DeviceRecord,
    EffectiveEpsilonReport,
    Estimates,
    PolicyPublic,
    TlogCheckpoint,
    WhatIf,
)

__all__ = ["AsyncClient", "Client"]


class Client(Api):
    """Talks to a dp-governor service (blocking); use as a context manager.

    ``transport`` and ``sleep`` exist for embedding (an ASGI app, a test's clock); the defaults
    are the network and :func:`time.sleep`.
    """

    def __init__(
        self,
        base_url: str,
        *,
        admin_token: str | None = None,
        timeout: float = 30,
        retry: Retry | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__()
        self._http = httpx.Client(
            base_url=base_url,
            headers=auth_headers(admin_token),
            timeout=timeout,
            transport=transport,
        )
        self._retry = retry or Retry()
        self._sleep = sleep

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _run(self, call: Call) -> Any:
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._http.request(
                    call.method, call.path, json=call.json, params=call.params, headers=call.headers
                )
            except httpx.TransportError:
                wait = self._retry.wait(attempt, None)
                if wait is None:
                    raise
                self._sleep(wait)
                continue
            wait = decide(call, response, self._retry, attempt)
            if wait is None:
                return finish(call, response)
            self._sleep(wait)

    def policy(self, name: str) -> PolicyPublic:
        """A use case's current policy (remembers its family identifier for submissions)."""
        return self._run(self._policy_call(name))  # type: ignore[no-any-return]

    def policies(self) -> list[PolicyPublic]:
        """Every active use case's current policy."""
        return self._run(self._policies_call())  # type: ignore[no-any-return]

    def randomizer(self, name: str) -> Mechanism:
        """The mechanism the use case's published policy prescribes, built from it alone."""
        return build_randomizer(self.policy(name))

    def submit(
        self,
        use_case: str,
        device_id: str,
        report: ReportBody,
        *,
        idempotency_key: str | None = None,
    ) -> SubmitResult:
        """Submit one report as ``device_id``: a :class:`Receipt` or a cap's :class:`Refusal`."""
        return self._run(  # type: ignore[no-any-return]
            self._submit_call(use_case, device_id, report, idempotency_key)
        )

    def relay(self, use_case: str, items: Sequence[RelayItem]) -> BatchResult:
        """Relay many devices' reports in one batch (admin); each item is judged on its own."""
        return self._run(self._relay_call(use_case, items))  # type: ignore[no-any-return]

    def budget(self, device_id: str, *, as_device: bool = True) -> DeviceBudget:
        """A device's budget, as the device itself or (``as_device=False``) with the token."""
        return self._run(self._budget_call(device_id, as_device))  # type: ignore[no-any-return]

    def tlog_record(self, device_id: str, day: date | str) -> DeviceRecord:
        """The device's transparency record of ``day`` (check it with :func:`verify_record`).

        ``day`` is a ``datetime.date`` or a ``YYYY-MM-DD`` string; another is refused naming it.
        """
        return self._run(self._record_call(device_id, day))  # type: ignore[no-any-return]

    def tlog_checkpoint(self) -> TlogCheckpoint:
        """The transparency log's newest signed checkpoint (public)."""
        return self._run(self._checkpoint_call())  # type: ignore[no-any-return]

    def tlog_consistency(self, old: int, new: int) -> ConsistencyProof:
        """The consistency proof between two tree sizes (public)."""
        return self._run(self._consistency_call(old, new))  # type: ignore[no-any-return]

    def effective_epsilon(self, delta: float | None = None) -> EffectiveEpsilonReport:
        """The effective-epsilon report (public; at another ``delta`` than the policies', admin)."""
        return self._run(self._report_call(delta))  # type: ignore[no-any-return]

    def what_if(self, use_case: str, **changes: Any) -> WhatIf:
        """What a policy change would do on today's ledger (admin); nothing changes."""
        return self._run(self._what_if_call(use_case, changes))  # type: ignore[no-any-return]

    def estimates(
        self,
        use_case: str,
        candidates: Sequence[str],
        *,
        start: date | str | None = None,
        end: date | str | None = None,
    ) -> Estimates:
        """Published estimates of candidates over ``[start, end]`` (admin; default all days)."""
        return self._run(  # type: ignore[no-any-return]
            self._estimates_call(use_case, candidates, start, end)
        )

    def run_job(self, job: str, *, wait: float = 0.0) -> JobResult:
        """Run a scheduled job now (admin): ``flush-inbox``, ``aggregate``, ``purge``...

        ``wait``: seconds the server waits for the job's lease while another process runs it
        (at most 600; 0: :class:`Conflict` at once).
        """
        return self._run(self._job_call(job, wait))  # type: ignore[no-any-return]


class AsyncClient(Api):
    """The same calls as :class:`Client`, awaitable; use as an async context manager."""

    def __init__(
        self,
        base_url: str,
        *,
        admin_token: str | None = None,
        timeout: float = 30,
        retry: Retry | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        super().__init__()
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers=auth_headers(admin_token),
            timeout=timeout,
            transport=transport,
        )
        self._retry = retry or Retry()
        self._sleep = sleep

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def _run(self, call: Call) -> Any:
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await self._http.request(
                    call.method, call.path, json=call.json, params=call.params, headers=call.headers
                )
            except httpx.TransportError:
                wait = self._retry.wait(attempt, None)
                if wait is None:
                    raise
                await self._sleep(wait)
                continue
            wait = decide(call, response, self._retry, attempt)
            if wait is None:
                return finish(call, response)
            await self._sleep(wait)

    async def policy(self, name: str) -> PolicyPublic:
        """A use case's current policy (remembers its family identifier for submissions)."""
        return await self._run(self._policy_call(name))  # type: ignore[no-any-return]

    async def policies(self) -> list[PolicyPublic]:
        """Every active use case's current policy."""
        return await self._run(self._policies_call())  # type: ignore[no-any-return]

    async def randomizer(self, name: str) -> Mechanism:
        """The mechanism the use case's published policy prescribes, built from it alone."""
        return build_randomizer(await self.policy(name))

    async def submit(
        self,
        use_case: str,
        device_id: str,
        report: ReportBody,
        *,
        idempotency_key: str | None = None,
    ) -> SubmitResult:
        """Submit one report as ``device_id``: a :class:`Receipt` or a cap's :class:`Refusal`."""
        return await self._run(  # type: ignore[no-any-return]
            self._submit_call(use_case, device_id, report, idempotency_key)
        )

    async def relay(self, use_case: str, items: Sequence[RelayItem]) -> BatchResult:
        """Relay many devices' reports in one batch (admin); each item is judged on its own."""
        return await self._run(self._relay_call(use_case, items))  # type: ignore[no-any-return]

    async def budget(self, device_id: str, *, as_device: bool = True) -> DeviceBudget:
        """A device's budget, as the device itself or (``as_device=False``) with the token."""
        return await self._run(  # type: ignore[no-any-return]
            self._budget_call(device_id, as_device)
        )

    async def tlog_record(self, device_id: str, day: date | str) -> DeviceRecord:
        """The device's transparency record of ``day`` (check it with :func:`verify_record`).

        ``day`` is a ``datetime.date`` or a ``YYYY-MM-DD`` string; another is refused naming it.
        """
        return await self._run(self._record_call(device_id, day))  # type: ignore[no-any-return]

    async def tlog_checkpoint(self) -> TlogCheckpoint:
        """The transparency log's newest signed checkpoint (public)."""
        return await self._run(self._checkpoint_call())  # type: ignore[no-any-return]

    async def tlog_consistency(self, old: int, new: int) -> ConsistencyProof:
        """The consistency proof between two tree sizes (public)."""
        return await self._run(  # type: ignore[no-any-return]
            self._consistency_call(old, new)
        )

    async def effective_epsilon(self, delta: float | None = None) -> EffectiveEpsilonReport:
        """The effective-epsilon report (public; at another ``delta`` than the policies', admin)."""
        return await self._run(self._report_call(delta))  # type: ignore[no-any-return]

    async def what_if(self, use_case: str, **changes: Any) -> WhatIf:
        """What a policy change would do on today's ledger (admin); nothing changes."""
        return await self._run(  # type: ignore[no-any-return]
            self._what_if_call(use_case, changes)
        )

    async def estimates(
        self,
        use_case: str,
        candidates: Sequence[str],
        *,
        start: date | str | None = None,
        end: date | str | None = None,
    ) -> Estimates:
        """Published estimates of candidates over ``[start, end]`` (admin; default all days)."""
        return await self._run(  # type: ignore[no-any-return]
            self._estimates_call(use_case, candidates, start, end)
        )

    async def run_job(self, job: str, *, wait: float = 0.0) -> JobResult:
        """Run a scheduled job now (admin): ``flush-inbox``, ``aggregate``, ``purge``...

        ``wait``: seconds the server waits for the job's lease while another process runs it
        (at most 600; 0: :class:`Conflict` at once).
        """
        return await self._run(self._job_call(job, wait))  # type: ignore[no-any-return]

"""A typed client for devices, relays and operators: :class:`Client` and :class:`AsyncClient`.

Devices build their randomizer from the published policy (:meth:`Client.randomizer`) and submit
reports that carry its family identifier; relays forward many; operators read budgets, the
effective-epsilon report, what-ifs and estimates with the admin token. Every submission carries an
idempotency key (a random one unless given), so retries are safe: transport errors, 5xx and
rate-limit 429s are retried with bounded exponential backoff, honouring ``Retry-After``. A
budget cap's 429 is an answer (:class:`Refusal`), not an error. Other failures raise
:class:`ServiceError` subclasses carrying the server's error body.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from email.utils import parsedate_to_datetime
from functools import cache
from typing import TYPE_CHECKING, Any, Final, Protocol

import httpx
from pydantic import TypeAdapter

from dp_governor.mechanisms import CMS, HCMS, SFP, from_published
from dp_governor.mechanisms.published import FAMILY_FIELD
from dp_governor.policies.model import PolicyPublic

if TYPE_CHECKING:
    from dp_governor.budget.ledger import BudgetStatus
    from dp_governor.budget.reporting.report import EffectiveEpsilonReport
    from dp_governor.budget.reporting.views import WhatIf

__all__ = [
    "AsyncClient",
    "BadRequest",
    "BatchItemResult",
    "BatchResult",
    "Client",
    "Conflict",
    "DeviceBudget",
    "EstimateItem",
    "Estimates",
    "JobResult",
    "NotFound",
    "RateLimited",
    "Receipt",
    "Refusal",
    "RelayItem",
    "Retry",
    "ServiceError",
    "SubmitResult",
    "Unauthorized",
    "Unavailable",
]

Mechanism = CMS | HCMS | SFP
# A budget's refusals (budget.rule.refusal.REFUSALS; the client does not import the budget package).
CAP_REASONS: Final = frozenset(
    {"daily_cap", "window_cap", "lifetime_cap", "window_filter", "lifetime_filter"}
)


class _ToDict(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


ReportBody = Mapping[str, Any] | _ToDict


# -- errors -------------------------------------------------------------------------------------


class ServiceError(Exception):
    """The service answered with an error; ``body`` is its JSON error body as sent."""

    def __init__(self, status: int, body: Any, retry_after: float | None = None) -> None:
        self.status = status
        self.body = body
        self.retry_after = retry_after
        detail = body.get("detail") if isinstance(body, dict) else body
        self.field: str | None = body.get("field") if isinstance(body, dict) else None
        if isinstance(detail, list) and detail and isinstance(detail[0], dict):
            self.field = self.field or detail[0].get("field")
            detail = "; ".join(str(d.get("msg", d)) for d in detail)
        self.detail = str(detail)
        super().__init__(f"HTTP {status}: {self.detail}")


class BadRequest(ServiceError):
    """400, 413 or 422: the request is malformed; ``field`` names the culprit."""


class Unauthorized(ServiceError):
    """401 or 403: no or wrong credentials (admin token or ``X-Device-Id``)."""


class NotFound(ServiceError):
    """404: unknown use case, device or job."""


class Conflict(ServiceError):
    """409: an idempotency key reused for another report, or a busy job."""


class RateLimited(ServiceError):
    """429 from a rate limit (not a budget cap) after the retries; ``retry_after`` in seconds."""


class Unavailable(ServiceError):
    """5xx after the retries."""


def _error(status: int, body: Any, retry_after: float | None) -> ServiceError:
    kind: type[ServiceError] = ServiceError
    if status in (400, 413, 422):
        kind = BadRequest
    elif status in (401, 403):
        kind = Unauthorized
    elif status == 404:
        kind = NotFound
    elif status == 409:
        kind = Conflict
    elif status == 429:
        kind = RateLimited
    elif status >= 500:
        kind = Unavailable
    return kind(status, body, retry_after)


# -- results ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Receipt:
    """A 202: the report was charged and stored."""

    receipt: str
    use_case: str
    policy_version: int
    epsilon: float
    day: date
    reports_left_today: int
    replayed: bool
    accepted: bool = True


@dataclass(frozen=True, slots=True)
class Refusal:
    """A budget cap's 429: nothing was spent; retry at ``retry_at`` (UTC)."""

    detail: str
    reason: str
    use_case: str
    budget: str
    retry_at: datetime | None
    accepted: bool = False


SubmitResult = Receipt | Refusal


@dataclass(frozen=True, slots=True)
class RelayItem:
    """One device's report in a relay's batch (``idempotency_key``: a random one if ``None``)."""

    device_id: str
    report: ReportBody
    idempotency_key: str | None = None


@dataclass(frozen=True, slots=True)
class BatchItemResult:
    """One item's answer: 202 with a receipt, 429 with the cap's reason, or an error."""

    status: int
    receipt: str | None = None
    reason: str | None = None
    retry_at: datetime | None = None
    field: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class BatchResult:
    """A relay batch's answers, in the order of the items."""

    accepted: int
    results: list[BatchItemResult]


@dataclass(frozen=True, slots=True)
class EstimateItem:
    """One candidate's estimated count and its standard error."""

    item: str
    count: float
    stderr: float


@dataclass(frozen=True, slots=True)
class Estimates:
    """Published estimates (count >= the threshold) of a use case over a day range."""

    use_case: str
    days: list[date]
    n: int
    publish_threshold: float
    estimates: list[EstimateItem]


@dataclass(frozen=True, slots=True)
class DeviceBudget:
    """A device's standing against every use case."""

    device_id: str
    use_cases: list[BudgetStatus]


@dataclass(frozen=True, slots=True)
class JobResult:
    """A job run now: its name and what it reports (fields differ by job)."""

    job: str
    result: dict[str, Any]


@cache
def _adapter(kind: Any) -> TypeAdapter[Any]:
    """A cached pydantic adapter that validates JSON into ``kind``."""
    return TypeAdapter(kind)


def _budget_types() -> dict[str, Any]:
    """The operator result types that live in ``budget`` (imported when first needed)."""
    from dp_governor.budget.ledger import BudgetStatus
    from dp_governor.budget.reporting.report import EffectiveEpsilonReport
    from dp_governor.budget.reporting.views import WhatIf

    return {"report": EffectiveEpsilonReport, "what_if": WhatIf, "status": BudgetStatus}


# -- retries ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Retry:
    """Bounded retries: at most ``attempts`` tries of one request.

    The wait before try ``n + 1`` is the answer's ``Retry-After`` if it sent one (a refusal
    to retry if that is over ``max_retry_after``), else ``backoff * 2**(n - 1)`` capped at
    ``max_backoff`` seconds.
    """

    attempts: int = 4
    backoff: float = 0.5
    max_backoff: float = 8.0
    max_retry_after: float = 60.0

    def wait(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before the next try after try ``attempt`` (1-based), or ``None``."""
        if attempt >= self.attempts:
            return None
        if retry_after is not None:
            return retry_after if retry_after <= self.max_retry_after else None
        return min(self.max_backoff, self.backoff * 2.0 ** (attempt - 1))


def retry_after_seconds(value: str | None, *, now: datetime | None = None) -> float | None:
    """``Retry-After`` as seconds: delay-seconds or an HTTP date; ``None`` if absent or bad.

    >>> retry_after_seconds("3"), retry_after_seconds(None), retry_after_seconds("soon")
    (3.0, None, None)
    """
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _is_cap_refusal(response: httpx.Response) -> bool:
    """A budget cap's 429 (an answer) rather than a rate limit's (a reason to retry)."""
    body = _body(response)
    return isinstance(body, dict) and body.get("reason") in CAP_REASONS


@dataclass(frozen=True, slots=True)
class _Call:
    """One request: what to send, whether it is safe to retry, and how to read the answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], Any]
    json: Any = None
    params: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    ok: tuple[int, ...] = (200,)


def _decide(call: _Call, response: httpx.Response, retry: Retry, attempt: int) -> float | None:
    """``None``: the answer is final; else the seconds to wait before trying again."""
    status = response.status_code
    if status in call.ok or (status == 429 and _is_cap_refusal(response)):
        return None
    if status == 429 or status >= 500:
        return retry.wait(attempt, retry_after_seconds(response.headers.get("Retry-After")))
    return None


def _finish(call: _Call, response: httpx.Response) -> Any:
    """The parsed answer, or the typed error carrying the server's body."""
    status = response.status_code
    if status in call.ok or (status == 429 and _is_cap_refusal(response)):
        return call.parse(response)
    wait = retry_after_seconds(response.headers.get("Retry-After"))
    raise _error(status, _body(response), wait)


# -- the calls, shared by both clients -----------------------------------------------------------


def _report_dict(report: ReportBody, family: str | None) -> dict[str, Any]:
    """The JSON body of a report (a dict or a mechanism's report), with ``family`` if known."""
    body = dict(report) if isinstance(report, Mapping) else report.to_dict()
    if family is not None:
        body.setdefault(FAMILY_FIELD, family)
    return body


def _submit_result(response: httpx.Response) -> SubmitResult:
    data = response.json()
    if response.status_code == 202:
        return _adapter(Receipt).validate_python(data)  # type: ignore[no-any-return]
    return _adapter(Refusal).validate_python(data)  # type: ignore[no-any-return]


class _Api:
    """Builds the calls; the families of policies fetched so far go into submitted reports."""

    def __init__(self) -> None:
        self._families: dict[str, str] = {}

    def _policy_call(self, name: str) -> _Call:
        def parse(response: httpx.Response) -> PolicyPublic:
            policy = PolicyPublic.model_validate_json(response.content)
            self._families[policy.name] = policy.randomizer.family_id
            return policy

        return _Call("GET", f"/v1/use-cases/{name}", parse)

    def _policies_call(self) -> _Call:
        def parse(response: httpx.Response) -> list[PolicyPublic]:
            policies = _adapter(list[PolicyPublic]).validate_json(response.content)
            for p in policies:
                self._families[p.name] = p.randomizer.family_id
            return policies  # type: ignore[no-any-return]

        return _Call("GET", "/v1/use-cases", parse)

    def _submit_call(
        self, use_case: str, device_id: str, report: ReportBody, idempotency_key: str | None
    ) -> _Call:
        headers = {"X-Device-Id": device_id, "Idempotency-Key": idempotency_key or _key()}
        body = _report_dict(report, self._families.get(use_case))
        return _Call(
            "POST", f"/v1/use-cases/{use_case}/reports", _submit_result, body, None, headers, (202,)
        )

    def _relay_call(self, use_case: str, items: Sequence[RelayItem]) -> _Call:
        family = self._families.get(use_case)
        body = {
            "items": [
                {
                    "device_id": it.device_id,
                    "report": _report_dict(it.report, family),
                    "idempotency_key": it.idempotency_key or _key(),
                }
                for it in items
            ]
        }
        return _Call(
            "POST",
            f"/v1/use-cases/{use_case}/reports:batch",
            lambda r: _adapter(BatchResult).validate_json(r.content),
            body,
        )

    def _budget_call(self, device_id: str, as_device: bool) -> _Call:
        status_type = _budget_types()["status"]
        headers = {"X-Device-Id": device_id} if as_device else {}
        adapter = _adapter(list[status_type])  # type: ignore[valid-type]

        def parse(response: httpx.Response) -> DeviceBudget:
            data = response.json()
            return DeviceBudget(data["device_id"], adapter.validate_python(data["use_cases"]))

        return _Call("GET", f"/v1/devices/{device_id}/budget", parse, headers=headers)

    def _report_call(self, delta: float | None) -> _Call:
        kind = _budget_types()["report"]
        params = {"delta": delta} if delta is not None else None
        return _Call(
            "GET",
            "/v1/audit/effective-epsilon",
            lambda r: _adapter(kind).validate_json(r.content),
            params=params,
        )

    def _what_if_call(self, use_case: str, changes: Mapping[str, Any]) -> _Call:
        kind = _budget_types()["what_if"]
        return _Call(
            "POST",
            f"/v1/use-cases/{use_case}/what-if",
            lambda r: _adapter(kind).validate_json(r.content),
            dict(changes),
        )

    def _estimates_call(
        self, use_case: str, candidates: Sequence[str], start: date | None, end: date | None
    ) -> _Call:
        body: dict[str, Any] = {"candidates": list(candidates)}
        if start is not None:
            body["from"] = start.isoformat()
        if end is not None:
            body["to"] = end.isoformat()
        return _Call(
            "POST",
            f"/v1/use-cases/{use_case}/estimates:query",
            lambda r: _adapter(Estimates).validate_json(r.content),
            body,
        )

    def _job_call(self, job: str) -> _Call:
        return _Call(
            "POST",
            f"/v1/admin/jobs/{job}:run",
            lambda r: _adapter(JobResult).validate_json(r.content),
        )


def _key() -> str:
    return uuid.uuid4().hex


def _headers(admin_token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {admin_token}"} if admin_token else {}


def _randomizer(policy: PolicyPublic) -> Mechanism:
    return from_published(policy.randomizer.model_dump())


# -- the clients --------------------------------------------------------------------------------


class Client(_Api):
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
            base_url=base_url, headers=_headers(admin_token), timeout=timeout, transport=transport
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

    def _run(self, call: _Call) -> Any:
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
            wait = _decide(call, response, self._retry, attempt)
            if wait is None:
                return _finish(call, response)
            self._sleep(wait)

    def policy(self, name: str) -> PolicyPublic:
        """A use case's current policy (remembers its family identifier for submissions)."""
        return self._run(self._policy_call(name))  # type: ignore[no-any-return]

    def policies(self) -> list[PolicyPublic]:
        """Every active use case's current policy."""
        return self._run(self._policies_call())  # type: ignore[no-any-return]

    def randomizer(self, name: str) -> Mechanism:
        """The mechanism the use case's published policy prescribes, built from it alone."""
        return _randomizer(self.policy(name))

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

    def effective_epsilon(self, delta: float | None = None) -> EffectiveEpsilonReport:
        """The effective-epsilon report (public)."""
        return self._run(self._report_call(delta))  # type: ignore[no-any-return]

    def what_if(self, use_case: str, **changes: Any) -> WhatIf:
        """What a policy change would do on today's ledger (admin); nothing changes."""
        return self._run(self._what_if_call(use_case, changes))  # type: ignore[no-any-return]

    def estimates(
        self,
        use_case: str,
        candidates: Sequence[str],
        *,
        start: date | None = None,
        end: date | None = None,
    ) -> Estimates:
        """Published estimates of candidates over ``[start, end]`` (admin; default all days)."""
        return self._run(  # type: ignore[no-any-return]
            self._estimates_call(use_case, candidates, start, end)
        )

    def run_job(self, job: str) -> JobResult:
        """Run a scheduled job now (admin): ``flush-inbox``, ``aggregate``, ``purge``..."""
        return self._run(self._job_call(job))  # type: ignore[no-any-return]


class AsyncClient(_Api):
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
            base_url=base_url, headers=_headers(admin_token), timeout=timeout, transport=transport
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

    async def _run(self, call: _Call) -> Any:
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
            wait = _decide(call, response, self._retry, attempt)
            if wait is None:
                return _finish(call, response)
            await self._sleep(wait)

    async def policy(self, name: str) -> PolicyPublic:
        """A use case's current policy (remembers its family identifier for submissions)."""
        return await self._run(self._policy_call(name))  # type: ignore[no-any-return]

    async def policies(self) -> list[PolicyPublic]:
        """Every active use case's current policy."""
        return await self._run(self._policies_call())  # type: ignore[no-any-return]

    async def randomizer(self, name: str) -> Mechanism:
        """The mechanism the use case's published policy prescribes, built from it alone."""
        return _randomizer(await self.policy(name))

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

    async def effective_epsilon(self, delta: float | None = None) -> EffectiveEpsilonReport:
        """The effective-epsilon report (public)."""
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
        start: date | None = None,
        end: date | None = None,
    ) -> Estimates:
        """Published estimates of candidates over ``[start, end]`` (admin; default all days)."""
        return await self._run(  # type: ignore[no-any-return]
            self._estimates_call(use_case, candidates, start, end)
        )

    async def run_job(self, job: str) -> JobResult:
        """Run a scheduled job now (admin): ``flush-inbox``, ``aggregate``, ``purge``..."""
        return await self._run(self._job_call(job))  # type: ignore[no-any-return]

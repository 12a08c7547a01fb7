"""The client's transport rules: typed errors, bounded retries, and when an answer is final."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Final

import httpx

__all__ = [
    "CAP_REASONS",
    "BadRequest",
    "Call",
    "Conflict",
    "NotFound",
    "RateLimited",
    "Retry",
    "ServiceError",
    "Unauthorized",
    "Unavailable",
    "decide",
    "finish",
    "retry_after_seconds",
]

# A budget's refusals (budget.rule.refusal.REFUSALS; the client does not import the budget package).
CAP_REASONS: Final = frozenset(
    {"daily_cap", "window_cap", "lifetime_cap", "window_filter", "lifetime_filter", "clock_behind"}
)


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
    """401 or 403: no or wrong credentials; ``field`` names the header or parameter needing them."""


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
class Call:
    """One request: what to send, whether it is safe to retry, and how to read the answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], Any]
    json: Any = None
    params: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    ok: tuple[int, ...] = (200,)


def decide(call: Call, response: httpx.Response, retry: Retry, attempt: int) -> float | None:
    """``None``: the answer is final; else the seconds to wait before trying again."""
    status = response.status_code
    if status in call.ok or (status == 429 and _is_cap_refusal(response)):
        return None
    if status == 429 or status >= 500:
        return retry.wait(attempt, retry_after_seconds(response.headers.get("Retry-After")))
    return None


def finish(call: Call, response: httpx.Response) -> Any:
    """The parsed answer, or the typed error carrying the server's body."""
    status = response.status_code
    if status in call.ok or (status == 429 and _is_cap_refusal(response)):
        return call.parse(response)
    wait = retry_after_seconds(response.headers.get("Retry-After"))
    raise _error(status, _body(response), wait)

"""A typed client for devices, relays and operators: :class:`Client` and :class:`AsyncClient`.

Devices build their randomizer from the published policy (:meth:`Client.randomizer`) and submit
reports that carry its family identifier; relays forward many; operators read budgets, the
effective-epsilon report, what-ifs and estimates with the admin token. Every submission carries an
idempotency key (a random one unless given), so retries are safe: transport errors, 5xx and
rate-limit 429s are retried with bounded exponential backoff, honouring ``Retry-After``. A
budget cap's 429 is an answer (:class:`Refusal`), not an error. Other failures raise
:class:`ServiceError` subclasses carrying the server's error body.

Answers are the API's own wire models (:mod:`dp_governor.api.schemas`); the client imports
those, :mod:`dp_governor.mechanisms` and httpx, never the server.
"""

from dp_governor.api.client._calls import (
    JobResult,
    Receipt,
    Refusal,
    RelayItem,
    ReportBody,
    SubmitResult,
)
from dp_governor.api.client._clients import AsyncClient, Client
from dp_governor.api.client._tlog import RecordCheck, verify_record
from dp_governor.api.client._transport import (
    CAP_REASONS,
    BadRequest,
    Conflict,
    NotFound,
    RateLimited,
    Retry,
    ServiceError,
    Unauthorized,
    Unavailable,
    retry_after_seconds,
)
from dp_governor.api.schemas import (
    BatchItemResult,
    BatchResult,
    BudgetStatus,
    DeviceBudget,
    EffectiveEpsilonReport,
    EstimateItem,
    Estimates,
    PolicyPublic,
    WhatIf,
)

__all__ = [
    "CAP_REASONS",
    "AsyncClient",
    "BadRequest",
    "BatchItemResult",
    "BatchResult",
    "BudgetStatus",
    "Client",
    "Conflict",
    "DeviceBudget",
    "EffectiveEpsilonReport",
    "EstimateItem",
    "Estimates",
    "JobResult",
    "NotFound",
    "PolicyPublic",
    "RateLimited",
    "Receipt",
    "RecordCheck",
    "Refusal",
    "RelayItem",
    "ReportBody",
    "Retry",
    "ServiceError",
    "SubmitResult",
    "Unauthorized",
    "Unavailable",
    "WhatIf",
    "retry_after_seconds",
    "verify_record",
]

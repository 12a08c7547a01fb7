"""Typed errors of the budget core; each carries the data a caller needs to answer precisely."""

from __future__ import annotations

from dp_governor.policies.errors import PolicyConflict, UnknownUseCase

__all__ = [
    "BudgetError",
    "IdempotencyConflict",
    "InvalidRequest",
    "PolicyConflict",
    "UnknownUseCase",
]


class BudgetError(Exception):
    """Base class of the budget core's errors."""


class InvalidRequest(BudgetError, ValueError):
    """A request field is invalid; ``field`` names it. Nothing was written."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"`{field}` {reason}")
        self.field = field
        self.reason = reason


class IdempotencyConflict(BudgetError):
    """An idempotency key was reused for a different request."""

    def __init__(self, key: str) -> None:
        super().__init__("the idempotency key was already used for a different request")
        self.key = key

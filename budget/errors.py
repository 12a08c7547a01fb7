"""Typed errors of the budget core; each carries the data a caller needs to answer precisely."""

from __future__ import annotations

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


class UnknownUseCase(BudgetError, LookupError):
    """No active policy has this name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown use case {name!r}")
        self.name = name


class IdempotencyConflict(BudgetError):
    """An idempotency key was reused for a different request."""

    def __init__(self, key: str) -> None:
        super().__init__("the idempotency key was already used for a different request")
        self.key = key


class PolicyConflict(BudgetError, ValueError):
    """A policy change conflicts with stored state; ``field`` names the culprit."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"`{field}` {reason}")
        self.field = field
        self.reason = reason

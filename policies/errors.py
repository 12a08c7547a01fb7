"""Errors of the policy layer (re-exported by :mod:`budget.errors`)."""

from __future__ import annotations

__all__ = ["PolicyConflict", "PolicyError", "UnknownUseCase"]


class PolicyError(Exception):
    """Base class of the policy layer's errors."""


class UnknownUseCase(PolicyError, LookupError):
    """No active policy has this name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown use case {name!r}")
        self.name = name


class PolicyConflict(PolicyError, ValueError):
    """A policy change conflicts with stored state; ``field`` names the culprit."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"`{field}` {reason}")
        self.field = field
        self.reason = reason

"""Errors of the policy layer (re-exported by :mod:`dp_governor.budget.errors`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

__all__ = ["PolicyConflict", "PolicyError", "PolicyLoosens", "UnknownUseCase", "error_message"]


def error_message(error: ErrorDetails) -> str:
    """One validation error's message in the project's words ("must be a finite number").

    Files, commands and routes thus refuse a NaN or an infinity alike.
    """
    if error.get("type") == "finite_number":
        return f"must be a finite number, got {error.get('input')!r}"
    return str(error.get("msg"))


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


class PolicyLoosens(PolicyConflict):
    """A policy change would let some device spend more than the policies before it.

    ``loosenings`` says what, one phrase each; the change is written only when the caller
    allows loosening explicitly (``allow_loosen``, ``--allow-loosen``).
    """

    def __init__(self, loosenings: list[str]) -> None:
        super().__init__(
            "allow_loosen",
            "must be set to write a change that loosens a policy: " + "; ".join(loosenings),
        )
        self.loosenings = list(loosenings)

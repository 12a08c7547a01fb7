"""Errors of the policy layer (re-exported by :mod:`dp_governor.budget.errors`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

__all__ = [
    "UNKNOWN_KEY",
    "PolicyConflict",
    "PolicyError",
    "PolicyLoosens",
    "UnknownUseCase",
    "error_message",
]


# Our validators' messages name the value: pydantic's words in front of them are taken off.
_OWN_PREFIXES = {"value_error": "Value error, ", "assertion_error": "Assertion failed, "}
UNKNOWN_KEY = "is not a field"  # an unknown key: the caller names the allowed ones
_SHOWN_CHARACTERS = 80
_JSON_WORDS = {None: "null", True: "true", False: "false"}  # files and bodies are YAML or JSON


def error_message(error: ErrorDetails) -> str:
    """One validation error's message in the project's words, naming the value at fault.

    Files, commands and routes thus say the same thing: a NaN or an infinity "must be a finite
    number", and a value out of its type or bounds is named with what is allowed.

    >>> error_message({"type": "literal_error", "loc": ("mechanism",), "input": "nope",
    ...     "msg": "Input should be 'cms' or 'sfp'", "ctx": {"expected": "'cms' or 'sfp'"}})
    "must be one of 'cms' or 'sfp', got 'nope'"
    >>> error_message({"type": "greater_than_equal", "loc": ("k",), "input": 0,
    ...     "msg": "Input should be greater than or equal to 1"})
    'must be greater than or equal to 1, got 0'
    >>> error_message({"type": "value_error", "loc": (), "input": {},
    ...     "msg": "Value error, `m` must be a power of 2 for hcms, got 1000"})
    '`m` must be a power of 2 for hcms, got 1000'
    >>> error_message({"type": "int_type", "loc": ("k",), "input": None,
    ...     "msg": "Input should be a valid integer"})
    'must be a valid integer, got null'
    """
    kind = str(error.get("type"))
    if kind == "finite_number":
        return f"must be a finite number, got {error.get('input')!r}"
    message = str(error.get("msg"))
    if kind in _OWN_PREFIXES:  # our own checks name the value
        return message.removeprefix(_OWN_PREFIXES[kind])
    if kind == "extra_forbidden":
        return UNKNOWN_KEY
    if kind == "missing" or not error.get("loc") or "input" not in error:
        return message  # a model's input is the whole model
    if kind in ("literal_error", "enum"):
        message = f"must be one of {error.get('ctx', {}).get('expected')}"
    elif message.startswith("Input should be "):
        message = "must be " + message.removeprefix("Input should be ")
    return f"{message}, got {_shown(error['input'])}"


def _shown(value: object) -> str:
    """``repr(value)`` (null, true, false as YAML and JSON say them), cut to a readable length.

    A message may quote a whole body's field.

    >>> _shown("nope"), _shown(None), _shown("x" * 200)[-24:]
    ("'nope'", 'null', 'xxxx... (202 characters)')
    """
    if value is None or isinstance(value, bool):
        return _JSON_WORDS[value]
    text = repr(value)
    if len(text) <= _SHOWN_CHARACTERS:
        return text
    return f"{text[:_SHOWN_CHARACTERS]}... ({len(text)} characters)"


class PolicyError(Exception):
    """Base class of the policy layer's errors."""


class UnknownUseCase(PolicyError, LookupError):
    """No active policy has this name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown use case {name!r}")
        self.name = name


class PolicyConflict(PolicyError, ValueError):
    """A policy change conflicts with stored state; ``field`` names the culprit.

    ``policy``: the use case whose new version is at fault, where one is (a file names it).
    """

    def __init__(self, field: str, reason: str, *, policy: str | None = None) -> None:
        super().__init__(f"`{field}` {reason}")
        self.field = field
        self.reason = reason
        self.policy = policy


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

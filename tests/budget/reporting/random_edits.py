"""The pieces the reporting model tests' random steps share: pick, the active names, an edit."""

from __future__ import annotations

from typing import TypeVar

import numpy as np

from dp_governor.budget import Ledger
from dp_governor.policies import PolicyUpdate

T = TypeVar("T")


def active(ledger: Ledger) -> list[str]:
    """The use cases that take reports now, in the book's order."""
    return [p.name for p in ledger.book().active]


def pick(rng: np.random.Generator, items: list[T]) -> T:
    """One of ``items``, uniformly."""
    return items[int(rng.integers(len(items)))]


def edit(ledger: Ledger, name: str, change: PolicyUpdate) -> None:
    """Write ``change``; one refused (a group's shared terms, SFP's split) writes nothing."""
    try:
        ledger.policies.update(name, change, allow_loosen=True)
    except ValueError:  # PolicyConflict, or the model's own validation
        pass

"""Shared test helpers for the mechanisms."""

from __future__ import annotations

import random as stdlib_random  # noqa: TID251 - patched, never used
from collections.abc import Callable

import numpy as np
import pytest


def forbid_numpy_and_stdlib_random(
    monkeypatch: pytest.MonkeyPatch, boom: Callable[..., None]
) -> None:
    """Make every numpy and stdlib random entry point raise for the rest of the test."""
    for name in ("default_rng", "random", "rand", "randint", "bytes", "choice", "seed"):
        monkeypatch.setattr(np.random, name, boom)
    for name in ("random", "getrandbits", "randrange", "randint", "choice", "shuffle"):
        monkeypatch.setattr(stdlib_random, name, boom)

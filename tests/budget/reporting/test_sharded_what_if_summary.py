"""The what-if over shards from their stored what-ifs equals one database's full what-if.

One ledger and the same devices routed over 2 shards (a SQLite file, and a PostgreSQL schema
when ``DPGOV_TEST_DATABASE_URL`` is set) take the seeded random steps of
:mod:`tests.budget.reporting.test_sharded_summary` (charges, days passing, purges, policy
edits). After each step every proposal of :mod:`tests.budget.reporting.test_what_if_summary`
and a device-wide budget give, over the shards, each brought forward from its stored what-if,
the what-if of a full pass over the one ledger, bit for bit; most steps read no shard whole.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import dp_governor.budget.reporting.sharded_what_if as sharded
from dp_governor.budget import Ledger
from dp_governor.budget.errors import PolicyConflict
from dp_governor.budget.reporting.sharded_what_if import (
    sharded_what_if,
    sharded_what_if_device_budget,
)
from dp_governor.budget.reporting.views import what_if, what_if_device_budget
from dp_governor.policies import PolicyUpdate
from tests.budget.reporting.test_sharded_summary import _edit, _open, _step, shard_urls
from tests.budget.reporting.test_what_if_summary import DEVICE_PROPOSAL, START, _proposals

__all__ = ["shard_urls"]  # the fixture, shared

STEPS = 20


def _counted(calls: list[int], full: Callable[..., Any], *args: Any) -> Any:
    """``full(*args)``, counted: a shard read whole."""
    calls.append(1)
    return full(*args)


def test_the_sharded_what_if_from_summaries_equals_a_full_pass_across_random_steps(
    ledger: Ledger, shard_urls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(5)
    shards = [_open(url) for url in shard_urls]
    openers = [functools.partial(_open, url) for url in shard_urls]
    fulls: list[int] = []
    monkeypatch.setattr(sharded, "_full", functools.partial(_counted, fulls, sharded._full))
    for i, name in enumerate(p.name for p in ledger.book().active):  # windows of a few days
        _edit([ledger, *shards], name, PolicyUpdate(retention_days=1 + i % 4))
    now, asked = START, 0
    try:
        for _ in range(STEPS):
            now = _step(ledger, shards, rng, now)
            for name, proposed in _proposals(ledger).values():
                try:
                    expected = what_if(ledger, name, proposed, now=now, full=True)
                except PolicyConflict:  # a write would refuse it: so does the what-if
                    with pytest.raises(PolicyConflict):
                        sharded_what_if(shards, openers, name, proposed, now=now, workers=1)
                    continue
                merged = sharded_what_if(shards, openers, name, proposed, now=now, workers=1)
                assert merged == expected
                asked += 1
            expected_device = what_if_device_budget(ledger, DEVICE_PROPOSAL, now=now, full=True)
            merged_device = sharded_what_if_device_budget(
                shards, openers, DEVICE_PROPOSAL, now=now, workers=1
            )
            assert merged_device == expected_device
            asked += 1
        assert len(fulls) <= asked, (len(fulls), asked)  # of 2 * asked: most came forward
        monkeypatch.undo()  # in worker processes, as the command line runs them
        for full in (True, False):
            merged_device = sharded_what_if_device_budget(
                shards, openers, DEVICE_PROPOSAL, now=now, workers=2, full=full
            )
            assert merged_device == expected_device
    finally:
        for shard in shards:
            shard.close()

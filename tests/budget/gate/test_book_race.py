"""A group move racing 400 devices' reports on PostgreSQL: no charge decides on a stale book.

Under READ COMMITTED a charge reads the policy book, then locks its device's row; a policy
write that commits in between used to leave the charge deciding on the book before it. Here
``b`` joins ``a``'s group (one report a day, shared) while every device sends one report to
each. Every charge committed after the move must have been decided by the new book, under
which a device's second report of the day is refused; the audit log's order is the commit
order, so a device whose charge comes after the move with an earlier one before it was
decided on a stale book.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest
from sqlalchemy import Engine, text

from dp_governor.budget import Ledger, SystemClock
from dp_governor.policies import PolicyCreate, PolicyUpdate
from tests.conftest import PG_URL, SECRET, make_engine

DEVICES = 400
ROUNDS = 12


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[Engine]:
    if not PG_URL:
        pytest.skip("DPGOV_TEST_DATABASE_URL is not set (no PostgreSQL to test on)")
    yield from make_engine("postgresql", tmp_path)


def _policy(name: str, group: str | None) -> PolicyCreate:
    return PolicyCreate.model_validate(
        {
            "name": name,
            "mechanism": "cms",
            "k": 4,
            "m": 8,
            "epsilon_per_report": 1.0,
            "max_reports_per_day": 1,
            "budget_group": group,
        }
    )


def _stale(engine: Engine, moved: str) -> list[str]:
    """Devices with an accepted charge committed after ``moved``'s join and one before it."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT seq, actor, action, body FROM audit_log ORDER BY seq"))
        move = None
        seqs: dict[str, list[int]] = defaultdict(list)
        for seq, actor, action, body in rows:
            data = orjson.loads(body)["data"]
            if action == "policy.update" and data["name"] == moved:
                move = int(seq)
            elif action == "charge" and data["accepted"]:
                seqs[str(actor)].append(int(seq))
    assert move is not None
    return [d for d, s in seqs.items() if max(s) > move and min(s) < max(s)]


class Round:
    """One round: ``b`` joins ``a``'s group once a quarter of the devices have sent both."""

    def __init__(self, ledger: Ledger, r: int) -> None:
        self.ledger, self.r = ledger, r
        self.a, self.b, self.group = f"a{r}", f"b{r}", f"g{r}"
        ledger.policies.create(_policy(self.a, self.group))
        ledger.policies.create(_policy(self.b, None))
        self.now = SystemClock().now()
        self.quarter = threading.Event()
        self.done = 0
        self.lock = threading.Lock()

    def send(self, device: int) -> None:
        """One device's two reports, in an order that alternates between devices."""
        first, second = (self.a, self.b) if device % 2 else (self.b, self.a)
        for use_case in (first, second):
            self.ledger.charge(f"r{self.r}-dev-{device}", use_case, now=self.now)
        with self.lock:
            self.done += 1
            if self.done >= DEVICES // 4:
                self.quarter.set()

    def move(self) -> None:
        """``b`` joins the group (a tightening: no flag needed)."""
        self.quarter.wait()
        self.ledger.policies.update(self.b, PolicyUpdate(budget_group=self.group))


def test_no_charge_decides_on_a_book_that_changed_before_it_committed(pg: Engine) -> None:
    ledger = Ledger(pg, SECRET)
    for r in range(ROUNDS):
        race = Round(ledger, r)
        with ThreadPoolExecutor(max_workers=16) as pool:
            mover = pool.submit(race.move)
            list(pool.map(race.send, range(DEVICES)))
            mover.result()
        stale = _stale(pg, race.b)
        assert stale == [], f"round {r}: {len(stale)} device(s) charged on a stale book"

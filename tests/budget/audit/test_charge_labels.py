"""Per-charge labels: no two leaves of a device share a label, and the leaves still count.

A real ledger (SQLite, and PostgreSQL when configured). Random days of several devices charging
several use cases, in single reports and relays' batches, with a use case's epsilon changed in
the middle of a day: every charge leaf carries a label of its own, each device's record of a
day verifies with nothing but its label key and the log's key, the local distribution
recounted from the unlinked leaves equals the count from the ``charges`` table, and the claims
of those days reproduce from the leaves (an altered distribution is named). An upgraded ledger
keeps its earlier version 1 leaves under their day label beside the new ones.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import orjson
import pytest
from sqlalchemy import text

import dp_governor.budget.gate.charge as gate_charge
from dp_governor.api import wire
from dp_governor.api.client import verify_record
from dp_governor.api.schemas import DeviceRecord
from dp_governor.budget import Ledger, utc_day
from dp_governor.budget.audit.leaves import charge_label, day_label
from dp_governor.budget.gate.charge import BatchItem, charge_batch
from dp_governor.budget.reporting.claims import (
    CLAIM_ACTION,
    DayTotals,
    check_claims,
    publish_claims,
)
from dp_governor.budget.reporting.transparency import device_record
from dp_governor.policies import PolicyUpdate
from tests.budget.audit.releases import entry_before_labels

NOW = datetime(2026, 11, 22, 9, tzinfo=UTC)
DAY = utc_day(NOW)
USE_CASES = ("emoji", "quicktype", "lookup-hints")
DEVICES = [f"device-{i}" for i in range(7)]


def _generous(ledger: Ledger) -> None:
    """Room for several reports a day, so ordinals and running totals go past one."""
    for name in USE_CASES:
        ledger.policies.update(name, PolicyUpdate(max_reports_per_day=4), allow_loosen=True)


def _random_days(ledger: Ledger, rng: np.random.Generator, days: int) -> None:
    """Random reports on ``days`` days; emoji's epsilon changes in the middle of the second."""
    for back in range(days, 0, -1):
        moment = NOW - timedelta(days=back - 1)
        for step in range(int(rng.integers(8, 21))):
            if back == days - 1 and step == 5:
                ledger.policies.update("emoji", PolicyUpdate(epsilon_per_report=3.0))
            if rng.random() < 0.3:  # a relay's batch: a device may repeat in it
                items = [
                    BatchItem(str(rng.choice(DEVICES)), str(rng.choice(USE_CASES)))
                    for _ in range(int(rng.integers(2, 7)))
                ]
                charge_batch(ledger.gate, items, now=moment)
            else:
                ledger.charge(str(rng.choice(DEVICES)), str(rng.choice(USE_CASES)), now=moment)


def _owners(ledger: Ledger) -> dict[int, str]:
    """Each charge entry's device pseudonym, by sequence number (the operator's view)."""
    with ledger.connect() as conn:
        rows = conn.execute(
            text("SELECT seq, actor FROM audit_log WHERE action = 'charge' ORDER BY seq")
        ).all()
    return {int(seq): str(actor).removeprefix("device:") for seq, actor in rows}


def _direct(ledger: Ledger, use_case: str, day: int) -> list[list[int]]:
    """The day's devices per daily total, counted from the ``charges`` table."""
    with ledger.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT sum(epsilon_micro) FROM charges WHERE use_case = :u AND day = :d"
                " GROUP BY device_key"
            ),
            {"u": use_case, "d": day},
        ).all()
    return [[e, n] for e, n in sorted(Counter(int(r[0]) for r in rows).items())]


def _recount(leaves: list[dict[str, Any]]) -> dict[tuple[str, int], list[list[int]]]:
    totals: dict[tuple[str, int], DayTotals] = defaultdict(DayTotals)
    for leaf in leaves:
        if leaf["kind"] == "charge":
            totals[(leaf["use_case"], leaf["day"])].add(leaf)
    return {key: t.distribution() for key, t in totals.items()}


def _checked(ledger: Ledger, device: str, day: int) -> None:
    """The device's record of ``day`` verifies, and its totals are the gate's."""
    record = DeviceRecord.model_validate(
        wire.device_record(device_record(ledger, device, day)).model_dump()
    )
    check = verify_record(record, ledger.tlog.verifier.vkey())
    assert check.ok, (device, day, check.problem)
    assert check.totals == {g.use_case: (g.reports, g.epsilon_micro) for g in record.gate}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_two_leaves_of_a_device_share_a_label_and_the_leaves_recount_the_days(
    ledger: Ledger, seed: int
) -> None:
    _generous(ledger)
    _random_days(ledger, np.random.default_rng(seed), days=3)
    ledger.tlog.sync()
    leaves = [orjson.loads(x) for x in ledger.tlog.entries(0, 100_000)]
    owners = _owners(ledger)
    charges = [leaf for leaf in leaves if leaf["kind"] == "charge"]
    assert charges and all(leaf["v"] == 2 for leaf in charges)
    assert any(leaf["spent"] > leaf["epsilon_micro"] for leaf in charges)  # some n >= 2
    by_device: dict[str, list[str]] = defaultdict(list)
    for leaf in charges:
        by_device[owners[leaf["seq"]]].append(leaf["label"])
    for labels in by_device.values():
        assert len(set(labels)) == len(labels)
    assert len({leaf["label"] for leaf in charges}) == len(charges)
    # every leaf's label is its charge's: the n-th of its use case that day, for its device
    seen: Counter[tuple[str, str, int]] = Counter()
    for leaf in charges:
        dk = owners[leaf["seq"]]
        seen[(dk, leaf["use_case"], leaf["day"])] += 1
        n = seen[(dk, leaf["use_case"], leaf["day"])]
        assert leaf["label"] == charge_label(
            ledger.tlog.label_key(dk), leaf["day"], leaf["use_case"], n
        )
    recounted = _recount(leaves)
    for (use_case, day), counted in recounted.items():
        assert counted == _direct(ledger, use_case, day), (use_case, day)
    for device in DEVICES:
        for day in (DAY - 2, DAY - 1, DAY):
            _checked(ledger, device, day)
    verdict, _ = ledger.verify()
    assert verdict.ok, verdict


def test_a_mid_day_epsilon_change_is_recounted_and_claimed_from_the_leaves(ledger: Ledger) -> None:
    _generous(ledger)
    yesterday = NOW - timedelta(days=1)
    ledger.charge("a", "emoji", now=yesterday)  # 4.0
    ledger.charge("b", "emoji", now=yesterday)
    ledger.policies.update("emoji", PolicyUpdate(epsilon_per_report=3.0))
    ledger.charge("a", "emoji", now=yesterday)  # a: 4 + 3
    ledger.charge("c", "emoji", now=yesterday)  # c: 3
    ledger.charge("a", "emoji", now=yesterday)  # a: 4 + 3 + 3
    assert publish_claims(ledger, today=DAY, now=NOW) >= 1
    ledger.tlog.sync()
    leaves = ledger.tlog.entries(0, 100_000)
    recounted = _recount([orjson.loads(x) for x in leaves])
    assert recounted[("emoji", DAY - 1)] == [[3_000_000, 1], [4_000_000, 1], [10_000_000, 1]]
    assert recounted[("emoji", DAY - 1)] == _direct(ledger, "emoji", DAY - 1)
    checks = check_claims(leaves)
    assert checks and all(c.ok for c in checks), [c.problems for c in checks]
    for device in ("a", "b", "c"):
        _checked(ledger, device, DAY - 1)
    # a claim whose distribution was altered is named
    altered = []
    for raw in leaves:
        leaf = orjson.loads(raw)
        if leaf["kind"] == CLAIM_ACTION and leaf["data"]["inputs"]["use_case"] == "emoji":
            leaf["data"]["local"] = [[3_000_000, 1], [7_000_000, 1], [4_000_000, 1]]
        altered.append(orjson.dumps(leaf))
    problems = [p for c in check_claims(altered) for p in c.problems]
    assert any(p.startswith("local epsilon distribution: claimed") for p in problems), problems


def test_an_upgraded_ledger_keeps_its_day_labels_beside_per_charge_labels(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    _generous(ledger)
    with monkeypatch.context() as patch:  # the earlier release's gate writes the morning
        patch.setattr(gate_charge, "charge_entry", entry_before_labels)
        ledger.charge("a", "emoji", now=NOW)
        ledger.charge("b", "emoji", now=NOW)
        ledger.charge("a", "quicktype", now=NOW)
    early = ledger.tlog.sync()  # the tree the earlier release published
    assert early is not None
    ledger.charge("a", "emoji", now=NOW + timedelta(hours=1))  # upgraded: a's second emoji
    ledger.charge("c", "emoji", now=NOW + timedelta(hours=1))
    ledger.tlog.sync()
    assert ledger.tlog.entries(0, early.size) == [
        ledger.tlog.receipt(seq).leaf  # type: ignore[union-attr]
        for seq in range(1, early.size + 1)
    ]
    leaves = [orjson.loads(x) for x in ledger.tlog.entries(0, 100_000)]
    charges = [leaf for leaf in leaves if leaf["kind"] == "charge"]
    assert ["v" in leaf for leaf in charges] == [False, False, False, True, True]
    key = ledger.tlog.label_key(ledger.device_key("a"))
    assert charges[0]["label"] == charges[2]["label"] == day_label(key, DAY)  # version 1
    assert charges[3]["label"] == charge_label(key, DAY, "emoji", 2)  # its second emoji charge
    assert charges[3]["spent"] == 8_000_000
    assert _recount(leaves)[("emoji", DAY)] == _direct(ledger, "emoji", DAY)
    assert _direct(ledger, "emoji", DAY) == [[4_000_000, 2], [8_000_000, 1]]
    for device in ("a", "b", "c"):
        _checked(ledger, device, DAY)
    verdict, _ = ledger.verify()
    assert verdict.ok, verdict

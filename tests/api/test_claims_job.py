"""The checkpoint job claims the days that ended, once, before it signs the head."""

from __future__ import annotations

from sqlalchemy import Engine

from dp_governor.api.jobs import RUNTIMES, Runtime, run_job
from dp_governor.budget import FixedClock
from dp_governor.budget.reporting.claims import check_claims
from dp_governor.pipeline.ingest import Ingestor
from tests.budget.reporting.test_claims import FIRST, NOW, SEAL, SECRET, build


def test_the_checkpoint_job_claims_each_ended_day_once(engine: Engine) -> None:
    ledger = build(engine, claim=False)
    RUNTIMES["claims"] = Runtime(ledger, Ingestor(ledger, SECRET, seal=SEAL), FixedClock(NOW))
    try:
        first = run_job("checkpoint", "claims", force=True)
        again = run_job("checkpoint", "claims", force=True)
    finally:
        RUNTIMES.pop("claims", None)
    assert first is not None and first["claims"] == 2
    assert again is not None and again["claims"] == 0 and again["tlog"] is None
    point = ledger.tlog.latest()
    assert point is not None and first["tlog"]["size"] == point.size
    checks = check_claims(ledger.tlog.entries(0, point.size))  # the signed head holds them
    assert [(c.day, c.ok) for c in checks] == [(FIRST, True), (FIRST + 1, True)]

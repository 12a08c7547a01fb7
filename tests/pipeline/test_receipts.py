"""Receipts: unique across the shards of a deployment, which share the secret and not the log.

Two databases (SQLite, and the ``engine`` fixture's backend: PostgreSQL when configured) charge
the same reports, so their charge ids are the same: under their own origins no receipt repeats,
under one origin every one does (what the origin is in the message for), and each receipt is the
documented HMAC (docs/api.md#receipts).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from dp_governor.api.database import init_service_db
from dp_governor.budget import Decision, Ledger, create_db_engine
from dp_governor.pipeline.ingest import Ingestor, SubmitRequest
from dp_governor.policies import mechanism_for
from tests.pipeline.test_pipeline import NOW, SEAL, SECRET, _policy

AUDIT_KEY = b"receipts-audit-key-receipts-audit-key!"


def _ingestor(engine: Engine, origin: str) -> Ingestor:
    init_service_db(engine)
    ledger = Ledger(engine, SECRET, audit_key=AUDIT_KEY, tlog_origin=origin)
    ledger.policies.create(_policy("tiny-cms"))
    return Ingestor(ledger, SECRET, seal=SEAL)


def _accepted(ingestor: Ingestor, devices: Sequence[str]) -> list[Decision]:
    mech = mechanism_for(_policy("tiny-cms"))
    bodies = mech.privatize(["v1"] * len(devices), rng=np.random.default_rng(1)).to_dicts()
    requests = [SubmitRequest("tiny-cms", d, b) for d, b in zip(devices, bodies, strict=True)]
    decisions = ingestor.submit_group(requests, now=NOW)
    assert all(isinstance(d, Decision) and d.accepted for d in decisions), decisions[:3]
    return [d for d in decisions if isinstance(d, Decision)]


def _documented(origin: str, use_case: str, charge_id: int) -> str:
    """docs/api.md's definition, written out with the standard library."""
    message = f"\0dp-governor/receipt/v2\0{origin}\0{use_case}\0{charge_id}".encode()
    return hmac.new(SECRET, message, hashlib.sha256).hexdigest()[:32]


def test_shards_with_their_own_origins_hand_out_no_receipt_twice(
    engine: Engine, tmp_path: Path
) -> None:
    """The same charge ids in two databases; the receipts differ by the log's origin alone."""
    other = create_db_engine(f"sqlite:///{tmp_path / 'shard1.sqlite'}")
    shard0 = _ingestor(engine, "dpgov.example/shard0")
    shard1 = _ingestor(other, "dpgov.example/shard1")
    first = _accepted(shard0, [f"a{i}" for i in range(20)])
    second = _accepted(shard1, [f"b{i}" for i in range(20)])
    assert [d.charge_id for d in first] == [d.charge_id for d in second]  # ids are per database
    receipts0 = [shard0.receipt(d) for d in first]
    receipts1 = [shard1.receipt(d) for d in second]
    assert len(set(receipts0) | set(receipts1)) == 40
    ids = [d.charge_id or 0 for d in first]
    assert receipts0 == [_documented("dpgov.example/shard0", "tiny-cms", i) for i in ids]
    as_shard0 = Ledger(other, SECRET, tlog_origin="dpgov.example/shard0")
    same_origin = Ingestor(as_shard0, SECRET, seal=SEAL)
    assert [same_origin.receipt(d) for d in second] == receipts0
    other.dispose()


def test_a_receipt_is_the_documented_hmac(tmp_path: Path) -> None:
    """Any origin, use case and charge id: the receipt of an accepted decision is docs/api.md's."""
    engine = create_db_engine(f"sqlite:///{tmp_path / 'one.sqlite'}")
    (accepted,) = _accepted(_ingestor(engine, "dpgov.example/tlog"), ["d0"])

    @settings(max_examples=50, deadline=None)
    @given(
        st.text(
            st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters="+"),
            min_size=1,
            max_size=20,
        ),
        st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True),
        st.integers(1, 2**62),
    )
    def check(origin: str, use_case: str, charge_id: int) -> None:
        ingestor = Ingestor(Ledger(engine, SECRET, tlog_origin=origin), SECRET, seal=SEAL)
        decision = accepted._replace(use_case=use_case, charge_id=charge_id)
        assert ingestor.receipt(decision) == _documented(origin, use_case, charge_id)

    check()
    engine.dispose()

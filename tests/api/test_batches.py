"""The flush publishes a use case's batch only with ``min_batch_devices`` distinct devices.

On SQLite and, when configured, PostgreSQL. The inbox's pseudonyms count devices; the store
and the batch records hold none.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from alembic import command
from sqlalchemy import Engine, inspect, text

from dp_governor.api.database import init_service_db
from dp_governor.budget import Decision, Ledger, create_db_engine, init_db, utc_day
from dp_governor.budget.reporting.central import central_figures
from dp_governor.budget.storage.db import writer
from dp_governor.budget.storage.schema import alembic_config
from dp_governor.pipeline.codec import (
    sketch_digest,
    sketch_from_bytes,
    sketch_to_bytes,
)
from dp_governor.pipeline.flush import flush_inbox
from dp_governor.pipeline.fold import aggregate
from dp_governor.pipeline.ingest import Ingestor, SubmitRequest
from dp_governor.pipeline.seal import InboxSeal
from dp_governor.policies import PolicyCreate, mechanism_for

SECRET = b"batch-secret-batch-secret-batch-secret"
SEAL = InboxSeal([b"batch-shuffler-batch-shuffler-batch-shuffler"])
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)


def _policy(name: str, min_devices: int) -> PolicyCreate:
    return PolicyCreate.model_validate(
        {
            "name": name,
            "mechanism": "cms",
            "k": 16,
            "m": 64,
            "epsilon_per_report": 2.0,
            "max_reports_per_day": 5,
            "retention_days": 30,
            "min_batch_devices": min_devices,
        }
    )


def _submit(ingestor: Ingestor, name: str, devices: list[str], now: datetime) -> None:
    mech = mechanism_for(_policy(name, 1))
    bodies = mech.privatize(["a"] * len(devices), rng=np.random.default_rng(len(devices)))
    requests = [SubmitRequest(name, d, b) for d, b in zip(devices, bodies.to_dicts(), strict=True)]
    results = ingestor.submit_group(requests, now=now)
    assert all(isinstance(r, Decision) and r.accepted for r in results), results[:3]


def _count(engine: Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def test_batch_waits_for_distinct_devices_and_records_its_sizes(engine: Engine) -> None:
    init_service_db(engine)
    ledger = Ledger(engine, SECRET)
    ledger.policies.create(_policy("held", 5))
    ledger.policies.create(_policy("open", 1))
    ingestor = Ingestor(ledger, SECRET, seal=SEAL)
    three = ["d1", "d2", "d3"]
    _submit(ingestor, "held", three, NOW)
    _submit(ingestor, "open", three, NOW)
    assert (
        flush_inbox(engine, seal=SEAL, min_batch=1, now=NOW) == 3
    )  # "open" as before; "held" waits
    # the same three devices again, next day: six reports, still three devices
    tomorrow = NOW + timedelta(days=1)
    _submit(ingestor, "held", three, tomorrow)
    assert flush_inbox(engine, seal=SEAL, min_batch=1, now=tomorrow) == 0
    assert _count(engine, "SELECT COUNT(*) FROM inbox WHERE use_case = 'held'") == 6
    assert _count(engine, "SELECT COUNT(*) FROM reports WHERE use_case = 'held'") == 0
    _submit(ingestor, "held", ["d4", "d1"], tomorrow)
    assert flush_inbox(engine, seal=SEAL, min_batch=1, now=tomorrow) == 0  # d1 again: four devices
    _submit(ingestor, "held", ["d5"], tomorrow)
    assert flush_inbox(engine, seal=SEAL, min_batch=1, now=tomorrow) == 9
    assert _count(engine, "SELECT COUNT(*) FROM inbox") == 0
    assert _count(engine, "SELECT COUNT(*) FROM reports WHERE use_case = 'held'") == 9
    with engine.connect() as conn:
        rows = (
            conn.execute(text("SELECT * FROM shuffled_batches ORDER BY use_case, id"))
            .mappings()
            .all()
        )
    held = [r for r in rows if r["use_case"] == "held"]
    assert len(held) == 1
    batch = held[0]
    assert (batch["devices"], batch["reports"], batch["max_per_device"]) == (5, 9, 3)
    assert orjson.loads(batch["layers"]) == [5, 3, 1]  # d1 sent 3, d2 and d3 sent 2
    assert (batch["first_day"], batch["last_day"], batch["day"]) == (
        utc_day(NOW),
        utc_day(tomorrow),
        utc_day(tomorrow),
    )
    assert batch["epsilon_micro"] == 2_000_000 and batch["min_batch_devices"] == 5
    assert batch["untagged"] == 0
    opened = [r for r in rows if r["use_case"] == "open"]
    # no minimum set: devices are counted all the same (every report carries its pseudonym)
    assert [(r["devices"], r["reports"], r["untagged"]) for r in opened] == [(3, 3, 0)]
    # nothing that names a device reached the store or the records
    columns = {c["name"] for c in inspect(engine).get_columns("reports")}
    columns |= {c["name"] for c in inspect(engine).get_columns("shuffled_batches")}
    assert not {"device_tag", "device_key", "device_id"} & columns
    lines = {
        line.use_case: line
        for line in central_figures(engine, ledger.book().versions, utc_day(tomorrow))
    }
    assert set(lines) == {"held", "open"}
    figure = lines["held"].days[0].batches[0]
    assert figure.layers == [5, 3, 1] and figure.central is not None
    assert figure.central.sub_batches == 3  # a device with three reports in it
    # three devices hide nobody at epsilon 2, and the figure says so rather than omit it
    opened_figure = lines["open"].days[0].batches[0].central
    assert opened_figure is not None and opened_figure.epsilon == 2.0
    assert lines["open"].window is not None and not lines["open"].notes


def test_inbox_pseudonyms_are_per_use_case_and_not_device_keys(engine: Engine) -> None:
    init_service_db(engine)
    ledger = Ledger(engine, SECRET)
    ledger.policies.create(_policy("held", 5))
    ledger.policies.create(_policy("open", 5))
    ingestor = Ingestor(ledger, SECRET, seal=SEAL)
    _submit(ingestor, "held", ["d1"], NOW)
    _submit(ingestor, "open", ["d1"], NOW)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, use_case, params, day, sealed, device_tag FROM inbox"))
        tags = []
        for row_id, use_case, params, day, sealed, clear in rows:
            assert clear is None  # sealed with the report: a copy of the database has neither
            tag = SEAL.open(row_id, use_case, params, day, sealed)[1]
            assert tag is not None
            tags.append(tag)
        keys = {str(k) for (k,) in conn.execute(text("SELECT device_key FROM charges"))}
    assert len(set(tags)) == 2
    for tag in tags:  # no 64-bit piece of a device key
        raw = tag.to_bytes(8, "big", signed=True).hex()
        assert not any(raw in key for key in keys)


def test_columns_added_to_an_earlier_database(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    engine = create_db_engine(f"sqlite:///{path}")
    init_service_db(engine)
    Ledger(engine, SECRET).policies.create(_policy("held", 5))
    engine.dispose()
    with sqlite3.connect(path) as db:  # the layout of the release before: revision 0002
        db.execute("ALTER TABLE inbox DROP COLUMN sealed")
        db.execute("ALTER TABLE inbox DROP COLUMN device_tag")
        db.execute("ALTER TABLE inbox DROP COLUMN tag")  # added by 0008
        db.execute("ALTER TABLE policies DROP COLUMN min_batch_devices")
        db.execute("DROP TABLE shuffled_batches")
        db.execute("UPDATE alembic_version SET version_num = '0002'")
        db.execute("INSERT INTO inbox VALUES (7, 'held', 'p', 20000, '{}')")
    engine = create_db_engine(f"sqlite:///{path}")
    init_db(engine)  # migration 0003
    init_db(engine)
    columns = {c["name"] for c in inspect(engine).get_columns("inbox")}
    assert "device_tag" in columns and inspect(engine).has_table("shuffled_batches")
    ledger = Ledger(engine, SECRET)
    assert ledger.policies.get("held").min_batch_devices == 1  # the default: as before
    assert _count(engine, "SELECT COUNT(*) FROM inbox WHERE device_tag IS NULL") == 1
    engine.dispose()


@pytest.mark.parametrize("value", [0, -1, 1.5, "5"])
def test_min_batch_devices_is_validated(value: object) -> None:
    with pytest.raises(ValueError, match="min_batch_devices"):
        PolicyCreate.model_validate({**_policy("x", 1).model_dump(), "min_batch_devices": value})


def test_reports_stored_before_batch_parts_are_folded_once_after_the_upgrade(
    empty_url: str,
) -> None:
    """Revision 0006 turns the reports a database holds into batches: folded ones stay folded."""
    engine = create_db_engine(empty_url)
    with writer(engine).begin() as conn:
        command.upgrade(alembic_config(conn), "0005")  # the layout of the release before
    policy = _policy("legacy", 1)
    mech = mechanism_for(policy)
    params, day = mech.fingerprint.params, utc_day(NOW)
    bodies = mech.privatize(["a", "b", "c"] * 10, rng=np.random.default_rng(5)).to_dicts()
    payloads = [orjson.dumps(b).decode() for b in bodies]
    folded: Any = mech.sketch()
    folded.add(mech.decode(payloads[:10]))
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO reports (id, use_case, params, day, payload, folded)"
                " VALUES (:id, 'legacy', :params, :day, :payload, :folded)"
            ),
            [
                {"id": f"r{i}", "params": params, "day": day, "payload": p, "folded": i < 10}
                for i, p in enumerate(payloads)
            ],
        )
        conn.execute(
            text(
                "INSERT INTO sketches (use_case, params, day, n, state)"
                " VALUES ('legacy', :params, :day, 10, :state)"
            ),
            {"params": params, "day": day, "state": sketch_to_bytes(folded)},
        )
    init_db(engine)
    ledger = Ledger(engine, SECRET)
    ledger.policies.create(policy)
    with engine.connect() as conn:
        parts = conn.execute(text("SELECT reports, folded FROM batch_parts ORDER BY reports"))
        assert [(int(n), bool(f)) for n, f in parts] == [(10, True), (20, False)]
    assert aggregate(ledger).reports == 20
    assert aggregate(ledger).reports == 0
    everything: Any = mech.sketch()
    everything.add(mech.decode(payloads))
    with engine.connect() as conn:
        state = conn.execute(text("SELECT state FROM sketches")).scalar_one()
    assert sketch_digest(sketch_from_bytes(mech, state)) == sketch_digest(everything)
    engine.dispose()

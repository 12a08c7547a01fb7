"""The migrations: a ledger made by release 0.1 upgrades losing nothing; the models never drift.

The previous release is the code of commit ``ed8e891`` (release 0.1, before migrations), taken
from this repository's history with ``git archive`` and run in a subprocess: it creates the
database its own way, applies a policy change, charges devices over two days (accepted and
refused, with idempotency keys), buffers reports in the pipeline's inbox and signs checkpoints.
The test then upgrades that database with this release and compares every table row by row.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, inspect, text
from sqlmodel import SQLModel

import dp_governor.pipeline.tables  # noqa: F401 - registers the pipeline tables the migrations create too
from dp_governor.budget import Ledger, create_db_engine, init_db
from dp_governor.budget.storage.schema import (
    SchemaOutdated,
    head_revision,
    schema_revision,
    upgrade_db,
)
from tests.conftest import SECRET

ROOT = Path(__file__).resolve().parents[3]
PREVIOUS = "ed8e891"
AUDIT_KEY = bytes(range(32))
NOW = datetime(2026, 11, 23, 12, tzinfo=UTC)

# Run under the previous release's code: its own schema creation, policies, gate, audit log.
MAKE_PREVIOUS = """
import sys
from datetime import datetime, timedelta, UTC
from sqlalchemy import text
from api.app import init_service_db
from budget import Ledger, create_db_engine
from policies import PolicyUpdate

url, secret, audit_key = sys.argv[1], bytes.fromhex(sys.argv[2]), bytes.fromhex(sys.argv[3])
now = datetime.fromisoformat(sys.argv[4])
engine = create_db_engine(url)
init_service_db(engine)
ledger = Ledger(engine, secret, audit_key=audit_key)
ledger.policies.ensure_defaults()
ledger.policies.update("emoji", PolicyUpdate(lifetime_epsilon_cap=40.0), actor="reviewer")
for day, at in enumerate((now - timedelta(days=1), now)):
    for i in range(6):
        for use_case in ("emoji", "safari-energy-domains", "safari-crash-domains"):
            key = f"k-{day}-{i}-{use_case}"
            ledger.charge(f"device-{i % 4}", use_case, now=at, idempotency_key=key)
    ledger.audit.checkpoint(now=at)
with engine.begin() as conn:
    conn.execute(
        text("INSERT INTO inbox (id, use_case, params, day, payload)"
             " VALUES (7, 'emoji', 'p', 1, 'x')")
    )
engine.dispose()
"""

TABLES = [
    "accounts",
    "charges",
    "idempotency",
    "retention_horizons",
    "audit_log",
    "audit_head",
    "audit_checkpoints",
    "policies",
    "inbox",
    "reports",
    "sketches",
    "job_leases",
]

# Columns a later revision replaced: 0006 folds whole batch parts (``batch_parts.folded``).
REMOVED = {"reports": ("folded",)}


def _previous_release_ledger(url: str, tmp_path: Path) -> None:
    """Create a ledger at ``url`` with the previous release's code (``git archive``)."""
    known = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{PREVIOUS}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if known.returncode != 0:
        pytest.skip(f"this clone's history does not hold {PREVIOUS} (a shallow clone)")
    source = tmp_path / PREVIOUS
    archive = subprocess.run(
        [
            "git",
            "-C",
            str(ROOT),
            "archive",
            "--format=tar",
            PREVIOUS,
            "api",
            "budget",
            "mechanisms",
            "policies",
        ],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(source, filter="data")
    subprocess.run(
        [sys.executable, "-c", MAKE_PREVIOUS, url, SECRET.hex(), AUDIT_KEY.hex(), NOW.isoformat()],
        cwd=source,
        env={"PYTHONPATH": str(source), "PATH": "/usr/bin:/bin"},
        check=True,
        capture_output=True,
    )


def _snapshot(
    engine: Engine, columns: dict[str, list[str]] | None = None
) -> tuple[dict[str, list[tuple[object, ...]]], dict[str, list[str]]]:
    """Every row of every table, sorted, as plain tuples of ``columns`` (default: all of them).

    Columns a later revision adds are left out by passing the columns found before it.
    """
    found = columns or {t: [c["name"] for c in inspect(engine).get_columns(t)] for t in TABLES}
    with engine.connect() as conn:
        rows = {
            table: sorted(
                (
                    tuple(row)
                    for row in conn.execute(text(f"SELECT {', '.join(cols)} FROM {table}"))
                ),
                key=repr,
            )
            for table, cols in found.items()
        }
    return rows, found


def _drift(engine: Engine) -> list[object]:
    """What autogenerate would change to make the database match the models (``[]``: nothing)."""

    def include(obj: object, name: str | None, kind: str, reflected: bool, _: object) -> bool:
        # PostgreSQL's day partitions of charges are made at run time, not by the models
        return not (kind == "table" and name is not None and name.startswith("charges_d"))

    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "include_object": include}
        )
        return list(compare_metadata(context, SQLModel.metadata))


def test_a_ledger_of_the_previous_release_upgrades_losing_nothing(
    empty_url: str, tmp_path: Path
) -> None:
    url = empty_url
    _previous_release_ledger(url, tmp_path)
    engine = create_db_engine(url)
    try:
        found = _snapshot(engine)[1]
        columns = {t: [c for c in cols if c not in REMOVED.get(t, ())] for t, cols in found.items()}
        before = _snapshot(engine, columns)[0]
        with engine.connect() as conn:
            assert schema_revision(conn) is None  # made before migrations
        with pytest.raises(SchemaOutdated, match="dpgov db upgrade"):
            upgrade_db(engine, existing=False)  # what `serve` on PostgreSQL does
        init_db(engine)
        assert _snapshot(engine, columns)[0] == before
        with engine.connect() as conn:
            assert schema_revision(conn) == head_revision()
        assert len(before["charges"]) > 0 and len(before["audit_checkpoints"]) == 2
        ledger = Ledger(engine, SECRET, audit_key=AUDIT_KEY)
        verdict, state = ledger.verify(kept=ledger.audit.checkpoints())
        assert verdict.ok and state.checked, (verdict, state)
        assert [p.version for p in ledger.policies.versions("emoji")] == [1, 2]
        assert ledger.policies.get("emoji").lifetime_epsilon_cap == 40.0
        dk, today = ledger.device_key("device-0"), NOW.timestamp() // 86_400
        held = [c for c in before["charges"] if c[1] == dk and c[2] == "emoji" and c[6] == today]
        emoji = {s.use_case: s for s in ledger.status("device-0", now=NOW)}["emoji"]
        assert emoji.reports_today == len(held) > 0
        assert ledger.charge("device-new", "emoji", now=NOW).accepted
        assert ledger.verify()[0].ok
        assert _drift(engine) == []
    finally:
        engine.dispose()


def test_the_migrations_make_exactly_the_models_schema(empty_url: str) -> None:
    engine = create_db_engine(empty_url)
    try:
        init_db(engine)
        init_db(engine)  # at head: nothing to run
        assert _drift(engine) == []
        tables = set(inspect(engine).get_table_names())
        assert set(TABLES) | {"dpgov_meta", "alembic_version", "shuffled_batches"} <= tables
        with engine.connect() as conn:
            head = conn.execute(text("SELECT seq, hash FROM audit_head")).one()
        assert head == (0, "0" * 64)
    finally:
        engine.dispose()


def test_the_migration_history_is_one_line() -> None:
    from alembic.script import ScriptDirectory

    from dp_governor.budget.storage.schema import alembic_config

    script = ScriptDirectory.from_config(alembic_config())
    revisions = [r.revision for r in script.walk_revisions()]
    assert revisions[-1] == "0001" and script.get_heads() == [revisions[0]]


def test_revision_0005_keeps_the_device_wide_lifetime_filter(empty_url: str) -> None:
    from alembic import command

    from dp_governor.budget.storage.db import writer
    from dp_governor.budget.storage.schema import alembic_config
    from dp_governor.policies.device import device_budget_versions

    engine = create_db_engine(empty_url)
    try:
        with writer(engine).begin() as conn:
            command.upgrade(alembic_config(conn), "0004")
            conn.execute(
                text(
                    "INSERT INTO device_budgets (version, lifetime_epsilon, filter_epsilon,"
                    " filter_delta, quotas, created_at, actor)"
                    " VALUES (1, 50.0, 8.0, 1e-9, '{}', :at, 'admin')"
                ),
                {"at": NOW},
            )
        init_db(engine)
        with engine.connect() as conn:
            (kept,) = device_budget_versions(conn)
        assert (kept.lifetime_epsilon, kept.lifetime_filter_epsilon) == (50.0, 8.0)
        assert (kept.lifetime_filter_delta, kept.window_filter_epsilon) == (1e-9, None)
        assert _drift(engine) == []
    finally:
        engine.dispose()


def test_revision_0009_marks_batches_published_in_parts(empty_url: str) -> None:
    """Batches that may have had several parts are marked; parts count their charge days."""
    from alembic import command

    from dp_governor.budget.storage.db import writer
    from dp_governor.budget.storage.schema import alembic_config
    from dp_governor.policies import PolicyCreate, PolicyUpdate

    engine = create_db_engine(empty_url)
    day = int(NOW.timestamp() // 86_400)
    try:
        with writer(engine).begin() as conn:
            command.upgrade(alembic_config(conn), "0006")  # the layout of the release before
        ledger = Ledger(engine, SECRET)
        fields = {"mechanism": "cms", "k": 16, "m": 64, "epsilon_per_report": 1.0}
        for name in ("changed", "steady"):
            ledger.policies.create(
                PolicyCreate.model_validate(
                    {"name": name, "max_reports_per_day": 2, "retention_days": 30, **fields}
                )
            )
        ledger.policies.update("changed", PolicyUpdate(epsilon_per_report=2.0), allow_loosen=True)
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE policies SET created_at = :at WHERE version = 2"),
                {"at": NOW.replace(tzinfo=None) - timedelta(days=4)},
            )
            batches = [  # use case, published, first and last charge day: split?
                ("steady", day, day, day),  # one day, no version made: one part
                ("steady", day, day - 1, day),  # two days: two parts
                ("changed", day - 4, day - 5, day - 5),  # a version made meanwhile
                ("changed", day, day, day),  # after it: one part
            ]
            for use_case, published, first, last in batches:
                conn.execute(
                    text(
                        "INSERT INTO shuffled_batches (use_case, day, first_day, last_day,"
                        " devices, reports, max_per_device, layers, untagged, epsilon_micro,"
                        " min_batch_devices) VALUES (:u, :d, :f, :l, 20, 20, 1, '[20]', 0,"
                        " 1000000, 5)"
                    ),
                    {"u": use_case, "d": published, "f": first, "l": last},
                )
            conn.execute(
                text(
                    "INSERT INTO batch_parts (batch, params, day, use_case, reports, folded)"
                    " VALUES (9, 'p', :d, 'steady', 20, false)"
                ),
                {"d": day},
            )
            conn.execute(
                text(
                    "INSERT INTO inbox (id, use_case, params, day, payload, device_tag)"
                    " VALUES (7, 'steady', 'p', :d, '{}', 3)"
                ),
                {"d": day},
            )
        init_db(engine)
        with engine.connect() as conn:
            split = conn.execute(text("SELECT split FROM shuffled_batches ORDER BY id")).all()
            days = conn.execute(text("SELECT charge_days FROM batch_parts")).scalar_one()
            inbox = conn.execute(text("SELECT payload, device_tag, sealed FROM inbox")).one()
        assert [bool(s) for (s,) in split] == [False, True, True, False]
        assert days == f'{{"{day}":20}}'
        assert tuple(inbox) == ("{}", 3, None)  # queued in the clear: sealed by the next flush
        assert _drift(engine) == []
    finally:
        engine.dispose()

"""The ledger's tables. Devices appear only as ``device_key``, a keyed HMAC of the device id.

- ``charges``: one row per accepted report (device key, use case, budget, policy version,
  micro-epsilon, UTC day, idempotency key), the record a receipt and an audit entry name and
  the export carries; purged after the retention window. Appended only: nothing on the gate's
  path reads it, and the window accounting reads the accounts.
- ``accounts``: per device key one row with everything the gate decides on: the lifetime
  count and micro-epsilon, the spend of each day still held, and the lifetime multiset per (use
  case, epsilon, group size, budget) slot (packed, :mod:`dp_governor.budget.rule.state`). Which
  slots a budget's caps count is decided by the policies in force
  (:mod:`dp_governor.budget.rule.book`), so no policy edit rewrites a row. Its row lock serializes
  every charge of one device; the lifetime part has no timestamps and survives the purge, which
  prunes only the days.
- ``retention_horizons``: per use case, the last day the purge deleted; nothing on or before
  it is held anywhere again.
- ``slot_budgets``: the audit log's last entry when slots began to record their budget (0 for
  a ledger that always did); the state check replays earlier charges into budget-less slots.
- ``idempotency``: the first decision for each (device key, idempotency key).
- ``audit_log``, ``audit_head``, ``audit_checkpoints``: the hash-chained audit log
  (:mod:`dp_governor.budget.audit.log`), its head (one row, starting at :data:`GENESIS`) and its
  signed checkpoints. The log and the checkpoints are append-only: triggers refuse UPDATE and DELETE
  (and TRUNCATE on PostgreSQL).
- ``report_summaries``: the effective-epsilon report's histograms as of a day and a charge
  watermark, brought up to date by what changed since (:mod:`dp_governor.budget.reporting.summary`).
- ``audit_verifications``: every verdict of ``verify``, tagged with the audit key; an accepted
  one carries the signed checkpoint it reached and the replayed state there, where the next
  incremental verification starts (:mod:`dp_governor.budget.audit.verdicts`).
- ``audit_archives``: each archive of old audit entries (:mod:`dp_governor.budget.audit.archive`):
  its boundary entry's chain head, the file's SHA-256 and the replay state there; append-only.
  ``audit_log`` rows strictly below the newest boundary are the only ones a DELETE may remove.
- ``tlog_leaves``, ``tlog_tiles``, ``tlog_checkpoints``: the public transparency log
  (:mod:`dp_governor.budget.audit.tlog`): leaf ``i`` is audit entry ``i + 1`` projected, the
  tiles its tree's C2SP tiles (256 subtree hashes a row), the checkpoints its signed notes;
  append-only too (a partial tile may only grow: its hashes kept, new ones after them).
- ``tlog_cosignatures``: the cosignature line each configured witness returned for a checkpoint
  (``dp_governor.api._witnessing``), served with it; append-only too.
- ``shuffled_batches``: each batch the inbox flush published, by its sizes only
  (:mod:`dp_governor.budget.reporting.central`); ``split`` marks batches published before revision
  0009, in parts whose devices were not counted.
- ``dashboard_snapshots``: the latest of each precomputed public figure set (the dashboard's
  figures, the last scheduled verification) as JSON, so no request computes them
  (``dp_governor.api._snapshots``); one row per name, replaced by each job run.

The policy tables live with the policies (:mod:`dp_governor.policies.model`,
:mod:`dp_governor.policies.device`) and the pipeline's with the pipeline
(``dp_governor.pipeline.tables``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    DDL,
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    event,
    text,
)
from sqlmodel import Field, SQLModel

__all__ = [
    "CLAIM_LEAF_PREDICATE",
    "GENESIS",
    "Account",
    "AuditArchive",
    "AuditCheckpoint",
    "AuditEntry",
    "AuditHead",
    "AuditVerification",
    "Charge",
    "DashboardSnapshot",
    "IdempotencyRecord",
    "ReportSummary",
    "RetentionHorizon",
    "ShuffledBatch",
    "SlotBudgets",
    "TlogCheckpoint",
    "TlogCosignature",
    "TlogLeaf",
    "TlogTile",
]

CLAIM_LEAF_PREDICATE = """data LIKE '{"actor":"job\\:claims",%'"""
"""A claim's leaf (keys sorted: its actor first), as the partial index and its reader write it."""

GENESIS = "0" * 64
"""The audit chain's hash before its first entry (and the first checkpoint's previous signature)."""


class Charge(SQLModel, table=True):
    """One accepted report's privacy charge."""

    __tablename__ = "charges"
    __table_args__ = (
        # in insertion order (days only grow), so appending costs no random page: the purge's
        # range. Nothing reads charges by device: the accounts hold each device's days.
        Index("ix_charges_day", "day"),
        # the purge's pages: one use case's charges up to its horizon, in key order
        Index("ix_charges_use_case_day", "use_case", "day", "id"),
        # SQLite: ids come from sqlite_sequence, never max(id) + 1, so that a purge that empties
        # the table cannot hand out an id that a receipt or an audit entry already names
        {"sqlite_autoincrement": True},
    )

    id: int | None = Field(
        default=None,
        sa_column=Column(
            BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
        ),
    )
    device_key: str = Field(max_length=64)
    use_case: str = Field(max_length=63)
    budget: str = Field(max_length=63)
    policy_version: int
    epsilon_micro: int = Field(sa_column=Column(BigInteger, nullable=False))
    day: int
    idempotency_key: str | None = Field(default=None, max_length=255)


class Account(SQLModel, table=True):
    """One device's state (:mod:`budget.rule.state`), the serialization point of its charges."""

    __tablename__ = "accounts"
    __table_args__ = ({"sqlite_with_rowid": False},)

    device_key: str = Field(primary_key=True, max_length=64)
    count: int = Field(sa_column=Column(BigInteger, nullable=False))
    epsilon_micro: int = Field(sa_column=Column(BigInteger, nullable=False))
    days: str = Field(default="[]", sa_column=Column(Text, nullable=False))
    lifetime: str = Field(default="[]", sa_column=Column(Text, nullable=False))
    oldest_day: int | None = Field(default=None, nullable=True)


class IdempotencyRecord(SQLModel, table=True):
    """The first decision for an idempotency key, replayed on retries."""

    __tablename__ = "idempotency"
    __table_args__ = (
        # the purge's pages: records past the retry window, in key order
        Index("ix_idempotency_day_key", "day", "device_key", "key"),
        {"sqlite_with_rowid": False},
    )

    device_key: str = Field(primary_key=True, max_length=64)
    key: str = Field(primary_key=True, max_length=255)
    request_hash: str = Field(max_length=64)
    day: int
    decision: str = Field(sa_column=Column(Text, nullable=False))
    use_case: str = Field(sa_column=Column(String(63), nullable=False))


class RetentionHorizon(SQLModel, table=True):
    """The last day the retention purge deleted for a use case (it only ever rises)."""

    __tablename__ = "retention_horizons"

    use_case: str = Field(primary_key=True, max_length=63)
    through_day: int


class SlotBudgets(SQLModel, table=True):
    """One row: the audit sequence number after which every charge's slot records its budget."""

    __tablename__ = "slot_budgets"

    since_seq: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))


class AuditEntry(SQLModel, table=True):
    """One appended audit entry (:mod:`dp_governor.budget.audit.log`); never updated or deleted."""

    __tablename__ = "audit_log"
    __table_args__ = (
        # the privacy claims alone (revision 0014): a report's entry adds no index entry
        Index(
            "ix_audit_log_claims",
            "at",
            "seq",
            sqlite_where=text("action = 'claim.day'"),
            postgresql_where=text("action = 'claim.day'"),
        ),
    )

    seq: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    at: str = Field(max_length=40, description="UTC time, ISO 8601 with microseconds.")
    actor: str = Field(max_length=120)
    action: str = Field(max_length=40)
    body: str = Field(sa_column=Column(Text, nullable=False))
    prev_hash: str = Field(max_length=64)
    hash: str = Field(max_length=64)
    tag: str = Field(max_length=64)


class AuditHead(SQLModel, table=True):
    """The chain's head, one row: appends lock it, so they serialize into one chain."""

    __tablename__ = "audit_head"

    id: int = Field(primary_key=True)
    seq: int = Field(sa_column=Column(BigInteger, nullable=False))
    hash: str = Field(max_length=64)


class AuditCheckpoint(SQLModel, table=True):
    """A signed ``(seq, hash)`` of the head at some time."""

    __tablename__ = "audit_checkpoints"

    seq: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    hash: str = Field(max_length=64)
    at: str = Field(max_length=40)
    signature: str = Field(max_length=64)


class TlogLeaf(SQLModel, table=True):
    """One leaf of the transparency log: the public projection of one audit entry."""

    __tablename__ = "tlog_leaves"
    __table_args__ = (
        # the claims' leaves alone (revision 0016): a claim the audit log archived is read here
        Index(
            "ix_tlog_leaves_claims",
            "idx",
            sqlite_where=text(CLAIM_LEAF_PREDICATE),
            postgresql_where=text(CLAIM_LEAF_PREDICATE),
        ),
    )

    idx: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    label: str | None = Field(
        default=None, max_length=32, index=True, description="A device's label for the day."
    )
    data: str = Field(sa_column=Column(Text, nullable=False))


class TlogTile(SQLModel, table=True):
    """A C2SP tile: the hashes of up to 256 consecutive subtrees of ``256**level`` leaves.

    Tile ``idx`` at ``level`` holds the subtrees from ``idx * 256``, 32 bytes each; a full tile
    is written once, a partial one grows as the log does (revision 0018).
    """

    __tablename__ = "tlog_tiles"

    level: int = Field(sa_column=Column(Integer, primary_key=True, autoincrement=False))
    idx: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    hashes: bytes = Field(sa_column=Column(LargeBinary, nullable=False))


class TlogCheckpoint(SQLModel, table=True):
    """A signed checkpoint (C2SP tlog-checkpoint note) of the transparency log."""

    __tablename__ = "tlog_checkpoints"

    size: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    root: str = Field(max_length=64)
    note: str = Field(sa_column=Column(Text, nullable=False))


class TlogCosignature(SQLModel, table=True):
    """A witness's C2SP tlog-cosignature line on the checkpoint of one size."""

    __tablename__ = "tlog_cosignatures"

    size: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    witness: str = Field(sa_column=Column(String(255), primary_key=True))
    line: str = Field(sa_column=Column(Text, nullable=False))


def _ddl(statement: str, dialect: str) -> Any:
    """A DDL statement run after its table is created, on one dialect only."""
    return DDL(statement).execute_if(dialect=dialect)  # type: ignore[no-untyped-call]


_LOG = AuditEntry.__table__  # type: ignore[attr-defined]
_HEAD = AuditHead.__table__  # type: ignore[attr-defined]
_CHECKPOINTS = AuditCheckpoint.__table__  # type: ignore[attr-defined]

for _table in (
    _LOG,
    _CHECKPOINTS,
    TlogLeaf.__table__,  # type: ignore[attr-defined]
    TlogCheckpoint.__table__,  # type: ignore[attr-defined]
    TlogCosignature.__table__,  # type: ignore[attr-defined]
):
    _name = _table.name
    for _op in ("UPDATE", "DELETE"):
        event.listen(
            _table,
            "after_create",
            _ddl(
                f"CREATE TRIGGER {_name}_no_{_op.lower()} BEFORE {_op} ON {_name}"
                f" BEGIN SELECT RAISE(ABORT, '{_name} is append-only: {_op} refused'); END",
                "sqlite",
            ),
        )
    for _statement in (
        "CREATE OR REPLACE FUNCTION dpgov_append_only() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN RAISE EXCEPTION '%% is append-only: %% refused', TG_TABLE_NAME, TG_OP; END $$",
        f"CREATE TRIGGER {_name}_append_only BEFORE UPDATE OR DELETE ON {_name}"
        " FOR EACH ROW EXECUTE FUNCTION dpgov_append_only()",
        f"CREATE TRIGGER {_name}_no_truncate BEFORE TRUNCATE ON {_name}"
        " FOR EACH STATEMENT EXECUTE FUNCTION dpgov_append_only()",
    ):
        event.listen(_table, "after_create", _ddl(_statement, "postgresql"))
_TILE_GROWS = (
    "NEW.level = OLD.level AND NEW.idx = OLD.idx AND length(OLD.hashes) < 8192"
    " AND length(NEW.hashes) > length(OLD.hashes)"
    " AND substr(NEW.hashes, 1, length(OLD.hashes)) = OLD.hashes"
)
"""The one change a tile may take: a partial tile grows, every hash it held kept (both dialects)."""

_TILES = TlogTile.__table__  # type: ignore[attr-defined]
for _statement, _dialect in (
    (
        "CREATE TRIGGER tlog_tiles_no_update BEFORE UPDATE ON tlog_tiles"
        f" WHEN NOT ({_TILE_GROWS}) BEGIN SELECT RAISE(ABORT,"
        " 'tlog_tiles is append-only: UPDATE refused (a partial tile may only grow)'); END",
        "sqlite",
    ),
    (
        "CREATE TRIGGER tlog_tiles_no_delete BEFORE DELETE ON tlog_tiles"
        " BEGIN SELECT RAISE(ABORT, 'tlog_tiles is append-only: DELETE refused'); END",
        "sqlite",
    ),
    (
        "CREATE OR REPLACE FUNCTION dpgov_tile_grows() RETURNS trigger LANGUAGE plpgsql AS $$"
        f" BEGIN IF TG_OP = 'UPDATE' AND {_TILE_GROWS} THEN RETURN NEW; END IF;"
        " RAISE EXCEPTION '%% is append-only: %% refused (a partial tile may only grow)',"
        " TG_TABLE_NAME, TG_OP; END $$",
        "postgresql",
    ),
    (
        "CREATE TRIGGER tlog_tiles_append_only BEFORE UPDATE OR DELETE ON tlog_tiles"
        " FOR EACH ROW EXECUTE FUNCTION dpgov_tile_grows()",
        "postgresql",
    ),
    (
        "CREATE OR REPLACE FUNCTION dpgov_append_only() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN RAISE EXCEPTION '%% is append-only: %% refused', TG_TABLE_NAME, TG_OP; END $$",
        "postgresql",
    ),
    (
        "CREATE TRIGGER tlog_tiles_no_truncate BEFORE TRUNCATE ON tlog_tiles"
        " FOR EACH STATEMENT EXECUTE FUNCTION dpgov_append_only()",
        "postgresql",
    ),
):
    event.listen(_TILES, "after_create", _ddl(_statement, _dialect))
for _dialect in ("sqlite", "postgresql"):
    event.listen(
        _HEAD,
        "after_create",
        _ddl(f"INSERT INTO audit_head (id, seq, hash) VALUES (1, 0, '{GENESIS}')", _dialect),
    )


class ShuffledBatch(SQLModel, table=True):
    """One published shuffled batch: sizes and local epsilon only, nothing about any device."""

    __tablename__ = "shuffled_batches"
    __table_args__ = (Index("ix_shuffled_batches_use_case_day", "use_case", "day"),)

    id: int | None = Field(
        default=None,
        sa_column=Column(
            BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
        ),
    )
    use_case: str = Field(max_length=63)
    day: int = Field(description="UTC day the batch was published.")
    first_day: int = Field(description="Earliest charge day of its reports.")
    last_day: int = Field(description="Latest charge day of its reports.")
    devices: int = Field(sa_column=Column(BigInteger, nullable=False))
    reports: int = Field(sa_column=Column(BigInteger, nullable=False))
    max_per_device: int
    layers: str = Field(sa_column=Column(Text, nullable=False))  # JSON: devices with >= i reports
    untagged: int = Field(default=0, description="Reports queued with no device pseudonym.")
    epsilon_micro: int = Field(sa_column=Column(BigInteger, nullable=False))
    min_batch_devices: int
    split: bool = Field(
        default=False,
        sa_column=Column(Boolean, nullable=False, default=False),
        description="Published before revision 0009 in parts (by charge day and parameters)"
        " that may have been smaller than the batch: what hid each report is not known.",
    )


class DashboardSnapshot(SQLModel, table=True):
    """The latest figures a job computed for the public pages, by name, as JSON."""

    __tablename__ = "dashboard_snapshots"

    name: str = Field(sa_column=Column(String(32), primary_key=True))
    token: str = Field(sa_column=Column(String(32), nullable=False))  # new for every row written
    computed_at: str = Field(sa_column=Column(String(40), nullable=False))
    seconds: float = Field(description="How long the job took to compute them.")
    body: str = Field(sa_column=Column(Text, nullable=False))


class ReportSummary(SQLModel, table=True):
    """The effective-epsilon report's per-device histograms as of a day and a charge watermark.

    ``name`` says which figures (``report``); ``book`` the policy versions they were computed
    under (a digest); ``through`` and ``applied`` the charges they count (every id up to
    ``through`` and the ids listed, JSON); ``horizons`` the retention horizons then (JSON);
    ``passes`` the window and lifetime histograms (JSON). One row per name, replaced whole
    (:mod:`dp_governor.budget.reporting.summary`).
    """

    __tablename__ = "report_summaries"

    name: str = Field(sa_column=Column(String(80), primary_key=True))
    book: str = Field(sa_column=Column(String(64), nullable=False))
    day: int = Field(sa_column=Column(Integer, nullable=False))
    through: int = Field(sa_column=Column(BigInteger, nullable=False))
    applied: str = Field(sa_column=Column(Text, nullable=False))
    horizons: str = Field(sa_column=Column(Text, nullable=False))
    passes: str = Field(sa_column=Column(Text, nullable=False))
    computed_at: str = Field(sa_column=Column(String(40), nullable=False))


class AuditVerification(SQLModel, table=True):
    """One verdict of ``verify``: where it started and, if accepted, where the next one starts.

    ``seq``, ``hash``, ``signed_at`` and ``signature`` are the signed checkpoint the verdict
    reached (``None`` when it failed or reached none); ``state`` is the replay there (JSON; kept
    by the newest accepted verdict only), ``state_sha256`` its digest; ``tag`` is the audit
    key's HMAC over every other column: an edited verdict is refused.
    """

    __tablename__ = "audit_verifications"

    id: int | None = Field(
        default=None,
        sa_column=Column(
            BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
        ),
    )
    at: str = Field(sa_column=Column(String(40), nullable=False))
    full: bool = Field(sa_column=Column(Boolean, nullable=False))
    ok: bool = Field(sa_column=Column(Boolean, nullable=False))
    from_seq: int = Field(sa_column=Column(BigInteger, nullable=False))
    seq: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True))
    hash: str | None = Field(default=None, sa_column=Column(String(64), nullable=True))
    signed_at: str | None = Field(default=None, sa_column=Column(String(40), nullable=True))
    signature: str | None = Field(default=None, sa_column=Column(String(64), nullable=True))
    problem: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    state: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    state_sha256: str | None = Field(default=None, sa_column=Column(String(64), nullable=True))
    tag: str = Field(sa_column=Column(String(64), nullable=False))


class AuditArchive(SQLModel, table=True):
    """One archive of audit entries ``[first_seq, boundary)``, written to ``file`` and deleted.

    ``boundary`` is a signed checkpoint's entry (kept), ``hash`` its chain head, ``signed_at``
    and ``signature`` the checkpoint's; ``prev_hash`` is the head before ``first_seq``,
    ``last_hash`` the archived last entry's; ``claimed_through`` the newest day the archived
    entries claimed; ``state`` the verified replay at the boundary; ``tag`` the audit key's
    HMAC over every other column. Never updated or deleted (triggers).
    """

    __tablename__ = "audit_archives"

    boundary: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    hash: str = Field(sa_column=Column(String(64), nullable=False))
    first_seq: int = Field(sa_column=Column(BigInteger, nullable=False))
    prev_hash: str = Field(sa_column=Column(String(64), nullable=False))
    last_hash: str = Field(sa_column=Column(String(64), nullable=False))
    file: str = Field(sa_column=Column(Text, nullable=False))
    sha256: str = Field(sa_column=Column(String(64), nullable=False))
    signed_at: str = Field(sa_column=Column(String(40), nullable=False))
    signature: str = Field(sa_column=Column(String(64), nullable=False))
    claimed_through: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    state: str = Field(sa_column=Column(Text, nullable=False))
    at: str = Field(sa_column=Column(String(40), nullable=False))
    tag: str = Field(sa_column=Column(String(64), nullable=False))

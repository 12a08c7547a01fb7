"""The private pipeline's tables: inbox, moves, report store, batch parts, sketches, leases.

Trust boundary: none of these has a device column, a timestamp finer than the UTC day, or a
key shared with the ledger. The inbox row is written in the charge's transaction (so there is
never a charge without its report) under a random id (a sequential one would pair with the
charge's id), and its report and per-use-case device pseudonym are sealed to the shuffler key,
which the database does not hold (:mod:`dp_governor.pipeline.seal`): a copy of the database
pairs a charge with ciphertext only. The ``flush-inbox`` job opens them, counts distinct devices,
and moves a use case's inbox rows of one parameter set to ``reports`` as one CSPRNG-shuffled batch
with random ids once enough are pending, all stored under one day (the batch's first charge
day), so storage order, ids and days are unlinked from submission. A batch is moved in short
transactions and published by the one that moves its last report (``inbox_moves``, its plan in
``inbox_orders``); the fold adds whole published batches to the sketches (``batch_parts``).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Column, Index, Integer, LargeBinary, Table, Text
from sqlmodel import Field, SQLModel

from dp_governor.budget.storage.tables import ShuffledBatch

__all__ = [
    "BATCHES",
    "INBOX",
    "MOVES",
    "ORDERS",
    "PARTS",
    "REPORTS",
    "SKETCHES",
    "STEP_ROWS",
    "BatchPart",
    "InboxMove",
    "InboxOrder",
    "InboxRow",
    "JobLease",
    "SketchRow",
    "StoredReport",
]

STEP_ROWS = 500  # rows one job transaction writes at most (milliseconds on SQLite)


class InboxRow(SQLModel, table=True):
    """A report accepted by the gate, waiting to be shuffled into the store.

    ``id`` is a random 63-bit integer the writer draws (``secrets.randbits(63)``); on SQLite
    it is the rowid, so the table's own order is random too. ``sealed`` holds the report and
    device pseudonym (:class:`dp_governor.pipeline.seal.InboxSeal`); rows queued before sealing
    hold them in ``payload`` and ``device_tag`` instead, until the next flush seals them.
    """

    __tablename__ = "inbox"
    # No secondary index: every report writes a row here, and the inbox holds minutes of
    # reports (the flush empties it), so the rare purge of a use case's expired rows reads it
    # whole rather than every report paying one more B-tree insert.

    id: int = Field(
        sa_column=Column(
            BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=False
        ),
    )
    use_case: str = Field(max_length=63)
    params: str = Field(max_length=64, description="Hash of the mechanism's parameters.")
    day: int
    payload: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    device_tag: int | None = Field(
        default=None,
        sa_column=Column(BigInteger, nullable=True),
        description="Keyed 64-bit device pseudonym for this use case (rows not sealed).",
    )
    sealed: bytes | None = Field(
        default=None,
        sa_column=Column(LargeBinary, nullable=True),
        description="The report and device pseudonym, sealed to the shuffler key.",
    )
    tag: str | None = Field(
        default=None,
        max_length=64,
        description="Keyed tag over the stored bytes (budget.audit.row_tags); verify checks it.",
    )


class InboxMove(SQLModel, table=True):
    """A use case's batch being moved out of the inbox, if any, and a count of the inbox's moves.

    ``generation`` rises whenever a batch is planned or the purge deletes inbox rows, so a
    flush that read the inbox before either plans again. While ``batch`` is set, ``moved``
    counts its reports moved so far, and its :class:`InboxOrder` row holds the order; the
    transaction that moves the last of them publishes the batch and clears both. This row is
    small on purpose: every step of the move updates it.
    """

    __tablename__ = "inbox_moves"

    use_case: str = Field(primary_key=True, max_length=63)
    generation: int = Field(sa_column=Column(BigInteger, nullable=False))
    batch: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True))
    moved: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))


class InboxOrder(SQLModel, table=True):
    """A claimed batch's plan, written once by its claim and deleted when it is published.

    ``manifest`` lists the batch's inbox ids in their shuffled order (int64) and ``record`` its
    figures (JSON), so a flush that stops half way is finished by the next, and the order
    stored outlives no move. Apart from :class:`InboxMove`, which each step updates: a
    database rewrites a whole row on update, and the manifest is 8 bytes a report.
    """

    __tablename__ = "inbox_orders"

    batch: int = Field(
        sa_column=Column(BigInteger, primary_key=True, autoincrement=False, nullable=False)
    )
    manifest: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    record: str = Field(sa_column=Column(Text, nullable=False))


class StoredReport(SQLModel, table=True):
    """A report in the store: random id, use case, day, payload, the batch it was moved in.

    ``batch`` is a random 63-bit number shared by the reports of one shuffled batch (which the
    order they were stored in reveals anyway), and nothing that links a device. A batch's
    reports are visible to the fold, the export and the purge only through its
    :class:`BatchPart` rows, written when the batch is published.
    """

    __tablename__ = "reports"
    __table_args__ = (Index("ix_reports_part", "batch", "params", "day", "id"),)

    id: str = Field(primary_key=True, max_length=32)
    use_case: str = Field(max_length=63)
    params: str = Field(max_length=64)
    day: int
    payload: str = Field(sa_column=Column(Text, nullable=False))
    batch: int = Field(sa_column=Column(BigInteger, nullable=False))
    tag: str | None = Field(
        default=None,
        max_length=64,
        description="Keyed tag over the stored bytes (budget.audit.row_tags); verify checks it.",
    )


class BatchPart(SQLModel, table=True):
    """A published batch's reports of one parameter set and day: what the fold adds at once.

    A batch holds one parameter set and its reports are stored under one day, its first charge
    day, so it has one part (batches published before revision 0009 have one per charge day).
    ``charge_days`` counts its reports per charge day (JSON ``{"day": reports}``), which the
    service's verification compares with the charges; it says no more than the charges cut at
    the batch's size do, and nothing about any one report.
    """

    __tablename__ = "batch_parts"
    __table_args__ = (
        Index("ix_batch_parts_folded", "folded"),
        Index("ix_batch_parts_use_case_day", "use_case", "day"),
    )

    batch: int = Field(
        sa_column=Column(BigInteger, primary_key=True, autoincrement=False, nullable=False)
    )
    params: str = Field(primary_key=True, max_length=64)
    day: int = Field(primary_key=True)
    use_case: str = Field(max_length=63)
    reports: int = Field(sa_column=Column(BigInteger, nullable=False))
    folded: bool = Field(sa_column=Column(Boolean, nullable=False))
    charge_days: str = Field(sa_column=Column(Text, nullable=False))


class SketchRow(SQLModel, table=True):
    """The additive sketch of one use case's reports on one day, for one parameter set."""

    __tablename__ = "sketches"

    use_case: str = Field(primary_key=True, max_length=63)
    params: str = Field(primary_key=True, max_length=64)
    day: int = Field(primary_key=True)
    n: int = Field(sa_column=Column(BigInteger, nullable=False))
    state: bytes = Field(sa_column=Column(LargeBinary, nullable=False))


class JobLease(SQLModel, table=True):
    """Which process may run a scheduled job until when (so N workers run it once).

    ``token`` is the fencing token: it rises whenever another holder takes the lease (or an
    operator forces it), and every write transaction of the running job checks it
    (``dp_governor.api.jobs``), so a holder that stalled past its lease writes nothing after a
    takeover.
    """

    __tablename__ = "job_leases"

    job: str = Field(primary_key=True, max_length=60)
    holder: str = Field(max_length=64)
    until: float
    token: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))


# The tables as SQLAlchemy Core, for the jobs' statements (one name each, shared by every job).
INBOX: Table = InboxRow.__table__  # type: ignore[attr-defined]
MOVES: Table = InboxMove.__table__  # type: ignore[attr-defined]
ORDERS: Table = InboxOrder.__table__  # type: ignore[attr-defined]
REPORTS: Table = StoredReport.__table__  # type: ignore[attr-defined]
PARTS: Table = BatchPart.__table__  # type: ignore[attr-defined]
SKETCHES: Table = SketchRow.__table__  # type: ignore[attr-defined]
BATCHES: Table = ShuffledBatch.__table__  # type: ignore[attr-defined]

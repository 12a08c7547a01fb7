"""The private ingestion pipeline's tables: inbox, report store, sketches, job leases.

Trust boundary: none of these has a device column, a timestamp finer than the UTC day, or a
key shared with the ledger; the inbox alone holds a per-use-case device pseudonym under a key of
its own (so the flush can count distinct devices), which the flush drops. The inbox row is
written in the charge's transaction (so there is never a charge without its report) under a
random id (a sequential one would pair with the charge's id); the ``flush-inbox`` job moves a
use case's inbox rows to ``reports`` as one CSPRNG-shuffled batch with random ids once enough
are pending, so storage order and ids are unlinked from submission.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, Integer, LargeBinary, Text
from sqlmodel import Field, SQLModel

__all__ = ["InboxRow", "JobLease", "SketchRow", "StoredReport"]


class InboxRow(SQLModel, table=True):
    """A report accepted by the gate, waiting to be shuffled into the store.

    ``id`` is a random 63-bit integer the writer draws (``secrets.randbits(63)``); on SQLite
    it is the rowid, so the table's own order is random too.
    """

    __tablename__ = "inbox"

    id: int = Field(
        sa_column=Column(
            BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=False
        ),
    )
    use_case: str = Field(max_length=63)
    params: str = Field(max_length=64, description="Hash of the mechanism's parameters.")
    day: int
    payload: str = Field(sa_column=Column(Text, nullable=False))
    device_tag: int | None = Field(
        default=None,
        sa_column=Column(BigInteger, nullable=True),
        description="Keyed 64-bit device pseudonym for this use case.",
    )


class StoredReport(SQLModel, table=True):
    """A report in the store: random id, use case, day, payload; nothing that links a device."""

    __tablename__ = "reports"
    __table_args__ = (Index("ix_reports_fold", "use_case", "params", "day", "folded"),)

    id: str = Field(primary_key=True, max_length=32)
    use_case: str = Field(max_length=63)
    params: str = Field(max_length=64)
    day: int
    payload: str = Field(sa_column=Column(Text, nullable=False))
    folded: bool = Field(default=False)


class SketchRow(SQLModel, table=True):
    """The additive sketch of one use case's reports on one day, for one parameter set."""

    __tablename__ = "sketches"

    use_case: str = Field(primary_key=True, max_length=63)
    params: str = Field(primary_key=True, max_length=64)
    day: int = Field(primary_key=True)
    n: int = Field(sa_column=Column(BigInteger, nullable=False))
    state: bytes = Field(sa_column=Column(LargeBinary, nullable=False))


class JobLease(SQLModel, table=True):
    """Which process may run a scheduled job until when (so N workers run it once)."""

    __tablename__ = "job_leases"

    job: str = Field(primary_key=True, max_length=60)
    holder: str = Field(max_length=64)
    until: float

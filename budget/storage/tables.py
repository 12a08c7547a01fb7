"""The ledger's tables. Devices appear only as ``device_key``, a keyed HMAC of the device id.

- ``charges``: one row per accepted report (device key, use case, budget, policy version,
  micro-epsilon, UTC day, idempotency key), the record a receipt and an audit entry name and
  the export carries; purged after the retention window. Appended only: nothing on the gate's
  path reads it, and the window accounting reads the accounts.
- ``accounts``: per device key one row with everything the gate decides on: the lifetime
  count and micro-epsilon, the spend of each day still held, and the lifetime multiset per
  (use case, epsilon, group size) slot (packed, :mod:`budget.state`). Which slots a budget's
  caps count is decided by the policies in force (:mod:`budget.book`), so no policy edit
  rewrites a row. Its row lock serializes every charge of one device; the lifetime part has
  no timestamps and survives the purge, which prunes only the days.
- ``retention_horizons``: per use case, the last day the purge deleted; nothing on or before
  it counts anywhere again.
- ``idempotency``: the first decision for each (device key, idempotency key).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, Integer, String, Text
from sqlmodel import Field, SQLModel

__all__ = ["Account", "Charge", "IdempotencyRecord", "RetentionHorizon"]


class Charge(SQLModel, table=True):
    """One accepted report's privacy charge."""

    __tablename__ = "charges"
    __table_args__ = (
        # in insertion order (days only grow), so appending costs no random page: the purge's
        # range. Nothing reads charges by device: the accounts hold each device's days.
        Index("ix_charges_day", "day"),
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
    """One device's state (:mod:`budget.state`), the serialization point of its charges."""

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
    __table_args__ = (Index("ix_idempotency_day", "day"), {"sqlite_with_rowid": False})

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

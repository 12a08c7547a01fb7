"""The charges committed after a full pass began, each read about once, handed to its chunks.

A full pass of the report (:func:`dp_governor.budget.reporting.summary.scan_range`) reads the
accounts a chunk at a time, each chunk in a snapshot of its own; its watermark must name the
charges after its start that each chunk's rows hold. ``charges`` has no index on the device
key, so reading them by device range would read every new charge once per chunk.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Final

from sqlalchemy import Connection, select

from dp_governor.budget.storage.tables import Charge

__all__ = ["NewCharges"]

_CHARGES = Charge.__table__  # type: ignore[attr-defined]
_READ_AGAIN: Final = 500  # ids read again by a chunk past which the next one settles them


class NewCharges:
    """The charges a full pass's chunks find committed after its start, each read about once.

    Exact: a chunk's ``applied`` must be the ids above the start's ``through`` that its
    snapshot holds for its devices (a row and its charges are written in one transaction).
    The chunks' snapshots follow one another, so what they hold only grows. Each reads the ids
    above ``low``, an id up to which its snapshot holds only ids an earlier chunk read (kept,
    with their devices, in a heap by device key), so no chunk misses one; it then takes the ids
    of its own devices from the heap and drops those of devices before it (read already).
    SQLite makes ids visible in id order: ``low`` becomes the largest id read. PostgreSQL may
    make an id visible after a larger one: ``low`` stops below the first id not yet seen,
    unless a settled id (one up to which every charge has committed or rolled back, read before
    the snapshot as :mod:`.summary` does for its watermark) passes it. The caller settles only
    after a chunk read more than :data:`_READ_AGAIN` ids again, so each new charge is read a
    bounded number of times: the cost is in proportion to the new charges, not to the chunks.
    """

    def __init__(self, dialect: str, through: int) -> None:
        self.dialect = dialect
        self.low = through
        self.known: set[int] = set()  # ids above ``low`` read already
        self.waiting: list[tuple[str, int]] = []  # (device key, id), a heap
        self.settle = False

    def read(self, conn: Connection, after: str, settled: int | None) -> None:
        """The ids ``conn``'s snapshot holds above ``low``; those of devices after ``after`` kept.

        ``settled``: an id read by the caller before the snapshot (``None``: none).
        """
        c = _CHARGES.c
        again = 0
        query = select(c.id, c.device_key).where(c.id > self.low).order_by(c.id)
        for i, dk in conn.execute(query):
            if int(i) in self.known:
                again += 1
                continue
            self.known.add(int(i))
            if str(dk) > after:
                heapq.heappush(self.waiting, (str(dk), int(i)))
        if self.dialect != "postgresql":
            self.low = max(self.known, default=self.low)
        else:
            self.low = max(self.low, settled or 0)
            while self.low + 1 in self.known:
                self.low += 1
        self.known = {i for i in self.known if i > self.low}
        self.settle = again > _READ_AGAIN

    def take(self, after: str, last: str) -> Iterator[int]:
        """The ids of devices in ``(after, last]`` (earlier ones dropped), taken out."""
        while self.waiting and self.waiting[0][0] <= last:
            dk, i = heapq.heappop(self.waiting)
            if dk > after:
                yield i

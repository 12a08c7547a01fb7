"""A use case's cumulative series as a state that new charges and a new day bring forward exactly.

The series over the window ``first .. first + n - 1`` (:mod:`.series`) is two figures per day:

- the top: the largest cumulative spend of any device from ``first`` to the day. The state
  keeps ``top[i, j]``, the largest spend of any device over days ``first + i .. first + j``,
  for every later start ``i`` too, so when the window moves to a later start its row is there
  already. Spend only grows while a day is in a window (a charge adds, the purge deletes only
  days before it), so each cell is brought forward by taking the larger of it and the new
  sums of the devices charged since: exact;
- the p99: over the sample (the first ``cap`` devices in pseudonym order of those with spend
  in the window), per day, the histogram ``{cumulative spend: devices}`` of the positive ones.
  Histograms subtract and add, so the state is brought forward by taking out the old values
  of each device whose values or membership may have changed and adding its new ones; the
  sample's last device ``last`` says where it ends.

Pure numpy: what to read and when the state cannot be brought forward is :mod:`.series_forward`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from dp_governor.budget.clock import day_date
from dp_governor.policies.model import from_micro

__all__ = ["DeviceSpend", "SeriesState", "rank99", "top_of"]

_QUANTILE: Final = 99 / 100  # numpy's ``percentile(..., 99)`` divides by 100 the same way


def rank99(n: int) -> int:
    """The 0-based rank ``numpy.percentile(x, 99, method="inverted_cdf")`` takes of ``n`` values.

    numpy's own arithmetic (``n * q - 1``, then up unless it is whole), so the p99 of a
    histogram equals the p99 of its values expanded.

    >>> [rank99(n) for n in (1, 99, 100, 101, 200)]
    [0, 98, 98, 99, 197]
    """
    index = n * _QUANTILE - 1
    below = float(np.floor(index))
    return max(0, int(below if index - below == 0 else below + 1))


def top_of(device: np.ndarray, day: np.ndarray, eps: np.ndarray, n_days: int) -> np.ndarray:
    """``top[i, j]``: the largest spend of one device over days ``i .. j`` (0 where ``j < i``).

    Rows ``(device, day index, micro-epsilon)`` sorted by device then day, one row a device
    and day. For each pair of a device's rows (a start row, an end row) the spend between them
    is a candidate for the cell (start's day, end's day); a window starting on or before the
    start row's day and ending on or after the end row's holds at least that, so the table is
    the candidates' maximum spread to earlier starts and later ends.

    >>> top_of(np.array([0, 0, 1]), np.array([0, 2, 1]), np.array([5, 3, 4]), 3).tolist()
    [[5, 5, 8], [0, 4, 4], [0, 0, 3]]
    """
    top = np.zeros((n_days, n_days), dtype=np.int64)
    if eps.size == 0:
        return top
    running = np.cumsum(eps)
    starts = np.flatnonzero(np.diff(device, prepend=-1))
    position = np.arange(device.size) - np.repeat(starts, np.diff(np.append(starts, device.size)))
    lag = 0
    while True:
        ends = np.flatnonzero(position >= lag)
        if ends.size == 0:
            break
        begins = ends - lag
        spent = running[ends] - running[begins] + eps[begins]
        np.maximum.at(top, (day[begins], day[ends]), spent)
        lag += 1
    top = np.maximum.accumulate(top, axis=1)  # later ends hold at least as much
    top = np.maximum.accumulate(top[::-1], axis=0)[::-1]  # so do earlier starts
    return np.triu(top)


@dataclass(frozen=True, slots=True)
class DeviceSpend:
    """One device's spend on a use case, ``{day: micro-epsilon}``, and its key."""

    key: str
    days: dict[int, int]

    def cumulative(self, first: int, n_days: int) -> np.ndarray:
        """Its cumulative spend from ``first`` on each of the ``n_days`` days of a window."""
        spent = np.zeros(n_days, dtype=np.int64)
        for d, e in self.days.items():
            if first <= d < first + n_days:
                spent[d - first] += e
        return np.cumsum(spent)

    def last(self, first: int, n_days: int) -> int | None:
        """The last day of the window it spent on (``None``: none)."""
        return max(
            (d for d, e in self.days.items() if first <= d < first + n_days and e), default=None
        )


@dataclass(slots=True)
class SeriesState:
    """What a use case's series needs to be brought forward (module docstring).

    ``hist[j]``: the sample's positive cumulative spends on day ``first + j``, ``{value:
    devices}``; ``ends[j]``: how many devices last spent in the window on day ``first + j``
    (their sum: the devices that spent in the window, ``devices``); ``sampled``: the first
    ``min(devices, cap)`` of them in key order are the sample, ``last`` the last one's key
    (``""``: none).
    """

    first: int
    n_days: int
    cap: int
    top: np.ndarray
    hist: list[dict[int, int]]
    ends: list[int]
    sampled: int
    last: str

    @property
    def devices(self) -> int:
        """How many devices spent in the window."""
        return sum(self.ends)

    def end(self, spend: DeviceSpend, sign: int) -> None:
        """Count (``sign`` 1) or take out (-1) a device's last day of spend in the window."""
        last = spend.last(self.first, self.n_days)
        if last is not None:
            self.ends[last - self.first] += sign
            if self.ends[last - self.first] < 0:
                raise ValueError(f"no device last spent on day {last}")

    def series_days(self) -> list[str]:
        """The window's days, ISO dates."""
        return [day_date(d).isoformat() for d in range(self.first, self.first + self.n_days)]

    def maxima(self) -> list[float]:
        """The top device's cumulative epsilon on each day of the window."""
        return [from_micro(int(v)) for v in self.top[0]]

    def p99(self) -> list[float]:
        """The sample's p99 cumulative epsilon on each day (0 where no sampled device spent)."""
        out = []
        for counts in self.hist:
            if not counts:
                out.append(0.0)
                continue
            values = sorted(counts)
            seen = np.cumsum([counts[v] for v in values])
            at = int(np.searchsorted(seen, rank99(int(seen[-1])), side="right"))
            out.append(from_micro(values[at]))
        return out

    def count(self, cumulative: Sequence[np.ndarray], sign: int) -> None:
        """Add (``sign`` 1) or take out (-1) devices' cumulative spends, one value a day each.

        Raises:
            ValueError: a value taken out that the histogram does not hold.
        """
        if not cumulative:
            return
        grid = np.vstack(cumulative)
        for j in range(self.n_days):
            column = grid[:, j]
            values, counts = np.unique(column[column > 0], return_counts=True)
            held = self.hist[j]
            for v, c in zip(values.tolist(), counts.tolist(), strict=True):
                left = held.get(v, 0) + sign * c
                if left < 0:
                    raise ValueError(f"the sample holds fewer devices at {v} on day {j}")
                if left:
                    held[v] = left
                else:
                    del held[v]

    def moved_to(self, first: int) -> SeriesState:
        """The state of the window starting ``first`` (not before this one's), same length.

        The devices it does not change (no spend on the days leaving or entering) keep their
        values; on a day after this window's last they hold the last day's. The caller takes
        out and adds the others'.
        """
        shift, n = first - self.first, self.n_days
        last = np.minimum(np.arange(n) + shift, n - 1)  # a day after this window: its last
        top = np.zeros((n, n), dtype=np.int64)
        if shift < n:
            top[: n - shift] = np.triu(self.top[shift:][:, last])
        hist = [dict(self.hist[j]) for j in last.tolist()]
        ends = [*self.ends[shift:], *[0] * min(shift, n)]
        return SeriesState(first, n, self.cap, top, hist, ends, self.sampled, self.last)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready view: the top's upper triangle row by row, histograms as pairs."""
        return {
            "first": self.first,
            "n_days": self.n_days,
            "cap": self.cap,
            "top": [self.top[i, i:].tolist() for i in range(self.n_days)],
            "hist": [sorted(h.items()) for h in self.hist],
            "ends": self.ends,
            "sampled": self.sampled,
            "last": self.last,
        }

    @classmethod
    def of_json(cls, data: dict[str, Any]) -> SeriesState:
        """The state :meth:`to_json` wrote."""
        n = int(data["n_days"])
        top = np.zeros((n, n), dtype=np.int64)
        for i, row in enumerate(data["top"]):
            top[i, i:] = row
        return cls(
            first=int(data["first"]),
            n_days=n,
            cap=int(data["cap"]),
            top=top,
            hist=[{int(v): int(c) for v, c in pairs} for pairs in data["hist"]],
            ends=[int(n) for n in data["ends"]],
            sampled=int(data["sampled"]),
            last=str(data["last"]),
        )

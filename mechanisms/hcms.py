"""Apple's Hadamard Count Mean Sketch (HCMS): device randomizer, server sketch and estimator.

Client (Algorithm 6): pick a row ``j`` from ``[k]`` and a Hadamard row ``l`` from ``[m]``
uniformly, take ``w = H[l, h_j(d)]`` (``+-1``) and flip it with probability ``1 / (1 + e^eps)``;
send ``(j, l, bit)``. All of epsilon goes on the single bit (Theorem 4.3).

Server (Algorithm 7): the sketch keeps integer sums ``S[j, l]`` of the received bits; before
estimating, each row is transformed by the fast Walsh-Hadamard transform, ``T = S H_m``, and
``f~(d) = (m/(m-1)) (c sum_j T[j, h_j(d)] - n/m)`` with ``c = coth(eps/2)`` (eq. 2; the paper's
factor ``k`` cancels against its ``1/k``). The transform is cached until the next add or merge.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Self

import numpy as np
import numpy.typing as npt

from dp_governor.mechanisms._base import RowDescribed, RowSketch, load_bodies
from dp_governor.mechanisms._validation import (
    InvalidReport,
    check_epsilon,
    check_int,
    report_fields,
    report_int,
)
from dp_governor.mechanisms.hadamard import fwht, hadamard_entry, is_power_of_two
from dp_governor.mechanisms.hashing import MAX_ROWS, Fingerprints, HashFamily, Item, factorize
from dp_governor.mechanisms.interface import Arrays
from dp_governor.mechanisms.randomness import (
    OS_COINS,
    Coins,
    bernoulli,
    flip_probability,
    os_bernoulli,
    os_randbelow,
)
from dp_governor.mechanisms.variance import hcms_c, hcms_variance_exact

__all__ = ["HCMS", "HcmsReport", "HcmsReports", "HcmsSketch"]

MAX_M: Final = 1 << 24
_FOLD_CHUNK: Final = 1 << 20  # reports folded at a time (8 MiB of cell indices)

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class HcmsReport:
    """One HCMS report: hash row ``j``, Hadamard row ``l``, privatized ``bit`` in ``{-1, +1}``."""

    j: int
    l: int
    bit: int

    def to_dict(self) -> dict[str, int]:
        """The JSON body ``{"j": int, "l": int, "bit": -1 or 1}``."""
        return {"j": self.j, "l": self.l, "bit": self.bit}

    @classmethod
    def from_dict(cls, data: object, *, k: int, m: int, prefix: str = "") -> HcmsReport:
        """Parse and validate a JSON body against ``(k, m)``; raises :class:`InvalidReport`."""
        body: Mapping[str, Any] = report_fields(data, {"j", "l", "bit"}, prefix)
        j = report_int(body, "j", prefix, 0, k)
        l = report_int(body, "l", prefix, 0, m)
        bit = body["bit"]
        if isinstance(bit, bool) or bit not in (-1, 1) or not isinstance(bit, int):
            raise InvalidReport(prefix + "bit", f"must be -1 or 1, got {bit!r}")
        return cls(j, l, bit)


@dataclass(frozen=True, slots=True, eq=False)
class HcmsReports:
    """A batch of HCMS reports as numpy columns ``j``, ``l`` (int64) and ``bit`` (int8, +-1)."""

    j: IntArray
    l: IntArray
    bit: npt.NDArray[np.int8]

    def __len__(self) -> int:
        return int(self.j.shape[0])

    def __getitem__(self, i: int) -> HcmsReport:
        return HcmsReport(int(self.j[i]), int(self.l[i]), int(self.bit[i]))

    def __iter__(self) -> Iterator[HcmsReport]:
        return (self[i] for i in range(len(self)))

    def to_dicts(self) -> list[dict[str, int]]:
        """The JSON bodies of all reports."""
        return [
            {"j": j, "l": l, "bit": b}
            for j, l, b in zip(self.j.tolist(), self.l.tolist(), self.bit.tolist(), strict=True)
        ]

    def columns(self) -> Arrays:
        """``{"j": (n,), "l": (n,), "bit": (n,) int8}``."""
        return {"j": self.j, "l": self.l, "bit": self.bit}

    def select(self, mask: npt.ArrayLike) -> HcmsReports:
        """The reports where ``mask`` (boolean or index array) selects."""
        idx = np.asarray(mask)
        return HcmsReports(self.j[idx], self.l[idx], self.bit[idx])

    @classmethod
    def from_reports(cls, reports: Sequence[HcmsReport]) -> HcmsReports:
        """Stack single reports into a batch."""
        n = len(reports)
        return cls(
            np.fromiter((r.j for r in reports), dtype=np.int64, count=n),
            np.fromiter((r.l for r in reports), dtype=np.int64, count=n),
            np.fromiter((r.bit for r in reports), dtype=np.int8, count=n),
        )


def hcms_body_schema(k: int | None = None, m: int | None = None) -> dict[str, Any]:
    """The JSON schema of an HCMS report ``{"j", "l", "bit"}``: bounded by ``(k, m)`` when given.

    Without parameters it is the shape of every HCMS report (the OpenAPI document's).
    """
    j: dict[str, Any] = {
        "type": "integer",
        "minimum": 0,
        "description": "The hash row, 0 to k - 1.",
    }
    ell: dict[str, Any] = {
        "type": "integer",
        "minimum": 0,
        "description": "The Hadamard coefficient's index, 0 to m - 1.",
    }
    if k is not None and m is not None:
        j["maximum"], ell["maximum"] = k - 1, m - 1
    return {
        "type": "object",
        "required": ["j", "l", "bit"],
        "additionalProperties": False,
        "properties": {
            "j": j,
            "l": ell,
            "bit": {
                "type": "integer",
                "enum": [-1, 1],
                "description": "The privatized sign of the coefficient.",
            },
        },
    }


@dataclass(frozen=True, slots=True)
class HCMS(RowDescribed):
    """HCMS parameters (frozen, validated) and the mechanism's device and server entry points.

    Attributes:
        epsilon: the privacy loss of one report (all of it on the single bit).
        k: the number of hash functions (sketch rows).
        m: the number of buckets, a power of two (the Hadamard order).
        hash_family: the keyed family shared by devices and server.
    """

    epsilon: float
    k: int
    m: int
    hash_family: HashFamily = field(default_factory=HashFamily)

    name: ClassVar[str] = "hcms"
    BODY_SHAPE: ClassVar[dict[str, Any]] = hcms_body_schema()
    BODY_DESCRIPTION: ClassVar[str] = (
        "An HCMS report (mechanism `hcms`): one privatized Hadamard coefficient."
    )
    MINIATURE: ClassVar[tuple[int, int]] = (8, 64)

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon("epsilon", self.epsilon))
        object.__setattr__(self, "k", check_int("k", self.k, 1, MAX_ROWS))
        m = check_int("m", self.m, 2, MAX_M)
        if not is_power_of_two(m):
            raise ValueError(f"`m` must be a power of 2, got {m}")
        object.__setattr__(self, "m", m)
        if not isinstance(self.hash_family, HashFamily):
            raise TypeError(f"`hash_family` must be a HashFamily, got {self.hash_family!r}")

    @property
    def flip_probability(self) -> float:
        """The bit flips with probability ``1 / (1 + e^eps)``."""
        return flip_probability(self.epsilon)

    @property
    def c(self) -> float:
        """Debiasing constant ``coth(eps/2)``."""
        return hcms_c(self.epsilon)

    # -- device side ---------------------------------------------------------------------------

    def _bits(
        self, fp: Fingerprints, j: IntArray, l: IntArray, flips: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.int8]:
        """``bit = H[l, h_j(d)]``, negated where ``flips``."""
        h = self.hash_family.evaluate(fp, j, self.m)
        h &= l
        parity = np.bitwise_count(h).astype(np.uint8, copy=False)  # H[l, h] = (-1)**parity
        parity ^= flips.view(np.uint8)
        parity &= np.uint8(1)
        parity <<= np.uint8(1)
        out: npt.NDArray[np.int8] = (np.uint8(1) - parity).view(np.int8)  # 1 - 2 * parity
        return out

    def privatize(
        self, values: Sequence[Item] | npt.NDArray[np.object_], *, rng: np.random.Generator
    ) -> HcmsReports:
        """Privatize a batch of values (simulations and tests); randomness from ``rng``."""
        distinct, inverse = factorize(values)
        return self.privatize_indices(distinct, inverse, rng=rng)

    def privatize_indices(
        self, vocabulary: Sequence[Item], index: npt.ArrayLike, *, rng: np.random.Generator
    ) -> HcmsReports:
        """Privatize ``vocabulary[index[i]]`` for each ``i``: a fleet drawing from a vocabulary."""
        inverse = np.asarray(index, dtype=np.int64)
        n = len(inverse)
        fp = self.hash_family.fingerprint(vocabulary).take(inverse)
        j = rng.integers(0, self.k, size=n, dtype=np.int64)
        l = rng.integers(0, self.m, size=n, dtype=np.int64)
        flips = bernoulli(self.flip_probability, n, rng=rng)
        return HcmsReports(j, l, self._bits(fp, j, l, flips))

    def privatize_one(self, value: Item, *, coins: Coins = OS_COINS) -> HcmsReport:
        """Privatize one value on a device, drawing only from the OS CSPRNG (``secrets``).

        ``coins`` replays a test vector's draws (docs/device.md): ``j``, ``l``, then the flip.
        """
        j = np.array([os_randbelow(self.k, coins)], dtype=np.int64)
        l = np.array([os_randbelow(self.m, coins)], dtype=np.int64)
        flips = os_bernoulli(self.flip_probability, 1, coins)
        fp = self.hash_family.fingerprint([value])
        return HcmsReport(int(j[0]), int(l[0]), int(self._bits(fp, j, l, flips)[0]))

    def output_distribution(self, value: Item) -> npt.NDArray[np.float64]:
        """Exact ``P(j, l, bit | value)`` as a ``(k, m, 2)`` array (bit index 0 is -1, 1 is +1)."""
        if self.k * self.m > 1 << 22:
            raise ValueError("output enumeration is for small k * m only")
        p = self.flip_probability
        h = self.hash_family.hash([value] * self.k, np.arange(self.k), self.m)
        w = hadamard_entry(np.arange(self.m)[None, :], h[:, None])  # (k, m)
        plus = np.where(w == 1, 1.0 - p, p)
        out = np.stack([1.0 - plus, plus], axis=-1) / (self.k * self.m)
        return out

    # -- codec and server side -----------------------------------------------------------------

    def audit_event(self, reports: HcmsReports, x: Item, x_prime: Item) -> npt.NDArray[np.bool_]:
        """The audit's worst-case event (:mod:`.empirical_audit`), report by report.

        The bit equals ``H[l, h_j(x)]`` where ``H[l, h_j(x)] != H[l, h_j(x')]``: probability
        ratio ``q / (1 - q) = e^eps``.
        """
        fp = self.hash_family.fingerprint([x, x_prime])
        rows = reports.j
        hx = self.hash_family.evaluate(fp.take(np.zeros(len(rows), np.int64)), rows, self.m)
        hy = self.hash_family.evaluate(fp.take(np.ones(len(rows), np.int64)), rows, self.m)
        sign_x = 1 - 2 * (np.bitwise_count(hx & reports.l) & 1).astype(np.int8)
        sign_y = 1 - 2 * (np.bitwise_count(hy & reports.l) & 1).astype(np.int8)
        out: npt.NDArray[np.bool_] = (reports.bit == sign_x) & (sign_x != sign_y)
        return out

    def body_schema(self) -> dict[str, Any]:
        """``{"j", "l", "bit"}`` bounded by ``k`` and ``m``."""
        return hcms_body_schema(self.k, self.m)

    def decode(self, payloads: Iterable[str | bytes]) -> HcmsReports:
        """Stored JSON payloads (validated at ingestion) as one batch."""
        bodies = load_bodies(payloads)
        n = len(bodies)
        return HcmsReports(
            np.fromiter((b["j"] for b in bodies), dtype=np.int64, count=n),
            np.fromiter((b["l"] for b in bodies), dtype=np.int64, count=n),
            np.fromiter((b["bit"] for b in bodies), dtype=np.int8, count=n),
        )

    def from_columns(self, columns: Mapping[str, np.ndarray]) -> HcmsReports:
        """The batch of :meth:`HcmsReports.columns`."""
        return HcmsReports(
            np.asarray(columns["j"], dtype=np.int64),
            np.asarray(columns["l"], dtype=np.int64),
            np.asarray(columns["bit"], dtype=np.int8),
        )

    def sketch(self) -> HcmsSketch:
        """An empty server-side sketch for these parameters."""
        return HcmsSketch(self)

    def sketch_from_arrays(self, arrays: Mapping[str, np.ndarray]) -> HcmsSketch:
        """The sketch of :meth:`HcmsSketch.to_arrays` (validated)."""
        return HcmsSketch.from_arrays(self, arrays[HcmsSketch.TABLE], arrays["rows"])

    def variance(self, n: float, f: npt.ArrayLike, f2_others: npt.ArrayLike) -> npt.NDArray[Any]:
        """Exact variance of the estimate (Appendix B)."""
        return hcms_variance_exact(self.epsilon, self.k, self.m, n, f, f2_others)

    def plausibility(self, z: float) -> None:
        """``None``: one bit whose mean depends on the value makes no single report implausible."""
        return None

    def parse_report(self, data: object, prefix: str = "") -> HcmsReport:
        """Validate a JSON report body against these parameters."""
        return HcmsReport.from_dict(data, k=self.k, m=self.m, prefix=prefix)


class HcmsSketch(RowSketch[HCMS]):
    """Server-side HCMS sketch: integer bit sums ``S[j, l]`` and per-row report counts ``n_j``."""

    __slots__ = ("_transformed",)

    TABLE: ClassVar[str] = "sums"

    def __init__(self, params: HCMS) -> None:
        super().__init__(params)
        self._transformed: npt.NDArray[np.integer] | None = None

    @staticmethod
    def _consistent(table: np.ndarray, rows: np.ndarray) -> str | None:
        # summed in float64: an int64 sum of tampered cells could wrap below the row's count
        if (rows < 0).any() or (np.abs(table).sum(axis=1, dtype=np.float64) > rows).any():
            return "sums must satisfy sum_l |S[j, l]| <= n_j"
        return None

    @property
    def sums(self) -> npt.NDArray[np.integer]:
        """Read-only view of ``S[j, l]``, the sum of received bits per cell."""
        return self._table_view()

    def _reserve(self, extra_rows: npt.NDArray[np.int64]) -> None:
        self._transformed = None
        super()._reserve(extra_rows)

    def add(self, reports: HcmsReports | HcmsReport) -> Self:
        """Fold reports in (``S[j, l] += bit``); returns the sketch so calls chain."""
        if isinstance(reports, HcmsReport):
            reports = HcmsReports.from_reports([reports])
        if len(reports) == 0:
            return self
        k, m = self.params.k, self.params.m
        j = np.asarray(reports.j, dtype=np.int64)
        l = np.asarray(reports.l, dtype=np.int64)
        bit = np.asarray(reports.bit)
        if int(j.min()) < 0 or int(j.max()) >= k:
            raise ValueError(f"report rows `j` must be in [0, {k})")
        if int(l.min()) < 0 or int(l.max()) >= m:
            raise ValueError(f"report columns `l` must be in [0, {m})")
        if not np.all(np.abs(bit) == 1):
            raise ValueError("report bits must be -1 or +1")
        per_row = np.bincount(j, minlength=k)
        self._reserve(per_row)
        sums = self._table.reshape(-1)
        size = min(len(j), _FOLD_CHUNK)
        flat = np.empty(size, dtype=np.int64)
        signs = np.empty(size, dtype=sums.dtype)
        for s in range(0, len(j), _FOLD_CHUNK):  # bounded temporaries, reused: no fresh pages
            e = min(len(j), s + _FOLD_CHUNK)
            f, b = flat[: e - s], signs[: e - s]
            np.multiply(j[s:e], m, out=f)
            f += l[s:e]
            b[...] = bit[s:e]
            np.add.at(sums, f, b)
        self._rows += per_row
        return self

    def transformed(self) -> npt.NDArray[np.integer]:
        """``T = S H_m`` row by row (cached until the sketch changes)."""
        found = self._transformed
        if found is None:
            t: npt.NDArray[Any] = fwht(self._table)
            t.flags.writeable = False
            self._transformed = found = t
        return found

    def _estimate_table(self) -> npt.NDArray[np.integer]:
        return self.transformed()

    def _counts(self, sums: npt.NDArray[np.float64], n: int) -> npt.NDArray[np.float64]:
        p = self.params
        out: npt.NDArray[np.float64] = (p.m / (p.m - 1)) * (p.c * sums - n / p.m)
        return out

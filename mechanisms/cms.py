"""Apple's Count Mean Sketch (CMS): device randomizer, server sketch and estimator.

Client (Algorithm 2): pick a row ``j`` uniformly from ``[k]``, one-hot encode ``h_j(d)`` as a
``+-1`` vector of length ``m`` and flip every coordinate independently with probability
``1 / (1 + e^(eps/2))``; send ``(bits, j)``. The report is eps-LDP (Theorem 4.1). On the wire the
``m`` coordinates are packed big-endian into ``ceil(m/8)`` bytes, a set bit meaning ``+1``.

Server (Algorithms 3-4): the sketch keeps, per row, the number of reports ``n_j`` and the number
``P[j, l]`` of reports whose coordinate ``l`` is ``+1``; the paper's matrix is
``M[j, l] = k (c P[j, l] - (c - 1) n_j / 2)``, so eq. (2) becomes
``f~(d) = (m/(m-1)) (c sum_j P[j, h_j(d)] - (c - 1) n / 2 - n / m)`` with ``c = coth(eps/4)``.
Counts are integers, so sketches add exactly and merges are associative and commutative.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Self

import numpy as np
import numpy.typing as npt

from dp_governor.mechanisms._base import (
    RowDescribed,
    RowSketch,
    bit_at,
    cms_body_schema,
    load_bodies,
    packed_rows,
)
from dp_governor.mechanisms._bitcount import add_bit_counts
from dp_governor.mechanisms._validation import (
    InvalidReport,
    check_epsilon,
    check_int,
    report_fields,
    report_int,
)
from dp_governor.mechanisms.hashing import MAX_ROWS, HashFamily, Item, factorize
from dp_governor.mechanisms.interface import Arrays, Report
from dp_governor.mechanisms.randomness import (
    OS_COINS,
    Coins,
    bernoulli,
    flip_probability,
    os_bernoulli,
    os_randbelow,
)
from dp_governor.mechanisms.variance import cms_c, cms_variance_exact

__all__ = ["CMS", "CmsReport", "CmsReports", "CmsSketch"]

MAX_M: Final = 1 << 16
_PRIVATIZE_CHUNK_BITS: Final = 1 << 22

IntArray = npt.NDArray[np.int64]
ByteArray = npt.NDArray[np.uint8]


@dataclass(frozen=True, slots=True)
class CmsReport:
    """One CMS report: the row ``j`` and the ``m`` privatized coordinates, packed big-endian."""

    j: int
    bits: bytes

    def to_dict(self) -> dict[str, Any]:
        """The JSON body ``{"j": int, "bits": base64}``."""
        return {"j": self.j, "bits": base64.b64encode(self.bits).decode("ascii")}

    @classmethod
    def from_dict(cls, data: object, *, k: int, m: int, prefix: str = "") -> CmsReport:
        """Parse and validate a JSON body against ``(k, m)``; raises :class:`InvalidReport`."""
        body = report_fields(data, {"j", "bits"}, prefix)
        j = report_int(body, "j", prefix, 0, k)
        raw = body["bits"]
        if not isinstance(raw, str):
            raise InvalidReport(prefix + "bits", f"must be a base64 string, got {raw!r}")
        try:
            bits = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidReport(prefix + "bits", "is not valid base64") from None
        n_bytes = (m + 7) // 8
        if len(bits) != n_bytes:
            raise InvalidReport(
                prefix + "bits", f"must decode to {n_bytes} bytes (m={m}), got {len(bits)}"
            )
        if m % 8 and bits[-1] & ((1 << (8 - m % 8)) - 1):
            raise InvalidReport(prefix + "bits", f"has padding bits set beyond m={m}")
        return cls(j, bits)

    def ones(self) -> int:
        """The number of ``+1`` coordinates."""
        return int.from_bytes(self.bits, "big").bit_count()

    def signs(self, m: int) -> npt.NDArray[np.int8]:
        """The ``+-1`` vector of length ``m``."""
        unpacked = np.unpackbits(np.frombuffer(self.bits, dtype=np.uint8), count=m)
        out: npt.NDArray[np.int8] = unpacked.astype(np.int8) * 2 - 1
        return out


@dataclass(frozen=True, slots=True, eq=False)
class CmsReports:
    """A batch of CMS reports as numpy columns: ``j`` (n,) and packed ``bits`` (n, ceil(m/8))."""

    j: IntArray
    bits: ByteArray
    m: int

    def __len__(self) -> int:
        return int(self.j.shape[0])

    def __getitem__(self, i: int) -> CmsReport:
        return CmsReport(int(self.j[i]), self.bits[i].tobytes())

    def __iter__(self) -> Iterator[CmsReport]:
        return (self[i] for i in range(len(self)))

    def to_dicts(self) -> list[dict[str, Any]]:
        """The JSON bodies of all reports."""
        return [r.to_dict() for r in self]

    def columns(self) -> Arrays:
        """``{"j": (n,), "bits": (n, ceil(m/8)) uint8}``."""
        return {"j": self.j, "bits": self.bits}

    def select(self, mask: npt.ArrayLike) -> CmsReports:
        """The reports where ``mask`` (boolean or index array) selects."""
        idx = np.asarray(mask)
        return CmsReports(self.j[idx], self.bits[idx], self.m)

    @classmethod
    def from_reports(cls, reports: Sequence[CmsReport], m: int) -> CmsReports:
        """Stack single reports (e.g. received one at a time) into a batch."""
        n_bytes = (m + 7) // 8
        j = np.fromiter((r.j for r in reports), dtype=np.int64, count=len(reports))
        raw = b"".join(r.bits for r in reports)
        bits = np.frombuffer(raw, dtype=np.uint8).reshape(len(reports), n_bytes).copy()
        return cls(j, bits, m)


@dataclass(frozen=True, slots=True)
class CMS(RowDescribed):
    """CMS parameters (frozen, validated) and the mechanism's device and server entry points.

    Attributes:
        epsilon: the privacy loss of one report (each coordinate spends ``epsilon / 2``).
        k: the number of hash functions (sketch rows).
        m: the number of buckets (report length in bits).
        hash_family: the keyed family shared by devices and server.
    """

    epsilon: float
    k: int
    m: int
    hash_family: HashFamily = field(default_factory=HashFamily)

    name: ClassVar[str] = "cms"
    BODY_SHAPE: ClassVar[dict[str, Any]] = cms_body_schema()
    BODY_DESCRIPTION: ClassVar[str] = "A CMS report (mechanism `cms`)."
    MINIATURE: ClassVar[tuple[int, int]] = (2, 8)

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon("epsilon", self.epsilon))
        object.__setattr__(self, "k", check_int("k", self.k, 1, MAX_ROWS))
        object.__setattr__(self, "m", check_int("m", self.m, 2, MAX_M))
        if not isinstance(self.hash_family, HashFamily):
            raise TypeError(f"`hash_family` must be a HashFamily, got {self.hash_family!r}")

    @property
    def flip_probability(self) -> float:
        """Each coordinate flips with probability ``1 / (1 + e^(eps/2))``."""
        return flip_probability(self.epsilon / 2.0)

    @property
    def c(self) -> float:
        """Debiasing constant ``coth(eps/4)``."""
        return cms_c(self.epsilon)

    @property
    def report_bytes(self) -> int:
        """Packed payload length, ``ceil(m/8)``."""
        return (self.m + 7) // 8

    # -- device side ---------------------------------------------------------------------------

    def privatize(
        self, values: Sequence[Item] | npt.NDArray[np.object_], *, rng: np.random.Generator
    ) -> CmsReports:
        """Privatize a batch of values (simulations and tests); randomness from ``rng``."""
        distinct, inverse = factorize(values)
        return self.privatize_indices(distinct, inverse, rng=rng)

    def privatize_indices(
        self, vocabulary: Sequence[Item], index: npt.ArrayLike, *, rng: np.random.Generator
    ) -> CmsReports:
        """Privatize ``vocabulary[index[i]]`` for each ``i``: a fleet drawing from a vocabulary."""
        inverse = np.asarray(index, dtype=np.int64)
        n = len(inverse)
        fp = self.hash_family.fingerprint(vocabulary).take(inverse)
        j = rng.integers(0, self.k, size=n, dtype=np.int64)
        h = self.hash_family.evaluate(fp, j, self.m)
        bits = np.empty((n, self.report_bytes), dtype=np.uint8)
        chunk = max(1, _PRIVATIZE_CHUNK_BITS // self.m)
        p = self.flip_probability
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            flips = bernoulli(p, (e - s, self.m), rng=rng)
            flips[np.arange(e - s), h[s:e]] ^= True
            bits[s:e] = np.packbits(flips, axis=1)
        return CmsReports(j, bits, self.m)

    def privatize_one(self, value: Item, *, coins: Coins = OS_COINS) -> CmsReport:
        """Privatize one value on a device, drawing only from the OS CSPRNG (``secrets``).

        ``coins`` replays a test vector's draws (docs/device.md): the row ``j``, then the ``m``
        coordinates' Bernoulli bytes.
        """
        j = os_randbelow(self.k, coins)
        h = int(self.hash_family.hash([value], [j], self.m)[0])
        flips = os_bernoulli(self.flip_probability, self.m, coins)
        flips[h] ^= True
        return CmsReport(j, np.packbits(flips).tobytes())

    def output_distribution(self, value: Item) -> npt.NDArray[np.float64]:
        """Exact ``P(j, y | value)`` as a ``(k, 2**m)`` array, ``y`` the packed bits as an integer.

        Only for small ``m`` (<= 16); used to check the LDP guarantee by enumeration.
        """
        if self.m > 16:
            raise ValueError(f"`m` must be <= 16 to enumerate outputs, got {self.m}")
        p = self.flip_probability
        rows = np.arange(self.k)
        h = self.hash_family.hash([value] * self.k, rows, self.m)
        onehot = np.left_shift(1, self.m - 1 - h).astype(np.uint64)  # bit h of y, big-endian
        y = np.arange(1 << self.m, dtype=np.uint64)
        t = np.bitwise_count(y[None, :] ^ onehot[:, None]).astype(np.float64)
        out: npt.NDArray[np.float64] = (p**t) * ((1.0 - p) ** (self.m - t)) / self.k
        return out

    def plausible_ones(self, z: float) -> tuple[int, int]:
        """The band ``[low, high]`` that a report's count of ``+1`` coordinates falls in.

        The count is ``Bernoulli(1 - p) + Binomial(m - 1, p)`` whatever the value (mean
        ``1 - p + (m - 1) p``, variance at most ``m p (1 - p)``); the band is ``z`` standard
        deviations plus one either side (the Bernoulli and rounding).

        >>> CMS(4.0, 16, 1024).plausible_ones(6.0)
        (59, 187)
        """
        p = self.flip_probability
        mean = 1 - p + (self.m - 1) * p
        spread = z * math.sqrt(self.m * p * (1 - p)) + 1
        return max(0, math.floor(mean - spread)), min(self.m, math.ceil(mean + spread))

    def plausibility(self, z: float) -> Callable[[Report], bool]:
        """Whether a report's ``+1`` count falls in :meth:`plausible_ones`' band."""
        low, high = self.plausible_ones(z)

        def plausible(report: Report) -> bool:
            assert isinstance(report, CmsReport)
            return low <= report.ones() <= high

        return plausible

    # -- codec and server side -----------------------------------------------------------------

    def audit_event(self, reports: CmsReports, x: Item, x_prime: Item) -> npt.NDArray[np.bool_]:
        """The audit's worst-case event (:mod:`.empirical_audit`), report by report.

        The bit at ``h_j(x)`` is +1 and the bit at ``h_j(x')`` is -1, in the report's own row
        ``j``, where the two hash apart: probability ratio ``e^eps`` exactly.
        """
        fp = self.hash_family.fingerprint([x, x_prime])
        rows = reports.j
        hx = self.hash_family.evaluate(fp.take(np.zeros(len(rows), np.int64)), rows, self.m)
        hy = self.hash_family.evaluate(fp.take(np.ones(len(rows), np.int64)), rows, self.m)
        out: npt.NDArray[np.bool_] = (
            bit_at(reports.bits, hx) & ~bit_at(reports.bits, hy) & (hx != hy)
        )
        return out

    def body_schema(self) -> dict[str, Any]:
        """``{"j", "bits"}`` bounded by ``k`` and ``m``."""
        return cms_body_schema(self.k, self.m)

    def decode(self, payloads: Iterable[str | bytes]) -> CmsReports:
        """Stored JSON payloads (validated at ingestion) as one batch."""
        return self.decode_bodies(load_bodies(payloads))

    def decode_bodies(self, bodies: Sequence[Mapping[str, Any]]) -> CmsReports:
        """Parsed bodies (validated at ingestion) as one batch."""
        return CmsReports(*packed_rows(bodies, self.m), self.m)

    def from_columns(self, columns: Mapping[str, np.ndarray]) -> CmsReports:
        """The batch of :meth:`CmsReports.columns`."""
        return CmsReports(np.asarray(columns["j"], dtype=np.int64), columns["bits"], self.m)

    def sketch(self) -> CmsSketch:
        """An empty server-side sketch for these parameters."""
        return CmsSketch(self)

    def sketch_from_arrays(self, arrays: Mapping[str, np.ndarray]) -> CmsSketch:
        """The sketch of :meth:`CmsSketch.to_arrays` (validated)."""
        return CmsSketch.from_arrays(self, arrays[CmsSketch.TABLE], arrays["rows"])

    def variance(self, n: float, f: npt.ArrayLike, f2_others: npt.ArrayLike) -> npt.NDArray[Any]:
        """Exact variance of the estimate (Appendix A)."""
        return cms_variance_exact(self.epsilon, self.k, self.m, n, f, f2_others)

    def parse_report(self, data: object, prefix: str = "") -> CmsReport:
        """Validate a JSON report body against these parameters."""
        return CmsReport.from_dict(data, k=self.k, m=self.m, prefix=prefix)


class CmsSketch(RowSketch[CMS]):
    """Server-side CMS sketch: integer counts ``P[j, l]`` and per-row report counts ``n_j``."""

    __slots__ = ()

    TABLE: ClassVar[str] = "counts"

    @staticmethod
    def _consistent(table: np.ndarray, rows: np.ndarray) -> str | None:
        # reductions, not elementwise comparisons: no table-sized temporary array
        if table.min(initial=0) < 0 or (rows < 0).any() or (table.max(axis=1) > rows).any():
            return "counts must satisfy 0 <= P[j, l] <= n_j"
        return None

    @property
    def counts(self) -> npt.NDArray[np.integer]:
        """Read-only view of ``P[j, l]``, the number of ``+1`` coordinates per cell."""
        return self._table_view()

    def add(self, reports: CmsReports | CmsReport, *, threads: int = 1) -> Self:
        """Fold reports in; returns the sketch so calls chain.

        The bits are counted without unpacking them (:mod:`dp_governor.mechanisms._bitcount`);
        ``threads`` counts blocks of rows concurrently.
        """
        if isinstance(reports, CmsReport):
            reports = CmsReports.from_reports([reports], self.params.m)
        if reports.m != self.params.m:
            raise ValueError(f"reports have m={reports.m}, the sketch m={self.params.m}")
        if len(reports) == 0:
            return self
        j = np.asarray(reports.j, dtype=np.int64)
        if int(j.min()) < 0 or int(j.max()) >= self.params.k:
            raise ValueError(f"report rows `j` must be in [0, {self.params.k})")
        per_row = np.bincount(j, minlength=self.params.k)
        self._reserve(per_row)
        add_bit_counts(self._table, j, reports.bits, threads=threads)
        self._rows += per_row
        return self

    def _counts(self, sums: npt.NDArray[np.float64], n: int) -> npt.NDArray[np.float64]:
        p = self.params
        c = p.c
        out: npt.NDArray[np.float64] = (p.m / (p.m - 1)) * (
            c * sums - (c - 1.0) * n / 2.0 - n / p.m
        )
        return out

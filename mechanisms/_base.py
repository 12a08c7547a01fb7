"""What CMS, HCMS and SFP share: their description and fingerprint, and the row sketch of CMS/HCMS.

:class:`Described` derives, from a mechanism's :meth:`parameters` and :meth:`body_schema`, its
:class:`Fingerprint`, its report schema with the ``family`` field and its published description.
:class:`RowSketch` is the integer ``(k, m)`` table with per-row counts that the CMS and HCMS
sketches both keep: restore, grow, merge, copy and estimate are written once here.
"""

from __future__ import annotations

import base64
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Final, Generic, Protocol, Self, TypeVar

import numpy as np
import numpy.typing as npt
import orjson

from dp_governor.mechanisms.estimate import FrequencyEstimate, gather_row_sums, plugin_stderr
from dp_governor.mechanisms.hashing import Fingerprints, HashFamily, Item
from dp_governor.mechanisms.interface import Arrays, Fingerprint

__all__ = [
    "FAMILY_FIELD",
    "Described",
    "RowSketch",
    "bit_at",
    "cms_body_schema",
    "load_bodies",
    "packed_rows",
]

FAMILY_FIELD: Final = "family"
INT32_MAX: Final = int(np.iinfo(np.int32).max)

IntArray = npt.NDArray[np.int64]


def load_bodies(payloads: Iterable[str | bytes]) -> list[Any]:
    """Stored JSON payloads as parsed bodies."""
    return [orjson.loads(p) for p in payloads]


def packed_rows(bodies: Sequence[Mapping[str, Any]], m: int) -> tuple[IntArray, np.ndarray]:
    """The ``j`` column and the decoded ``bits`` rows of CMS bodies (validated before)."""
    j = np.fromiter((b["j"] for b in bodies), dtype=np.int64, count=len(bodies))
    raw = b"".join(base64.b64decode(b["bits"]) for b in bodies)
    return j, np.frombuffer(raw, dtype=np.uint8).reshape(len(bodies), (m + 7) // 8)


BASE64: Final = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
"""Standard base64 with its padding: what a JSON schema can say of a CMS row's ``bits``."""


def cms_body_schema(k: int | None = None, m: int | None = None) -> dict[str, Any]:
    """The JSON schema of a CMS row ``{"j", "bits"}``: bounded by ``(k, m)`` when given.

    Without parameters it is the shape every CMS row has (the OpenAPI document's); with them,
    the exact bounds :meth:`CmsReport.from_dict` enforces (one description, two uses).
    """
    j: dict[str, Any] = {"type": "integer", "minimum": 0}
    bits: dict[str, Any] = {"type": "string", "contentEncoding": "base64", "pattern": BASE64}
    if k is None or m is None:
        j["description"] = "The hash row, 0 to k - 1."
        bits["description"] = (
            "The m privatized coordinates (1 = +1), packed big-endian into bytes,"
            " padding bits zero, in standard base64."
        )
    else:
        n_bytes = (m + 7) // 8
        j |= {"maximum": k - 1, "description": "The hash row, 0 to k - 1."}
        tail = ("", "[A-Za-z0-9+/]{2}==", "[A-Za-z0-9+/]{3}=")[n_bytes % 3]  # its padding
        bits |= {
            "pattern": f"^(?:[A-Za-z0-9+/]{{4}})*{tail}$",  # so 'AAAA' is not 2 bytes
            "minLength": 4 * ((n_bytes + 2) // 3),
            "maxLength": 4 * ((n_bytes + 2) // 3),
            "description": f"The {m} privatized coordinates (1 = +1), packed big-endian"
            f" into {n_bytes} bytes, padding bits zero, in standard base64.",
        }
    return {
        "type": "object",
        "required": ["j", "bits"],
        "additionalProperties": False,
        "properties": {"j": j, "bits": bits},
    }


def bit_at(bits: npt.NDArray[np.uint8], h: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Bit ``h[i]`` (big-endian within each byte) of each packed row, as True for +1."""
    byte = bits[np.arange(len(h)), h >> 3]
    out: npt.NDArray[np.bool_] = ((byte >> (7 - (h & 7)).astype(np.uint8)) & 1).astype(bool)
    return out


class Described(ABC):
    """A mechanism's identity and published description, derived from its parameters."""

    __slots__ = ()

    name: ClassVar[str]
    hash_family: HashFamily
    BODY_DESCRIPTION: ClassVar[str]
    """One sentence on the report body, for the OpenAPI document."""
    BODY_SHAPE: ClassVar[dict[str, Any]]
    """The report body's JSON schema for any parameters (the OpenAPI document's): the
    mechanism's body-schema function called without parameters, as :meth:`body_schema` calls it
    with this instance's."""

    @abstractmethod
    def parameters(self) -> dict[str, Any]:
        """What decides how a report is built and folded (no identifier, no schema)."""

    @abstractmethod
    def body_schema(self) -> dict[str, Any]:
        """The JSON schema of one report body, without the ``family`` field."""

    @property
    def fingerprint(self) -> Fingerprint:
        """The mechanism's identity: published ``family_id`` and stored parameter key."""
        return Fingerprint.of(self.parameters())

    def report_schema(self) -> dict[str, Any]:
        """The JSON schema of one report body, with its ``family`` field required.

        Required as the server requires it by default; a server that accepts bodies without
        it (``require_report_family=false``) publishes the schema with it optional
        (``dp_governor.api.wire.policy``).
        """
        schema = self.body_schema()
        schema["properties"][FAMILY_FIELD] = {
            "const": self.fingerprint.family_id,
            "description": "the randomizer's family identifier; a report under another is refused",
        }
        schema["required"] = [*schema["required"], FAMILY_FIELD]
        return schema

    def describe(self) -> dict[str, Any]:
        """The published description: parameters, hash family, ``family_id``, ``report_schema``.

        The seed is published fixed-width (64 hex digits); ``family_id`` hashes the identity form
        of :meth:`HashFamily.to_dict`, so it is unchanged for every seed.
        """
        return self.parameters() | {
            "hash_family": self.hash_family.to_published(),
            "family_id": self.fingerprint.family_id,
            "report_schema": self.report_schema(),
        }


class RowDescribed(Described):
    """A mechanism of one sketch of ``k`` rows of ``m`` buckets (CMS, HCMS): its identity."""

    __slots__ = ()

    epsilon: float
    k: int
    m: int

    MINIATURE: ClassVar[tuple[int, int]]
    """``(k, m)`` small enough to enumerate every output (:meth:`enumerated_loss`)."""

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, Any], hash_family: HashFamily) -> Self:
        """The mechanism of :meth:`parameters` (``epsilon``, ``k``, ``m``) and a hash family."""
        return cls(parameters["epsilon"], parameters["k"], parameters["m"], hash_family)  # type: ignore[call-arg]

    @abstractmethod
    def output_distribution(self, value: Item) -> npt.NDArray[np.float64]:
        """The law of one report of ``value``, over every output (small sizes only)."""

    def enumerated_loss(self) -> float:
        """The exact privacy loss of this randomizer at its :attr:`MINIATURE` size.

        The same epsilon and hash family with ``(k, m)`` small enough to enumerate every
        output, for two inputs that hash apart in every row: the largest
        ``|ln P(y | x) - ln P(y | x')|``.
        """
        small = dataclasses.replace(self, k=self.MINIATURE[0], m=self.MINIATURE[1])  # type: ignore[type-var]
        for i in range(10_000):
            a, b = f"a{i}", f"b{i}"
            h = small.hash_family.matrix([a, b], small.k, small.m)
            if np.all(h[:, 0] != h[:, 1]):
                pa, pb = small.output_distribution(a), small.output_distribution(b)
                return float(np.abs(np.log(pa) - np.log(pb)).max())
        raise AssertionError("no pair of inputs hashes apart in every row")

    def parameters(self) -> dict[str, Any]:
        """Mechanism, epsilon, ``k``, ``m`` and the hash family's identity form."""
        return {
            "mechanism": self.name,
            "epsilon": self.epsilon,
            "k": self.k,
            "m": self.m,
            "hash_family": self.hash_family.to_dict(),
        }


class RowParams(Protocol):
    """What a row sketch reads of its mechanism's parameters."""

    @property
    def k(self) -> int: ...

    @property
    def m(self) -> int: ...

    @property
    def hash_family(self) -> HashFamily: ...

    def variance(self, n: float, f: npt.ArrayLike, f2_others: npt.ArrayLike) -> npt.NDArray[Any]:
        """The estimate's exact variance."""
        ...


P = TypeVar("P", bound=RowParams)


class RowSketch(ABC, Generic[P]):
    """An integer table ``(k, m)`` and per-row report counts ``n_j``: CMS's and HCMS's state.

    Cells start as int32 and widen to int64 before any row could pass ``2**31 - 1`` reports.
    Subclasses name the table (:attr:`TABLE`), check its consistency and estimate from row sums.
    """

    __slots__ = ("_rows", "_table", "params")

    TABLE: ClassVar[str]

    def __init__(self, params: P) -> None:
        self.params = params
        k, m = self._shape()
        self._table: npt.NDArray[np.integer] = np.zeros((k, m), dtype=np.int32)
        self._rows: IntArray = np.zeros(k, dtype=np.int64)

    def _shape(self) -> tuple[int, int]:
        return self.params.k, self.params.m

    @staticmethod
    @abstractmethod
    def _consistent(table: np.ndarray, rows: np.ndarray) -> str | None:
        """Why ``table`` cannot be the state of ``rows`` reports per row (None: it can)."""

    @property
    def n(self) -> int:
        """The number of reports folded in."""
        return int(self._rows.sum())

    @property
    def row_counts(self) -> IntArray:
        """Read-only view of ``n_j``, the number of reports per row."""
        view = self._rows.view()
        view.flags.writeable = False
        return view

    def _table_view(self) -> npt.NDArray[np.integer]:
        view = self._table.view()
        view.flags.writeable = False
        return view

    @classmethod
    def from_arrays(cls, params: P, table: npt.ArrayLike, row_counts: npt.ArrayLike) -> Self:
        """Rebuild a sketch from persisted arrays (validated for shape and consistency)."""
        sk = cls(params)
        t = np.asarray(table)
        r = np.asarray(row_counts)
        k, m = sk._shape()
        if t.shape != (k, m) or r.shape != (k,):
            raise ValueError(f"arrays must have shapes ({k}, {m}) and ({k},)")
        if t.dtype.kind not in "iu" or r.dtype.kind not in "iu":
            raise ValueError("arrays must hold integers")
        if t.dtype.kind == "i" and t.size and int(t.min()) == np.iinfo(t.dtype).min:
            # its abs is itself: no check below could bound it
            raise ValueError(f"a cell holds {t.dtype}'s minimum, outside every valid sketch")
        for a in (t, r):  # what int64 cannot hold would wrap when widened below
            if a.dtype == np.uint64 and a.size and int(a.max()) > np.iinfo(np.int64).max:
                raise ValueError("a value exceeds what a sketch counts (int64)")
        problem = cls._consistent(t, r)
        if problem is not None:
            raise ValueError(problem)
        sk._rows = r.astype(np.int64)
        sk._table = t.astype(np.int64 if r.max(initial=0) > INT32_MAX else np.int32)
        return sk

    def to_arrays(self) -> Arrays:
        """``{TABLE: the table, "rows": n_j}``, what persists."""
        return {self.TABLE: np.asarray(self._table_view()), "rows": np.asarray(self.row_counts)}

    def _reserve(self, extra_rows: IntArray) -> None:
        """Widen the table before ``extra_rows`` more reports could overflow int32."""
        if self._table.dtype == np.int32 and int((self._rows + extra_rows).max()) > INT32_MAX:
            self._table = self._table.astype(np.int64)

    def merge(self, other: Self) -> Self:
        """Add another sketch of the same parameters; returns the sketch so calls chain."""
        if other.params != self.params:
            raise ValueError("cannot merge sketches with different parameters")
        self._reserve(other._rows)
        self._table += other._table
        self._rows += other._rows
        return self

    def copy(self) -> Self:
        """An independent copy."""
        return type(self).from_arrays(self.params, self._table.copy(), self._rows.copy())

    def _estimate_table(self) -> npt.NDArray[np.integer]:
        """The table the estimator gathers row sums from."""
        return self._table

    @abstractmethod
    def _counts(self, sums: npt.NDArray[np.float64], n: int) -> npt.NDArray[np.float64]:
        """Unbiased counts from the gathered row sums (the mechanism's eq. 2)."""

    def estimate(self, candidates: Sequence[Item]) -> FrequencyEstimate:
        """Estimate each candidate's count (eq. 2) with its standard error."""
        cands = tuple(candidates)
        return self.estimate_fingerprinted(cands, self.params.hash_family.fingerprint(list(cands)))

    def estimate_fingerprinted(
        self, candidates: tuple[Item, ...], fp: Fingerprints
    ) -> FrequencyEstimate:
        """As :meth:`estimate`, for candidates whose fingerprints are already known."""
        p = self.params
        n = self.n
        sums = gather_row_sums([self._estimate_table()], p.hash_family, fp, p.m)[0]
        counts = self._counts(sums.astype(np.float64), n)
        stderr = plugin_stderr(lambda f, f2o: p.variance(n, f, f2o), counts, n)
        return FrequencyEstimate(candidates, counts, stderr, n)

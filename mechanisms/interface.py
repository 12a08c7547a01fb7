"""The one interface every mechanism implements: its codec, its sketch, its fingerprint.

A :class:`Mechanism` parses a report from its wire form (naming the field at fault), decodes
stored payloads and columns into a report batch, builds and restores its :class:`Sketch`, and
describes itself; its :class:`Fingerprint` identifies it. Callers hold a ``Mechanism`` and never
ask which one it is.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Protocol, Self, runtime_checkable

import numpy as np
import numpy.typing as npt

from dp_governor.mechanisms.estimate import DiscoveredWord, FrequencyEstimate
from dp_governor.mechanisms.hashing import HashFamily
from dp_governor.mechanisms.randomness import Coins

__all__ = [
    "Arrays",
    "Discovering",
    "Fingerprint",
    "Mechanism",
    "Report",
    "Reports",
    "Sketch",
]

Arrays = dict[str, npt.NDArray[Any]]
_FAMILY_PREFIX: Final = "f1-"


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """A randomizer's identity: its canonical parameters and the two digests taken of them.

    ``family_id`` is the published form (docs/device.md, section 6); ``params`` is the key the
    service files reports and sketches under (the same parameters in the JSON spacing of the
    first release: the inbox seal's keys and the row tags bind it, so it never changes).
    """

    text: str
    family_id: str
    params: str

    @classmethod
    def of(cls, parameters: Mapping[str, Any]) -> Fingerprint:
        """The fingerprint of canonical parameters (keys sorted, floats as ``repr``)."""
        text = json.dumps(parameters, sort_keys=True, separators=(",", ":"))
        family = _FAMILY_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:16]
        stored = hashlib.sha256(json.dumps(parameters, sort_keys=True).encode()).hexdigest()
        return cls(text, family, stored)


class Report(Protocol):
    """One report, as a device sends it."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON body."""
        ...


class Reports(Protocol):
    """A batch of reports as numpy columns."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Any]: ...

    def columns(self) -> Arrays:
        """Named columns: 1-d integers, or 2-d ``uint8`` rows of packed bits."""
        ...

    def to_dicts(self) -> list[dict[str, Any]]:
        """The JSON bodies of all reports."""
        ...


class Sketch(Protocol):
    """A server-side sketch: integer state that reports fold into and sketches add to."""

    @property
    def n(self) -> int:
        """The number of reports folded in."""
        ...

    def add(self, reports: Any, /) -> Self:
        """Fold a report or a batch of this mechanism's reports in."""
        ...

    def merge(self, other: Self, /) -> Self:
        """Add another sketch of the same parameters."""
        ...

    def to_arrays(self) -> Arrays:
        """The whole state as named arrays (what persists and what crosses processes)."""
        ...

    def estimate(self, candidates: Sequence[Any], /) -> FrequencyEstimate:
        """Estimated counts of ``candidates`` with their standard errors."""
        ...


@runtime_checkable
class Discovering(Sketch, Protocol):
    """A sketch that also finds the popular values it was not told (SFP)."""

    def discover_detailed(
        self, top_fragments: int = ..., threshold: float | None = None
    ) -> list[DiscoveredWord]:
        """The values found above ``threshold``, most popular first."""
        ...

    def publication_threshold(self, threshold: float | None = None) -> float:
        """The estimated count a value needs to be published (``threshold``, or the noise's)."""
        ...


class Mechanism(Protocol):
    """An LDP frequency mechanism: parameters, codec, sketch and identity."""

    name: ClassVar[str]
    BODY_SHAPE: ClassVar[dict[str, Any]]
    BODY_DESCRIPTION: ClassVar[str]

    @property
    def epsilon(self) -> float:
        """The privacy loss of one report."""
        ...

    @property
    def k(self) -> int:
        """The (word) sketch's number of rows."""
        ...

    @property
    def m(self) -> int:
        """The (word) sketch's number of buckets."""
        ...

    @property
    def hash_family(self) -> HashFamily:
        """The keyed hash family shared by devices and server."""
        ...

    @property
    def fingerprint(self) -> Fingerprint:
        """The mechanism's identity (published ``family_id`` and stored parameter key)."""
        ...

    def parameters(self) -> dict[str, Any]:
        """What decides how a report is built and folded, as JSON."""
        ...

    def body_schema(self) -> dict[str, Any]:
        """The JSON schema of one report body (without the ``family`` field)."""
        ...

    def report_schema(self) -> dict[str, Any]:
        """The JSON schema of one report body, with the optional ``family`` field."""
        ...

    def describe(self) -> dict[str, Any]:
        """The published description: parameters, hash family, ``family_id``, report schema."""
        ...

    def parse_report(self, data: object, prefix: str = "") -> Report:
        """A report from its JSON body; :class:`InvalidReport` names the field at fault."""
        ...

    def decode(self, payloads: Iterable[str | bytes]) -> Reports:
        """Stored JSON payloads (validated at ingestion) as one batch."""
        ...

    def from_columns(self, columns: Mapping[str, np.ndarray]) -> Reports:
        """A batch from the columns of :meth:`Reports.columns`."""
        ...

    def sketch(self) -> Sketch:
        """An empty sketch for these parameters."""
        ...

    def plausibility(self, z: float) -> Callable[[Report], bool] | None:
        """A test that one report is plausible under these parameters, at ``z`` deviations.

        A device built with other parameters (another epsilon) sends reports that fail it;
        ``None``: no single report of this mechanism is implausible (HCMS's one bit).
        """
        ...

    def sketch_from_arrays(self, arrays: Mapping[str, np.ndarray]) -> Sketch:
        """The sketch of :meth:`Sketch.to_arrays` (validated)."""
        ...

    def privatize(self, values: Any, *, rng: np.random.Generator) -> Reports:
        """Privatize a batch of values with randomness from ``rng``."""
        ...

    def privatize_one(self, value: Any, *, coins: Coins = ...) -> Report:
        """Privatize one value with the OS CSPRNG."""
        ...

    def audit_event(self, reports: Any, x: Any, x_prime: Any, /) -> npt.NDArray[np.bool_]:
        """Whether each report falls in the empirical audit's worst-case event for ``x`` vs ``x'``.

        The event whose probability ratio under the two inputs is ``e^epsilon`` exactly
        (:mod:`dp_governor.mechanisms.empirical_audit`).
        """
        ...

    def enumerated_loss(self) -> float:
        """The exact privacy loss of the randomizer at a size small enough to enumerate."""
        ...

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, Any], hash_family: HashFamily) -> Self:
        """The mechanism of :meth:`parameters` (as published or stored) and a hash family."""
        ...

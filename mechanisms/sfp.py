"""Apple's Sequence Fragment Puzzle (SFP): discovering popular words unknown to the server.

Client (Algorithm 9): pad or truncate the word ``s`` to 10 characters, pick a fragment start
``position`` uniformly from ``{0, 2, 4, 6, 8}`` (the paper's 1-based ``{1, 3, 5, 7, 9}``), and
send (a) the CMS report of the full word under ``(epsilon_word, k, m)`` and (b) the CMS report of
the fragment ``r = puzzle(s) || s[position:position+2]`` under ``(epsilon_fragment, k', m')``,
with ``position`` in clear (it does not depend on the data). ``puzzle`` is an 8-bit keyed hash of
the whole word. Basic composition makes the report ``(epsilon_word + epsilon_fragment)``-LDP
(Theorem 4.5); Apple's QuickType deployment uses 2 + 6 = 8.

Server (Algorithm 10): one CMS sketch for the words and one per fragment position (each
estimating within its own ``n = |S_position|``). Discovery takes, per position, the
``top_fragments`` best ``(piece, two characters)`` pairs out of ``256 * |alphabet|**2``, joins them
on the puzzle piece into candidate words, keeps only candidates whose own puzzle piece equals
the piece they were joined on, and estimates those with the word sketch; words above the
publication ``threshold`` are returned. ``top_fragments`` is the paper's per-position T; the
paper's other T (publication threshold) is ``threshold`` here.
"""

from __future__ import annotations

import itertools
import string
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Self

import numpy as np
import numpy.typing as npt

from dp_governor.mechanisms._base import Described, cms_body_schema, load_bodies
from dp_governor.mechanisms._validation import (
    InvalidReport,
    check_epsilon,
    check_int,
    report_fields,
)
from dp_governor.mechanisms.cms import CMS, CmsReport, CmsReports, CmsSketch
from dp_governor.mechanisms.estimate import DiscoveredWord, FrequencyEstimate, gather_row_sums
from dp_governor.mechanisms.hashing import MAX_ROWS, HashFamily, factorize
from dp_governor.mechanisms.interface import Arrays, Report
from dp_governor.mechanisms.randomness import OS_COINS, Coins, os_randbelow

__all__ = [
    "PAD",
    "POSITIONS",
    "SFP",
    "WORD_LENGTH",
    "DiscoveredWord",
    "SfpReport",
    "SfpReports",
    "SfpSketch",
]

WORD_LENGTH: Final = 10
FRAGMENT_LENGTH: Final = 2
POSITIONS: Final = (0, 2, 4, 6, 8)
PAD: Final = " "
PUZZLE_BUCKETS: Final = 256
DEFAULT_ALPHABET: Final = string.ascii_lowercase + PAD
DEFAULT_TOP_FRAGMENTS: Final = 64
DEFAULT_THRESHOLD_Z: Final = 4.0
MAX_DISCOVERY_CANDIDATES: Final = 1_000_000


def normalize_word(word: str) -> str:
    """Pad with spaces or truncate to exactly 10 characters.

    >>> normalize_word("bae"), normalize_word("Despacito!!")
    ('bae       ', 'Despacito!')
    """
    if not isinstance(word, str):
        raise TypeError(f"SFP words must be str, got {type(word).__name__}")
    return word[:WORD_LENGTH].ljust(WORD_LENGTH, PAD)


def fragment_item(piece: int, pair: str) -> bytes:
    """The fragment that is sketched: the puzzle byte followed by the two characters (UTF-8)."""
    return bytes((piece,)) + pair.encode("utf-8")


@dataclass(frozen=True, slots=True)
class SfpReport:
    """One SFP report: the word's CMS report, the fragment's, and the fragment's start."""

    word: CmsReport
    fragment: CmsReport
    position: int

    def to_dict(self) -> dict[str, Any]:
        """The JSON body ``{"word": <CMS body>, "fragment": <CMS body>, "position": int}``."""
        return {
            "word": self.word.to_dict(),
            "fragment": self.fragment.to_dict(),
            "position": self.position,
        }


@dataclass(frozen=True, slots=True, eq=False)
class SfpReports:
    """A batch of SFP reports: word and fragment CMS batches and the positions (int64)."""

    word: CmsReports
    fragment: CmsReports
    position: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.position.shape[0])

    def __getitem__(self, i: int) -> SfpReport:
        return SfpReport(self.word[i], self.fragment[i], int(self.position[i]))

    def __iter__(self) -> Iterator[SfpReport]:
        return (self[i] for i in range(len(self)))

    def to_dicts(self) -> list[dict[str, Any]]:
        """The JSON bodies of all reports."""
        return [r.to_dict() for r in self]

    def columns(self) -> Arrays:
        """The word's and the fragment's CMS columns (``word_j``, ...) and ``position``."""
        return {
            "word_j": self.word.j,
            "word_bits": self.word.bits,
            "fragment_j": self.fragment.j,
            "fragment_bits": self.fragment.bits,
            "position": self.position,
        }

    @classmethod
    def from_reports(cls, reports: Sequence[SfpReport], m: int, m_fragment: int) -> SfpReports:
        """Stack single reports into a batch."""
        return cls(
            CmsReports.from_reports([r.word for r in reports], m),
            CmsReports.from_reports([r.fragment for r in reports], m_fragment),
            np.fromiter((r.position for r in reports), dtype=np.int64, count=len(reports)),
        )


def sfp_body_schema(
    word: tuple[int, int] | None = None, fragment: tuple[int, int] | None = None
) -> dict[str, Any]:
    """The JSON schema of an SFP report: two CMS rows and the fragment's start.

    Each row bounded by its ``(k, m)`` when given; without parameters, the shape of every SFP
    report (the OpenAPI document's).
    """
    return {
        "type": "object",
        "required": ["word", "fragment", "position"],
        "additionalProperties": False,
        "properties": {
            "word": cms_body_schema(*(word or (None, None)))
            | {"description": "The whole word's CMS report (the word sketch's k, m)."},
            "fragment": cms_body_schema(*(fragment or (None, None)))
            | {
                "description": "The fragment's CMS report (the fragment sketches' k_fragment,"
                " m_fragment)."
            },
            "position": {
                "type": "integer",
                "enum": list(POSITIONS),
                "description": "Where the fragment starts.",
            },
        },
    }


@dataclass(frozen=True, slots=True)
class SFP(Described):
    """SFP parameters (frozen, validated) and the mechanism's device and server entry points.

    Attributes:
        epsilon_word: epsilon of the full-word CMS report.
        epsilon_fragment: epsilon of the fragment CMS report.
        k, m: the word sketch's rows and buckets.
        k_fragment, m_fragment: each fragment sketch's rows and buckets.
        hash_family: the root family; word, fragment and puzzle families are derived from it.
        alphabet: the characters discovery enumerates (must contain the pad, a space).
    """

    epsilon_word: float
    epsilon_fragment: float
    k: int = 2048
    m: int = 1024
    k_fragment: int = 2048
    m_fragment: int = 1024
    hash_family: HashFamily = field(default_factory=HashFamily)
    alphabet: str = DEFAULT_ALPHABET

    name: ClassVar[str] = "sfp"
    BODY_SHAPE: ClassVar[dict[str, Any]] = sfp_body_schema()
    BODY_DESCRIPTION: ClassVar[str] = (
        "An SFP report (mechanism `sfp`): the word's and a fragment's CMS rows."
    )

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "epsilon_word", check_epsilon("epsilon_word", self.epsilon_word))
        set_(self, "epsilon_fragment", check_epsilon("epsilon_fragment", self.epsilon_fragment))
        set_(self, "k", check_int("k", self.k, 1, MAX_ROWS))
        set_(self, "m", check_int("m", self.m, 2, 1 << 16))
        set_(self, "k_fragment", check_int("k_fragment", self.k_fragment, 1, MAX_ROWS))
        set_(self, "m_fragment", check_int("m_fragment", self.m_fragment, 2, 1 << 16))
        if not isinstance(self.hash_family, HashFamily):
            raise TypeError(f"`hash_family` must be a HashFamily, got {self.hash_family!r}")
        if not isinstance(self.alphabet, str) or PAD not in self.alphabet:
            raise ValueError(f"`alphabet` must be a str containing the pad {PAD!r}")
        if len(set(self.alphabet)) != len(self.alphabet):
            raise ValueError(f"`alphabet` has repeated characters: {self.alphabet!r}")

    @property
    def epsilon(self) -> float:
        """Total epsilon of one report: ``epsilon_word + epsilon_fragment`` (basic composition)."""
        return self.epsilon_word + self.epsilon_fragment

    @property
    def word_cms(self) -> CMS:
        """The CMS that privatizes and sketches full words."""
        return CMS(self.epsilon_word, self.k, self.m, self.hash_family.derive("sfp/word"))

    @property
    def fragment_cms(self) -> CMS:
        """The CMS that privatizes and sketches fragments (one sketch per position)."""
        return CMS(
            self.epsilon_fragment,
            self.k_fragment,
            self.m_fragment,
            self.hash_family.derive("sfp/fragment"),
        )

    @property
    def puzzle_family(self) -> HashFamily:
        """The family whose row 0 mod 256 is the puzzle piece ``h(s)``."""
        return self.hash_family.derive("sfp/puzzle")

    def puzzle(self, words: Sequence[str]) -> npt.NDArray[np.int64]:
        """The 8-bit puzzle piece of each (normalised) word."""
        norm = [normalize_word(w) for w in words]
        return self.puzzle_family.hash(norm, np.zeros(len(norm), dtype=np.int64), PUZZLE_BUCKETS)

    # -- device side ---------------------------------------------------------------------------

    def _fragments(self, words: list[str], positions: npt.NDArray[np.int64]) -> list[bytes]:
        pieces = self.puzzle(words).tolist()
        return [
            fragment_item(pc, w[p : p + FRAGMENT_LENGTH])
            for w, pc, p in zip(words, pieces, positions.tolist(), strict=True)
        ]

    def privatize(
        self, words: Sequence[str] | npt.NDArray[np.object_], *, rng: np.random.Generator
    ) -> SfpReports:
        """Privatize a batch of words (simulations and tests); randomness from ``rng``."""
        distinct, inverse = factorize(words)
        norm = [normalize_word(str(w)) for w in distinct]
        pos_index = rng.integers(0, len(POSITIONS), size=len(inverse), dtype=np.int64)
        positions = np.asarray(POSITIONS, dtype=np.int64)[pos_index]
        word_reports = self.word_cms.privatize_indices(norm, inverse, rng=rng)
        # Fragments depend on (word, position): factorize the pairs, at most 5 per word.
        pair_code = inverse * len(POSITIONS) + pos_index
        codes, pair_inverse = np.unique(pair_code, return_inverse=True)
        frag_words = [norm[c // len(POSITIONS)] for c in codes.tolist()]
        frag_pos = np.asarray(POSITIONS, dtype=np.int64)[codes % len(POSITIONS)]
        frag_items = self._fragments(frag_words, frag_pos)
        frag_reports = self.fragment_cms.privatize_indices(frag_items, pair_inverse, rng=rng)
        return SfpReports(word_reports, frag_reports, positions)

    def privatize_one(self, word: str, *, coins: Coins = OS_COINS) -> SfpReport:
        """Privatize one word on a device, drawing only from the OS CSPRNG (``secrets``).

        ``coins`` replays a test vector's draws (docs/device.md): the position's index, then
        the word's CMS draws, then the fragment's.
        """
        norm = normalize_word(word)
        position = POSITIONS[os_randbelow(len(POSITIONS), coins)]
        frag = self._fragments([norm], np.array([position], dtype=np.int64))[0]
        word_report = self.word_cms.privatize_one(norm, coins=coins)
        return SfpReport(word_report, self.fragment_cms.privatize_one(frag, coins=coins), position)

    # -- codec and server side -----------------------------------------------------------------

    def parameters(self) -> dict[str, Any]:
        """Mechanism, both epsilons, both sketches' ``k`` and ``m``, alphabet and hash family."""
        return {
            "mechanism": self.name,
            "epsilon_word": self.epsilon_word,
            "epsilon_fragment": self.epsilon_fragment,
            "k": self.k,
            "m": self.m,
            "k_fragment": self.k_fragment,
            "m_fragment": self.m_fragment,
            "alphabet": self.alphabet,
            "hash_family": self.hash_family.to_dict(),
        }

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, Any], hash_family: HashFamily) -> Self:
        """The mechanism of :meth:`parameters` and a hash family (alphabet: the default)."""
        return cls(
            parameters["epsilon_word"],
            parameters["epsilon_fragment"],
            parameters["k"],
            parameters["m"],
            parameters["k_fragment"],
            parameters["m_fragment"],
            hash_family,
            parameters.get("alphabet") or DEFAULT_ALPHABET,
        )

    def enumerated_loss(self) -> float:
        """The exact loss of its two CMS parts at an enumerable size, composed."""
        return self.word_cms.enumerated_loss() + self.fragment_cms.enumerated_loss()

    def audit_event(self, reports: SfpReports, x: str, x_prime: str) -> npt.NDArray[np.bool_]:
        """The audit's worst-case event: the word part's CMS event and the fragment part's.

        The two parts are independent, so the probability ratio is ``e^(eps_w + eps_f)``.
        """
        words = [normalize_word(x), normalize_word(x_prime)]
        word = self.word_cms.audit_event(reports.word, words[0], words[1])
        frag = np.zeros(len(reports), dtype=bool)
        pieces = self.puzzle(words).tolist()
        for position in POSITIONS:
            at = reports.position == position
            if not at.any():
                continue
            items = [
                fragment_item(pc, w[position : position + 2])
                for pc, w in zip(pieces, words, strict=True)
            ]
            frag[at] = self.fragment_cms.audit_event(reports.fragment.select(at), *items)
        out: npt.NDArray[np.bool_] = word & frag
        return out

    def body_schema(self) -> dict[str, Any]:
        """``{"word", "fragment", "position"}``: two CMS rows and the fragment's start."""
        return sfp_body_schema((self.k, self.m), (self.k_fragment, self.m_fragment))

    def decode(self, payloads: Iterable[str | bytes]) -> SfpReports:
        """Stored JSON payloads (validated at ingestion) as one batch."""
        bodies = load_bodies(payloads)
        return SfpReports(
            self.word_cms.decode_bodies([b["word"] for b in bodies]),
            self.fragment_cms.decode_bodies([b["fragment"] for b in bodies]),
            np.fromiter((b["position"] for b in bodies), dtype=np.int64, count=len(bodies)),
        )

    def from_columns(self, columns: Mapping[str, np.ndarray]) -> SfpReports:
        """The batch of :meth:`SfpReports.columns`."""
        return SfpReports(
            CmsReports(np.asarray(columns["word_j"], dtype=np.int64), columns["word_bits"], self.m),
            CmsReports(
                np.asarray(columns["fragment_j"], dtype=np.int64),
                columns["fragment_bits"],
                self.m_fragment,
            ),
            np.asarray(columns["position"], dtype=np.int64),
        )

    def sketch(self) -> SfpSketch:
        """An empty server-side sketch set (word sketch plus one per fragment position)."""
        return SfpSketch(self)

    def sketch_from_arrays(self, arrays: Mapping[str, np.ndarray]) -> SfpSketch:
        """The sketch of :meth:`SfpSketch.to_arrays` (validated)."""
        sk = SfpSketch(self)
        sk.word = CmsSketch.from_arrays(self.word_cms, arrays["word_counts"], arrays["word_rows"])
        frag = self.fragment_cms
        sk.fragments = tuple(
            CmsSketch.from_arrays(frag, arrays[f"frag{i}_counts"], arrays[f"frag{i}_rows"])
            for i in range(len(sk.fragments))
        )
        return sk

    def plausibility(self, z: float) -> Callable[[Report], bool]:
        """Whether both of a report's CMS parts are plausible (:meth:`CMS.plausibility`)."""
        word, fragment = self.word_cms.plausibility(z), self.fragment_cms.plausibility(z)

        def plausible(report: Report) -> bool:
            assert isinstance(report, SfpReport)
            return word(report.word) and fragment(report.fragment)

        return plausible

    def parse_report(self, data: object, prefix: str = "") -> SfpReport:
        """Validate a JSON report body against these parameters."""
        body = report_fields(data, {"word", "fragment", "position"}, prefix)
        position = body["position"]
        strict_int = isinstance(position, int) and not isinstance(position, bool)
        if not strict_int or position not in POSITIONS:
            raise InvalidReport(
                prefix + "position", f"must be one of {POSITIONS}, got {position!r}"
            )
        return SfpReport(
            self.word_cms.parse_report(body["word"], prefix + "word."),
            self.fragment_cms.parse_report(body["fragment"], prefix + "fragment."),
            position,
        )


class SfpSketch:
    """Server-side SFP state: a word CMS sketch and one fragment CMS sketch per position."""

    __slots__ = ("fragments", "params", "word")

    def __init__(self, params: SFP) -> None:
        self.params = params
        self.word: CmsSketch = params.word_cms.sketch()
        fragment_cms = params.fragment_cms
        self.fragments: tuple[CmsSketch, ...] = tuple(fragment_cms.sketch() for _ in POSITIONS)

    @property
    def n(self) -> int:
        """The number of reports folded in."""
        return self.word.n

    def add(self, reports: SfpReports | SfpReport) -> Self:
        """Fold reports in, routing fragments by position; returns the sketch so calls chain."""
        if isinstance(reports, SfpReport):
            reports = SfpReports.from_reports([reports], self.params.m, self.params.m_fragment)
        pos = np.asarray(reports.position)
        if not np.isin(pos, POSITIONS).all():
            raise ValueError(f"report positions must be in {POSITIONS}")
        self.word.add(reports.word)
        for i, p in enumerate(POSITIONS):
            self.fragments[i].add(reports.fragment.select(pos == p))
        return self

    def merge(self, other: SfpSketch) -> Self:
        """Add another SFP sketch of the same parameters; returns the sketch so calls chain."""
        if other.params != self.params:
            raise ValueError("cannot merge sketches with different parameters")
        self.word.merge(other.word)
        for mine, theirs in zip(self.fragments, other.fragments, strict=True):
            mine.merge(theirs)
        return self

    def to_arrays(self) -> Arrays:
        """The word sketch's arrays and each position's (``frag0_counts``, ``frag0_rows``, ...)."""
        arrays = {"word_counts": self.word.counts, "word_rows": self.word.row_counts}
        for i, frag in enumerate(self.fragments):
            arrays[f"frag{i}_counts"] = frag.counts
            arrays[f"frag{i}_rows"] = frag.row_counts
        return {name: np.asarray(a) for name, a in arrays.items()}

    def estimate(self, candidates: Sequence[str]) -> FrequencyEstimate:
        """Estimate full-word counts (candidates are padded/truncated to 10 characters)."""
        norm = [normalize_word(c) for c in candidates]
        est = self.word.estimate(norm)
        return FrequencyEstimate(tuple(candidates), est.counts, est.stderr, est.n)

    def fragment_estimates(self) -> tuple[list[bytes], npt.NDArray[np.float64]]:
        """Estimate every ``(piece, pair)`` fragment at each position: items and a (5, F) array."""
        p = self.params
        pairs = ["".join(t) for t in itertools.product(p.alphabet, repeat=FRAGMENT_LENGTH)]
        items = [fragment_item(w, q) for w in range(PUZZLE_BUCKETS) for q in pairs]
        cms = p.fragment_cms
        fp = cms.hash_family.fingerprint_bytes(items)
        sums = gather_row_sums([s.counts for s in self.fragments], cms.hash_family, fp, cms.m)
        n = np.array([s.n for s in self.fragments], dtype=np.float64)[:, None]
        c = cms.c
        counts = (cms.m / (cms.m - 1)) * (c * sums - (c - 1.0) * n / 2.0 - n / cms.m)
        return items, counts

    def discover_detailed(
        self, top_fragments: int = DEFAULT_TOP_FRAGMENTS, threshold: float | None = None
    ) -> list[DiscoveredWord]:
        """Discover popular words (Algorithm 10), with estimates, puzzle pieces and fragments.

        Args:
            top_fragments: how many fragments per position enter the join (the paper's T).
            threshold: publish words whose estimated count is at least this; by default
                ``4`` standard errors of a zero-count word (the noise floor).
        """
        check_int("top_fragments", top_fragments, 1, 1 << 16)
        if self.n == 0:
            return []  # nothing to discover (and the fragment scan below costs seconds)
        p = self.params
        items, counts = self.fragment_estimates()
        per_piece: list[defaultdict[int, list[str]]] = []
        for row in counts:
            best = np.argsort(-row, kind="stable")[:top_fragments]
            best = best[row[best] > 0.0]  # a fragment estimated at or below zero is not popular
            table: defaultdict[int, list[str]] = defaultdict(list)
            for i in best.tolist():
                table[items[i][0]].append(items[i][1:].decode("utf-8"))
            per_piece.append(table)
        candidates: list[tuple[str, int, tuple[str, ...]]] = []
        total = 0
        for piece in sorted(set.intersection(*(set(t) for t in per_piece))):
            options = [t[piece] for t in per_piece]
            total += int(np.prod([len(o) for o in options]))
            if total > MAX_DISCOVERY_CANDIDATES:
                raise ValueError(
                    f"discovery would estimate over {MAX_DISCOVERY_CANDIDATES} candidate words;"
                    f" lower `top_fragments` (got {top_fragments})"
                )
            for frags in itertools.product(*options):
                candidates.append(("".join(frags), piece, frags))
        if not candidates:
            return []
        words = [w for w, _, _ in candidates]
        consistent = p.puzzle(words) == np.array([pc for _, pc, _ in candidates])
        kept = [cand for cand, ok in zip(candidates, consistent.tolist(), strict=True) if ok]
        if not kept:
            return []
        est = self.word.estimate([w for w, _, _ in kept])
        threshold = self.publication_threshold(threshold)
        found = [
            DiscoveredWord(w.rstrip(PAD), float(cnt), float(se), pc, frags)
            for (w, pc, frags), cnt, se in zip(kept, est.counts, est.stderr, strict=True)
            if cnt >= threshold
        ]
        found.sort(key=lambda d: -d.count)
        return found

    def publication_threshold(self, threshold: float | None = None) -> float:
        """``threshold``, or 4 standard errors of a word nobody sent (the noise floor)."""
        if threshold is not None:
            return threshold
        floor = self.params.word_cms.variance(self.n, 0.0, 0.0)
        return DEFAULT_THRESHOLD_Z * float(np.sqrt(floor))

    def discover(
        self, top_fragments: int = DEFAULT_TOP_FRAGMENTS, threshold: float | None = None
    ) -> list[tuple[str, float]]:
        """Discovered words and their estimated counts, most popular first."""
        return [(d.word, d.count) for d in self.discover_detailed(top_fragments, threshold)]

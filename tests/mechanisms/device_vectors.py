"""The device test vectors of docs/device.md, computed by the Python implementation.

``python -m tests.mechanisms.device_vectors`` rewrites ``docs/vectors/*.json`` from this module;
``tests/mechanisms/test_device_vectors.py`` checks that the files are what it computes and
replays them through the device path. The numbers in the files come only from here: never edit
them by hand. Coins are drawn from generators with fixed seeds and recorded as the device
consumed them (docs/device.md, "Coins").
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from dp_governor.mechanisms import CMS, HCMS, SFP, HashFamily, describe, family_id
from dp_governor.mechanisms.hashing import MERSENNE_31
from dp_governor.mechanisms.published import family_text
from dp_governor.mechanisms.randomness import flip_probability, threshold_bytes
from dp_governor.mechanisms.sfp import POSITIONS, fragment_item, normalize_word
from dp_governor.policies import PolicyCreate, mechanism_for
from tests.mechanisms.tlog_vectors import tlog

__all__ = ["FILES", "VECTORS", "RecordingCoins", "ReplayCoins", "build", "main"]

VECTORS: Final = Path(__file__).resolve().parents[2] / "docs" / "vectors"
FILES: Final = ("hashing", "flip", "families", "reports", "tlog")

# Seeds as published: zero, one whose first two hex digits are zero (the policy "uc-3"'s
# derived seed), Emoji's derived seed, and the largest.
SEEDS: Final = (
    "0" * 64,
    "00a82b5096afdb0d09414a1f1e87c1cc70e11cfd57bfda94a60eecf872b98795",
    "4493ebc6a54c870b255041fef9db1948c7d6f2ccb93b8e11090b732d8024edb1",
    "f" * 64,
)
# ASCII, empty, non-ASCII (2-, 3- and 4-byte UTF-8), composed and decomposed forms, raw bytes.
ITEMS: Final[tuple[str | bytes, ...]] = (
    "www.example.com",
    "",
    "😂",
    "é",
    "e\u0301",
    "日本語のテキスト",
    b"\x00",
    b"\xff\x00\x01",
)
ROWS: Final = (
    (2, (0, 1, 2, 3)),
    (1000, (0, 1, 2, 3, 4, 5, 6, 7)),
    (1024, (0, 1, 2, 3, 4, 5, 6, 7)),
    (32768, (0, 1, 1023, 65535)),
    (1 << 24, (0, 1, 46340, 1048575)),
)
DERIVE_LABELS: Final = ("sfp/word", "sfp/fragment", "sfp/puzzle")
EPSILONS: Final = (
    1e-06,
    0.052,  # JavaScript's Math.exp(-0.052) is one unit in the last place off glibc's
    0.086,
    0.125,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    8.0,
    10.0,
    20.0,
)


class RecordingCoins:
    """Coins from a seeded generator, recorded in the order the device consumes them."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self.draws: list[dict[str, Any]] = []

    def randbelow(self, exclusive_upper_bound: int, /) -> int:
        """A uniform integer in ``[0, exclusive_upper_bound)``, recorded."""
        value = int(self._rng.integers(0, exclusive_upper_bound))
        self.draws.append({"below": exclusive_upper_bound, "value": value})
        return value

    def token_bytes(self, nbytes: int, /) -> bytes:
        """``nbytes`` random bytes, recorded as hex."""
        raw = self._rng.bytes(nbytes)
        self.draws.append({"bytes": raw.hex()})
        return raw


class ReplayCoins:
    """Coins that replay recorded draws and fail on any other request."""

    def __init__(self, draws: Sequence[dict[str, Any]]) -> None:
        self._draws = list(draws)
        self._next = 0

    def _take(self, kind: str) -> dict[str, Any]:
        if self._next >= len(self._draws) or kind not in self._draws[self._next]:
            raise AssertionError(f"draw {self._next}: the device asked for {kind!r}")
        self._next += 1
        return self._draws[self._next - 1]

    def randbelow(self, exclusive_upper_bound: int, /) -> int:
        """The next recorded uniform draw; its bound must be ``exclusive_upper_bound``."""
        draw = self._take("below")
        if draw["below"] != exclusive_upper_bound:
            raise AssertionError(f"draw {self._next - 1}: bound {exclusive_upper_bound}")
        return int(draw["value"])

    def token_bytes(self, nbytes: int, /) -> bytes:
        """The next recorded bytes; there must be exactly ``nbytes`` of them."""
        raw = bytes.fromhex(self._take("bytes")["bytes"])
        if len(raw) != nbytes:
            raise AssertionError(f"draw {self._next - 1}: {nbytes} bytes, recorded {len(raw)}")
        return raw

    @property
    def exhausted(self) -> bool:
        """Whether every recorded draw was consumed."""
        return self._next == len(self._draws)


def _item(item: str | bytes) -> dict[str, Any]:
    raw = item.encode("utf-8") if isinstance(item, str) else item
    out: dict[str, Any] = {"text": item} if isinstance(item, str) else {}
    return out | {"utf8": raw.hex()}


def _hashing() -> dict[str, Any]:
    seeds = []
    for seed in SEEDS:
        family = HashFamily(int(seed, 16))
        items = []
        for item in ITEMS:
            raw = item.encode("utf-8") if isinstance(item, str) else item
            digest = hashlib.blake2b(
                raw, key=family.key, person=b"dpgov.fp.v1", digest_size=24
            ).digest()
            fp = family.fingerprint([raw])
            rows = [
                {"m": m, "j": list(js), "h": family.hash([raw] * len(js), list(js), m).tolist()}
                for m, js in ROWS
            ]
            items.append(
                _item(item)
                | {
                    "digest": digest.hex(),
                    "fingerprint": [int(fp.a[0]), int(fp.b[0]), int(fp.c[0])],
                    "rows": rows,
                }
            )
        derived = {label: family.derive(label).seed_hex for label in DERIVE_LABELS}
        seeds.append({"seed": seed, "derived": derived, "items": items})
    return {
        "algorithm": "blake2b-poly31-v1",
        "p": MERSENNE_31,
        "personalization": b"dpgov.fp.v1".hex(),
        "derive_personalization": b"dpgov.derive.v1".hex(),
        "seeds": seeds,
    }


def _flip() -> dict[str, Any]:
    cases = []
    for eps in EPSILONS:
        p = flip_probability(eps)
        t = threshold_bytes(p)
        cases.append(
            {
                "epsilon": eps,
                "p": p,
                "frexp_exponent": math.frexp(p)[1],
                "bytes": int(t.size),
                "threshold": t.tobytes().hex(),
            }
        )
    return {"cases": cases}


def _policy(name: str, **fields: Any) -> CMS | HCMS | SFP:
    """The mechanism a policy with these fields prescribes (the service's own path)."""
    return mechanism_for(
        PolicyCreate.model_validate({"name": name, "max_reports_per_day": 1} | fields)
    )


def _mechanisms() -> list[CMS | HCMS | SFP]:
    sfp = {"mechanism": "sfp", "k": 16, "m": 32, "k_fragment": 8, "m_fragment": 24}
    return [
        _policy("uc-3", mechanism="cms", k=16, m=16, epsilon_per_report=4.0),
        _policy("vectors-cms", mechanism="cms", k=5, m=20, epsilon_per_report=1.0),
        _policy("emoji", mechanism="cms", k=65536, m=64, epsilon_per_report=8.0),
        _policy("vectors-tiny", mechanism="cms", k=3, m=8, epsilon_per_report=1e-05),
        _policy("vectors-hcms", mechanism="hcms", k=16, m=64, epsilon_per_report=2.0),
        _policy("safari-energy-domains", mechanism="hcms", k=1024, m=32768, epsilon_per_report=4.0),
        _policy("vectors-hcms-max", mechanism="hcms", k=1, m=2, epsilon_per_report=20.0),
        _policy(
            "vectors-sfp", **sfp, epsilon_per_report=8.0, epsilon_word=2.0, epsilon_fragment=6.0
        ),
        _policy(
            "uc-11",
            **sfp,
            epsilon_per_report=0.000123,
            epsilon_word=0.0001,
            epsilon_fragment=0.000023,
        ),
    ]


def _families() -> dict[str, Any]:
    cases = []
    for mech in _mechanisms():
        published = describe(mech)
        cases.append(
            {
                "randomizer": {k: v for k, v in published.items() if k != "report_schema"},
                "canonical": family_text(mech),
                "family_id": family_id(mech),
            }
        )
    return {"cases": cases}


VALUES: Final = ("www.example.com", "", "😂", "e\u0301")
WORDS: Final = ("bae", "", "despacito!!", "ünïcødé😂 words", "😂" * 12)


def _trace(mech: CMS | HCMS | SFP, value: str, draws: list[dict[str, Any]]) -> dict[str, Any]:
    """Intermediate values of one report, to locate a disagreement."""
    if isinstance(mech, SFP):
        norm = normalize_word(value)
        piece = int(mech.puzzle([norm])[0])
        position = POSITIONS[draws[0]["value"]]
        frag = fragment_item(piece, norm[position : position + 2])
        word_j, frag_j = draws[1]["value"], draws[3]["value"]
        return {
            "normalized": norm,
            "puzzle": piece,
            "fragment": frag.hex(),
            "word_h": int(mech.word_cms.hash_family.hash([norm], [word_j], mech.m)[0]),
            "fragment_h": int(
                mech.fragment_cms.hash_family.hash([frag], [frag_j], mech.m_fragment)[0]
            ),
        }
    j = draws[0]["value"]
    return {"h": int(mech.hash_family.hash([value], [j], mech.m)[0])}


def _reports() -> dict[str, Any]:
    cases = []
    seed = 0
    for mech in _mechanisms():
        values = WORDS if isinstance(mech, SFP) else VALUES
        published = {k: v for k, v in describe(mech).items() if k != "report_schema"}
        for value in values:
            coins = RecordingCoins(seed)
            seed += 1
            body = mech.privatize_one(value, coins=coins).to_dict()
            report: dict[str, Any] = {**body, "family": family_id(mech)}
            cases.append(
                {
                    "randomizer": published,
                    "value": value,
                    "coins": coins.draws,
                    "trace": _trace(mech, value, coins.draws),
                    "report": report,
                }
            )
    return {"cases": cases}


def build() -> dict[str, dict[str, Any]]:
    """Every vector file's content, by name."""
    return {
        "hashing": _hashing(),
        "flip": _flip(),
        "families": _families(),
        "reports": _reports(),
        "tlog": tlog(),
    }


def dumps(content: dict[str, Any]) -> str:
    """A vector file's text: sorted keys, one-space indent, UTF-8, a final newline."""
    return json.dumps(content, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> None:
    """Rewrite ``docs/vectors/*.json``."""
    VECTORS.mkdir(parents=True, exist_ok=True)
    for name, content in build().items():
        (VECTORS / f"{name}.json").write_text(dumps(content), encoding="utf-8")


if __name__ == "__main__":
    main()

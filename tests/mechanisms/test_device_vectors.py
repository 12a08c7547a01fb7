"""docs/vectors/ holds what the Python implementation computes, and replays through it exactly."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from dp_governor.mechanisms import HashFamily, family_id, from_published
from dp_governor.mechanisms.published import family_text
from dp_governor.mechanisms.randomness import flip_probability, threshold_bytes
from tests.mechanisms.device_vectors import FILES, VECTORS, ReplayCoins, build, dumps

REGENERATE = "regenerate them with `python -m tests.mechanisms.device_vectors`"


def _load(name: str) -> dict[str, Any]:
    content: dict[str, Any] = json.loads((VECTORS / f"{name}.json").read_text(encoding="utf-8"))
    return content


def test_the_files_are_exactly_what_the_generator_computes() -> None:
    built = build()
    assert sorted(built) == sorted(FILES)
    for name, content in built.items():
        text = (VECTORS / f"{name}.json").read_text(encoding="utf-8")
        assert text == dumps(content), f"docs/vectors/{name}.json is stale: {REGENERATE}"


def test_hash_vectors() -> None:
    data = _load("hashing")
    person = bytes.fromhex(data["personalization"])
    assert len(data["seeds"]) >= 4 and any(s["seed"].startswith("0") for s in data["seeds"])
    for case in data["seeds"]:
        seed = case["seed"]
        assert len(seed) == 64
        family = HashFamily.from_dict({"algorithm": data["algorithm"], "seed": seed})
        key = bytes.fromhex(seed)
        assert family.key == key and family.seed_hex == seed
        for label, derived in case["derived"].items():
            assert family.derive(label).seed_hex == derived
            child = hashlib.blake2b(
                label.encode(), key=key, person=b"dpgov.derive.v1", digest_size=32
            )
            assert child.hexdigest() == derived
        for item in case["items"]:
            raw = bytes.fromhex(item["utf8"])
            if "text" in item:
                assert item["text"].encode("utf-8") == raw
            digest = hashlib.blake2b(raw, key=key, person=person, digest_size=24).digest()
            assert digest.hex() == item["digest"]
            words = [int.from_bytes(digest[i : i + 8], "little") % data["p"] for i in (0, 8, 16)]
            fp = family.fingerprint([raw])
            assert words == item["fingerprint"] == [int(fp.a[0]), int(fp.b[0]), int(fp.c[0])]
            a, b, c = words
            for row in item["rows"]:
                m = row["m"]
                want = [((a + b * j + c * j * j) % data["p"]) % m for j in row["j"]]
                assert row["h"] == want == family.hash([raw] * len(want), row["j"], m).tolist()


def test_flip_vectors() -> None:
    for case in _load("flip")["cases"]:
        p = flip_probability(case["epsilon"])
        assert p == case["p"], case
        t = threshold_bytes(p)
        assert t.size == case["bytes"] and t.tobytes().hex() == case["threshold"], case


def test_family_vectors() -> None:
    cases = _load("families")["cases"]
    assert {c["randomizer"]["mechanism"] for c in cases} == {"cms", "hcms", "sfp"}
    for case in cases:
        mech = from_published(case["randomizer"])
        assert family_text(mech) == case["canonical"]
        assert family_id(mech) == case["family_id"] == case["randomizer"]["family_id"]
        digest = hashlib.sha256(case["canonical"].encode("ascii")).hexdigest()
        assert case["family_id"] == "f1-" + digest[:16]


@pytest.mark.parametrize("index", range(len(_load("reports")["cases"])))
def test_report_vectors_replay_through_the_device_path(index: int) -> None:
    case = _load("reports")["cases"][index]
    mech = from_published(case["randomizer"])
    coins = ReplayCoins(case["coins"])
    body = mech.privatize_one(case["value"], coins=coins).to_dict()
    assert coins.exhausted
    assert body | {"family": family_id(mech)} == case["report"]
    # and the server accepts it as it is
    mech.parse_report({k: v for k, v in case["report"].items() if k != "family"})

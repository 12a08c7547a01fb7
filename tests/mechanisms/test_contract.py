"""One contract, every mechanism: frozen validated parameters, determinism, additive sketches."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import numpy as np
import orjson
import pytest

from dp_governor.mechanisms import CMS, HCMS, SFP, HashFamily, InvalidReport, Mechanism, Sketch

MECHANISMS: list[Any] = [
    CMS(epsilon=4.0, k=64, m=32, hash_family=HashFamily(1)),
    HCMS(epsilon=4.0, k=64, m=32, hash_family=HashFamily(1)),
    SFP(epsilon_word=2.0, epsilon_fragment=6.0, k=32, m=64, k_fragment=32, m_fragment=64),
]
IDS = ["cms", "hcms", "sfp"]
VALUES = ["apple", "banana", "cherry", "apple", "apple", "durian", "banana"] * 30


def _state(sketch: Sketch) -> list[np.ndarray]:
    """A sketch's whole state, by its arrays' names (the interface's ``to_arrays``)."""
    arrays = sketch.to_arrays()
    return [np.asarray(arrays[name]) for name in sorted(arrays)]


def _equal(a: Sketch, b: Sketch) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(_state(a), _state(b), strict=True))


@pytest.mark.parametrize("mech", MECHANISMS, ids=IDS)
def test_parameters_are_frozen(mech: Any) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        mech.k = 3
    assert dataclasses.replace(mech) == mech


@pytest.mark.parametrize("mech", MECHANISMS, ids=IDS)
def test_same_seed_same_reports(mech: Any) -> None:
    a = mech.privatize(VALUES, rng=np.random.default_rng(3))
    b = mech.privatize(VALUES, rng=np.random.default_rng(3))
    c = mech.privatize(VALUES, rng=np.random.default_rng(4))
    assert a.to_dicts() == b.to_dicts()
    assert a.to_dicts() != c.to_dicts()
    assert len(a) == len(VALUES)


@pytest.mark.parametrize("mech", MECHANISMS, ids=IDS)
def test_reports_round_trip_through_json_bodies(mech: Any) -> None:
    batch = mech.privatize(VALUES[:20], rng=np.random.default_rng(0))
    for report, body in zip(batch, batch.to_dicts(), strict=True):
        assert report.to_dict() == body
        assert mech.parse_report(body) == report
    single = mech.privatize_one("apple")
    assert mech.parse_report(single.to_dict()) == single


@pytest.mark.parametrize("mech", MECHANISMS, ids=IDS)
def test_merge_is_the_sketch_of_the_union_and_order_free(mech: Any) -> None:
    rng = np.random.default_rng(8)
    parts = [mech.privatize(VALUES[i::3], rng=rng) for i in range(3)]
    sketches = [mech.sketch().add(p) for p in parts]
    union = mech.sketch()
    for p in parts:
        union.add(p)
    left = mech.sketch().merge(sketches[0]).merge(sketches[1]).merge(sketches[2])
    right = (
        mech.sketch().merge(sketches[2]).merge(mech.sketch().merge(sketches[1]).merge(sketches[0]))
    )
    assert _equal(left, union) and _equal(right, union)
    assert left.n == len(VALUES)


@pytest.mark.parametrize("mech", MECHANISMS, ids=IDS)
def test_adding_single_reports_equals_adding_the_batch(mech: Any) -> None:
    batch = mech.privatize(VALUES[:25], rng=np.random.default_rng(2))
    one_by_one = mech.sketch()
    for report in batch:
        one_by_one.add(report)
    assert _equal(one_by_one, mech.sketch().add(batch))


@pytest.mark.parametrize("mech", MECHANISMS, ids=IDS)
def test_add_order_does_not_matter(mech: Any) -> None:
    batch = mech.privatize(VALUES, rng=np.random.default_rng(6))
    perm = np.random.default_rng(1).permutation(len(VALUES)).tolist()
    shuffled = [batch[i] for i in perm]
    s1 = mech.sketch().add(batch)
    s2 = mech.sketch()
    for r in shuffled:
        s2.add(r)
    assert _equal(s1, s2)


@pytest.mark.parametrize("mech", MECHANISMS, ids=IDS)
def test_merge_refuses_other_parameters(mech: Any) -> None:
    other = dataclasses.replace(mech, hash_family=HashFamily(999))
    with pytest.raises(ValueError, match="different parameters"):
        mech.sketch().merge(other.sketch())


@pytest.mark.parametrize("mech", MECHANISMS, ids=IDS)
def test_estimates_have_aligned_float_arrays(mech: Any) -> None:
    sketch = mech.sketch().add(mech.privatize(VALUES, rng=np.random.default_rng(0)))
    est = sketch.estimate(["apple", "zzz"])
    assert est.counts.dtype == np.float64 and est.stderr.dtype == np.float64
    assert est.counts.shape == est.stderr.shape == (2,)
    assert est.n == len(VALUES)
    assert np.all(est.stderr > 0)
    empty = mech.sketch().estimate(["apple"])
    assert empty.n == 0 and empty.counts[0] == 0.0 and empty.stderr[0] == 0.0


@pytest.mark.parametrize("mech", MECHANISMS[:2], ids=IDS[:2])
def test_folding_in_chunks_equals_the_definition(
    mech: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dp_governor.mechanisms import _bitcount, hcms

    monkeypatch.setattr(hcms, "_FOLD_CHUNK", 37)
    monkeypatch.setattr(_bitcount, "_CHUNK", 37)
    reports = mech.privatize(VALUES * 5, rng=np.random.default_rng(4))
    sketch = mech.sketch().add(reports)
    j = np.asarray(reports.j, dtype=np.int64)
    expected = np.zeros((mech.k, mech.m), dtype=np.int64)
    if isinstance(mech, HCMS):
        np.add.at(expected, (j, np.asarray(reports.l)), np.asarray(reports.bit, dtype=np.int64))
        np.testing.assert_array_equal(sketch.sums, expected)
    else:
        np.add.at(expected, j, np.unpackbits(reports.bits, axis=1, count=mech.m).astype(np.int64))
        np.testing.assert_array_equal(sketch.counts, expected)
    np.testing.assert_array_equal(sketch.row_counts, np.bincount(j, minlength=mech.k))


@pytest.mark.parametrize("mech", MECHANISMS, ids=IDS)
def test_codec_round_trips_payloads_columns_and_arrays(mech: Any) -> None:
    implementation: Mechanism = mech  # the one interface, checked by mypy
    batch = implementation.privatize(VALUES, rng=np.random.default_rng(5))
    payloads = [orjson.dumps(body) for body in batch.to_dicts()]
    assert implementation.decode(payloads).to_dicts() == batch.to_dicts()
    assert implementation.from_columns(batch.columns()).to_dicts() == batch.to_dicts()
    sketch = implementation.sketch().add(batch)
    again = implementation.sketch_from_arrays(sketch.to_arrays())
    assert _equal(again, sketch)
    assert again.n == sketch.n == len(VALUES)


@pytest.mark.parametrize("mech", MECHANISMS, ids=IDS)
def test_a_wrong_body_is_refused_naming_its_field(mech: Any) -> None:
    body = mech.privatize_one("apple").to_dict()
    key = sorted(body)[0]
    with pytest.raises(InvalidReport) as caught:
        mech.parse_report({**body, key: "x"})
    assert caught.value.field.split(".")[0] == key


def test_one_fingerprint_keeps_the_published_and_the_stored_values() -> None:
    """``family_id`` is published (docs/vectors); ``params`` keys stored rows and the inbox seal."""
    fp = CMS(4.0, 16, 32, HashFamily(0xAB)).fingerprint
    assert fp.text == (
        '{"epsilon":4.0,"hash_family":{"algorithm":"blake2b-poly31-v1","seed":"ab"},'
        '"k":16,"m":32,"mechanism":"cms"}'
    )
    assert fp.family_id == "f1-" + hashlib.sha256(fp.text.encode()).hexdigest()[:16]
    stored = json.dumps(json.loads(fp.text), sort_keys=True)  # the first release's spacing
    assert fp.params == hashlib.sha256(stored.encode()).hexdigest()
    assert len({m.fingerprint.family_id for m in MECHANISMS}) == len(MECHANISMS)

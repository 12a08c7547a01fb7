"""A sketch's stored form: its arrays back bit for bit, and a blob of anything else refused."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from dp_governor.mechanisms import CMS, HCMS, SFP, HashFamily, Mechanism
from dp_governor.pipeline.codec import (
    COMPRESS_LEVEL,
    narrowest,
    sketch_digest,
    sketch_from_bytes,
    sketch_to_bytes,
    stored_arrays,
)

MECHANISMS: list[Mechanism] = [
    CMS(epsilon=4.0, k=8, m=64, hash_family=HashFamily(1)),
    HCMS(epsilon=4.0, k=8, m=64, hash_family=HashFamily(1)),
    SFP(epsilon_word=2.0, epsilon_fragment=6.0, k=4, m=32, k_fragment=4, m_fragment=16),
]


@pytest.mark.parametrize("mech", MECHANISMS, ids=lambda m: m.name)
def test_a_stored_sketch_decodes_to_the_same_sketch_and_owns_its_arrays(mech: Mechanism) -> None:
    sketch = mech.sketch()
    sketch.add(mech.privatize(["a", "b", "c"] * 30, rng=np.random.default_rng(2)))
    blob = sketch_to_bytes(sketch)
    with np.load(io.BytesIO(blob)) as expected:
        arrays = stored_arrays(blob)
        assert arrays.keys() == set(expected.files)
        for name, array in arrays.items():
            assert array.dtype == expected[name].dtype and np.array_equal(array, expected[name])
    again = sketch_from_bytes(mech, blob)
    assert sketch_digest(again) == sketch_digest(sketch)
    again.add(mech.privatize(["a"], rng=np.random.default_rng(3)))  # its own, writable arrays
    assert sketch_digest(sketch_from_bytes(mech, blob)) == sketch_digest(sketch)


def _blob(**members: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out.getvalue()


def test_a_blob_of_anything_but_numeric_arrays_is_refused() -> None:
    objects = io.BytesIO()
    np.save(objects, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="not a numeric array"):
        stored_arrays(_blob(**{"counts.npy": objects.getvalue()}))
    with pytest.raises(ValueError, match="not an array"):
        stored_arrays(_blob(**{"counts.txt": b"1 2 3"}))


@pytest.mark.parametrize("mech", MECHANISMS, ids=lambda m: m.name)
def test_a_blob_of_the_earlier_writer_reads_the_same(mech: Mechanism) -> None:
    """``numpy.savez_compressed`` of the full-width arrays, as stores written before hold."""
    sketch = mech.sketch()
    sketch.add(mech.privatize(["a", "b", "c"] * 30, rng=np.random.default_rng(4)))
    earlier = io.BytesIO()
    np.savez_compressed(earlier, **sketch.to_arrays())  # type: ignore[arg-type]
    assert sketch_digest(sketch_from_bytes(mech, earlier.getvalue())) == sketch_digest(sketch)
    assert sketch_digest(sketch_from_bytes(mech, sketch_to_bytes(sketch))) == sketch_digest(sketch)


def test_each_array_is_stored_in_the_narrowest_type_that_holds_it() -> None:
    cases: dict[str, tuple[np.ndarray, type[np.generic]]] = {
        "small": (np.array([0, 255], np.int32), np.uint8),
        "wider": (np.array([0, 256], np.int32), np.uint16),
        "signed": (np.array([-127, 3], np.int32), np.int8),
        "room below": (np.array([-128, 3], np.int32), np.int16),  # -128 is int8's minimum
        "large": (np.array([0, 2**40], np.int64), np.int64),
        "empty": (np.array([], np.int32), np.int32),
        "floats": (np.array([1.5]), np.float64),
    }
    for name, (array, expected) in cases.items():
        narrowed = narrowest(array)
        assert narrowed.dtype == expected, name
        assert np.array_equal(narrowed, array), name


def test_a_dense_table_is_written_at_the_stored_level_and_numpy_reads_it() -> None:
    cms = CMS(epsilon=4.0, k=64, m=256, hash_family=HashFamily(1))
    sketch = cms.sketch().add(cms.privatize(list("abcdefgh") * 500, rng=np.random.default_rng(5)))
    blob = sketch_to_bytes(sketch)
    assert COMPRESS_LEVEL == 1 and blob == sketch_to_bytes(sketch, level=1)
    assert len(sketch_to_bytes(sketch, level=9)) < len(blob)  # the level reaches zlib
    with np.load(io.BytesIO(blob)) as stored:
        assert stored["counts"].dtype == np.uint8
        assert np.array_equal(stored["counts"], sketch.counts)
    with np.load(io.BytesIO(sketch_to_bytes(sketch, narrow=False))) as wide:  # a file to compute in
        assert wide["counts"].dtype == sketch.counts.dtype == np.int32


@pytest.mark.parametrize("table", ["minimum", "floats", "past int64", "wrapping sum"])
def test_a_stored_table_no_sketch_could_hold_is_refused(table: str) -> None:
    hcms = HCMS(epsilon=4.0, k=8, m=64, hash_family=HashFamily(1))
    sums = np.zeros((8, 64), np.int8)
    sums[0, 0] = -128  # abs(-128) is -128 in int8: a sum of |S| that passes for 0
    rows = np.zeros(8, np.int64)
    arrays = {"sums": sums, "rows": rows}
    if table == "floats":
        arrays["sums"] = sums.astype(np.float64) + 0.5
    elif table == "past int64":  # would wrap to a negative count when widened
        arrays = {"sums": np.zeros((8, 64), np.int64), "rows": np.full(8, 2**64 - 1, np.uint64)}
    elif table == "wrapping sum":  # four cells of 2**62: an int64 sum of 0
        wide = np.zeros((8, 64), np.int64)
        wide[0, :4] = 2**62
        arrays = {"sums": wide, "rows": np.full(8, 5, np.int64)}
    out = io.BytesIO()
    np.savez_compressed(out, **arrays)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"minimum|integers|int64|n_j"):
        sketch_from_bytes(hcms, out.getvalue())

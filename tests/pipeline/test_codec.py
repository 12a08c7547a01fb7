"""A sketch's stored form: its arrays back bit for bit, and a blob of anything else refused."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from dp_governor.mechanisms import CMS, HCMS, SFP, HashFamily, Mechanism
from dp_governor.pipeline.codec import (
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

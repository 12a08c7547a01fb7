"""A sketch's stored form: its mechanism's arrays, compressed to bytes, and their digest.

Each mechanism owns its codec (:class:`dp_governor.mechanisms.Mechanism`: reports decoded from
stored payloads, a sketch to and from its arrays); this module adds what the store needs on top.
"""

from __future__ import annotations

import hashlib
import io
import zipfile

import numpy as np

from dp_governor.mechanisms import Mechanism, Sketch

__all__ = [
    "sketch_digest",
    "sketch_from_bytes",
    "sketch_to_bytes",
    "sketches_equal",
    "stored_arrays",
]


def sketch_digest(sketch: Sketch) -> str:
    """SHA-256 over a sketch's arrays as int64: equal digests mean equal sketches, bit for bit."""
    h = hashlib.sha256()
    for name, array in sorted(sketch.to_arrays().items()):
        h.update(name.encode())
        h.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
    return h.hexdigest()


def sketches_equal(a: Sketch, b: Sketch) -> bool:
    """Whether two sketches hold the same arrays, value for value, whatever their integer widths.

    What :func:`sketch_digest` compares, without hashing or copying: a check of a stored sketch
    against its recomputation at Apple's sizes (64 million cells) takes milliseconds, not seconds.
    """
    x, y = a.to_arrays(), b.to_arrays()
    return x.keys() == y.keys() and all(np.array_equal(x[name], y[name]) for name in x)


def sketch_to_bytes(sketch: Sketch) -> bytes:
    """Compressed arrays of a sketch's state (``numpy.savez_compressed``)."""
    buf = io.BytesIO()
    np.savez_compressed(buf, **sketch.to_arrays())  # type: ignore[arg-type]
    return buf.getvalue()


def sketch_from_bytes(mechanism: Mechanism, data: bytes) -> Sketch:
    """Inverse of :func:`sketch_to_bytes` for the mechanism's parameters."""
    return mechanism.sketch_from_arrays(stored_arrays(data))


def stored_arrays(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of a :func:`sketch_to_bytes` blob, read-only views over each inflated member.

    Each member is inflated in one call and viewed in place, where ``numpy.load`` copies it
    through 256 KiB reads (a 64-million-cell table: 256 MiB). The sketch copies the views into
    its own arrays (:meth:`~dp_governor.mechanisms.Mechanism.sketch_from_arrays`).
    Raises ``ValueError`` for a blob that holds anything but plain numeric arrays.
    """
    out = {}
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for member in archive.namelist():
            if not member.endswith(".npy"):
                raise ValueError(f"a sketch blob holds {member!r}, not an array")
            raw = archive.read(member)
            head = io.BytesIO(raw)
            version = np.lib.format.read_magic(head)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(head)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(head)
            if dtype.hasobject:
                raise ValueError(f"a sketch blob's {member!r} is not a numeric array")
            count = int(np.prod(shape, dtype=np.int64))
            flat = np.frombuffer(raw, dtype=dtype, count=count, offset=head.tell())
            out[member.removesuffix(".npy")] = flat.reshape(shape, order="F" if fortran else "C")
    return out

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
    "COMPRESS_LEVEL",
    "narrowest",
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


# zlib's fastest level. A dense day's counts are high-entropy bytes: level 6
# (``numpy.savez_compressed``'s) wrote an Emoji day of 10^6 reports twelve times as slowly for
# a tenth less (docs/performance.md, Storage); a blob of any level reads the same.
COMPRESS_LEVEL = 1


def sketch_to_bytes(sketch: Sketch, *, level: int = COMPRESS_LEVEL, narrow: bool = True) -> bytes:
    """A sketch's arrays as a compressed ``.npz`` archive (``numpy.load`` reads it).

    What ``numpy.savez_compressed`` writes, at zlib ``level`` (default :data:`COMPRESS_LEVEL`)
    instead of its fixed 6: the ``aggregate`` job writes each day's sketch at every run. The
    store's arrays are ``narrow`` (:func:`narrowest`); a file for people to compute with keeps
    the sketch's own widths (``narrow=False``), where ``uint8`` arithmetic would wrap.
    """
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=level) as archive:
        for name, array in sketch.to_arrays().items():
            stored = narrowest(array) if narrow else np.asarray(array)
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, stored, allow_pickle=False)
    return buf.getvalue()


def narrowest(array: np.ndarray) -> np.ndarray:
    """An integer array in the narrowest integer type that holds its values (others as given).

    A day's counts are small (at most the reports a row received): an ``int32`` table of
    counts below 256 is three quarters zero bytes, which zlib still has to read, write and
    inflate. Signed values keep room for one more below their most negative, so that no stored
    value is its type's minimum (whose ``abs`` overflows). Readers widen what they read.
    """
    a = np.asarray(array)
    if a.dtype.kind not in "iu" or a.size == 0:
        return a
    low, high = int(a.min()), int(a.max())
    if low >= 0:
        target = np.min_scalar_type(high)
    else:
        target = np.min_scalar_type(-(max(-low, high) + 1))
    return a if target.itemsize >= a.dtype.itemsize else a.astype(target)


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

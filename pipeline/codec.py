"""Sketches to and from arrays and bytes, and stored payloads decoded into a mechanism's reports."""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import orjson

from dp_governor.mechanisms import (
    CMS,
    HCMS,
    CmsReports,
    CmsSketch,
    HcmsReports,
    HcmsSketch,
    SfpReports,
    SfpSketch,
)
from dp_governor.pipeline.ingest import Mechanism

__all__ = [
    "Sketch",
    "decode_payloads",
    "sketch_arrays",
    "sketch_digest",
    "sketch_from_arrays",
    "sketch_from_bytes",
    "sketch_to_bytes",
]

Sketch = CmsSketch | HcmsSketch | SfpSketch


def sketch_arrays(sketch: Sketch) -> dict[str, np.ndarray]:
    """A sketch's whole state as named arrays (what persists and what crosses processes)."""
    if isinstance(sketch, CmsSketch):
        return {"counts": np.asarray(sketch.counts), "rows": np.asarray(sketch.row_counts)}
    if isinstance(sketch, HcmsSketch):
        return {"sums": np.asarray(sketch.sums), "rows": np.asarray(sketch.row_counts)}
    arrays = {"word_counts": sketch.word.counts, "word_rows": sketch.word.row_counts}
    for i, frag in enumerate(sketch.fragments):
        arrays[f"frag{i}_counts"] = frag.counts
        arrays[f"frag{i}_rows"] = frag.row_counts
    return {name: np.asarray(a) for name, a in arrays.items()}


def sketch_digest(sketch: Sketch) -> str:
    """SHA-256 over a sketch's arrays as int64: equal digests mean equal sketches, bit for bit."""
    h = hashlib.sha256()
    for name, array in sorted(sketch_arrays(sketch).items()):
        h.update(name.encode())
        h.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
    return h.hexdigest()


def sketch_from_arrays(mechanism: Mechanism, arrays: Mapping[str, np.ndarray]) -> Sketch:
    """Inverse of :func:`sketch_arrays` for the mechanism's parameters (validated)."""
    if isinstance(mechanism, CMS):
        return CmsSketch.from_arrays(mechanism, arrays["counts"], arrays["rows"])
    if isinstance(mechanism, HCMS):
        return HcmsSketch.from_arrays(mechanism, arrays["sums"], arrays["rows"])
    sk = SfpSketch(mechanism)
    sk.word = CmsSketch.from_arrays(mechanism.word_cms, arrays["word_counts"], arrays["word_rows"])
    frag = mechanism.fragment_cms
    sk.fragments = tuple(
        CmsSketch.from_arrays(frag, arrays[f"frag{i}_counts"], arrays[f"frag{i}_rows"])
        for i in range(len(sk.fragments))
    )
    return sk


def sketch_to_bytes(sketch: Sketch) -> bytes:
    """Compressed arrays of a sketch's state (``numpy.savez_compressed``)."""
    buf = io.BytesIO()
    np.savez_compressed(buf, **sketch_arrays(sketch))  # type: ignore[arg-type]
    return buf.getvalue()


def sketch_from_bytes(mechanism: Mechanism, data: bytes) -> Sketch:
    """Inverse of :func:`sketch_to_bytes` for the mechanism's parameters."""
    with np.load(io.BytesIO(data)) as arrays:
        return sketch_from_arrays(mechanism, arrays)


def _cms_batch(bodies: list[dict[str, Any]], m: int) -> CmsReports:
    j = np.fromiter((b["j"] for b in bodies), dtype=np.int64, count=len(bodies))
    raw = b"".join(base64.b64decode(b["bits"]) for b in bodies)
    bits = np.frombuffer(raw, dtype=np.uint8).reshape(len(bodies), (m + 7) // 8)
    return CmsReports(j, bits, m)


def decode_payloads(
    mechanism: Mechanism, payloads: Iterable[str | bytes]
) -> CmsReports | HcmsReports | SfpReports:
    """Stored JSON payloads (already validated at ingestion) as one report batch."""
    bodies = [orjson.loads(p) for p in payloads]
    n = len(bodies)
    if isinstance(mechanism, CMS):
        return _cms_batch(bodies, mechanism.m)
    if isinstance(mechanism, HCMS):
        return HcmsReports(
            np.fromiter((b["j"] for b in bodies), dtype=np.int64, count=n),
            np.fromiter((b["l"] for b in bodies), dtype=np.int64, count=n),
            np.fromiter((b["bit"] for b in bodies), dtype=np.int8, count=n),
        )
    return SfpReports(
        _cms_batch([b["word"] for b in bodies], mechanism.m),
        _cms_batch([b["fragment"] for b in bodies], mechanism.m_fragment),
        np.fromiter((b["position"] for b in bodies), dtype=np.int64, count=n),
    )

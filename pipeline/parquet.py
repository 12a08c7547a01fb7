"""The report store as a Parquet dataset, for aggregation outside the service.

Layout: ``ROOT/use_case=NAME/day=D/params=HASH/part-NNNNN.parquet`` (Hive-style, so any Parquet
reader sees the partitions as columns). Every file holds reports of one parameter set, as numpy-
ready columns (HCMS ``j, l, bit``; CMS ``j, bits``; SFP ``word_j, word_bits, fragment_j,
fragment_bits, position``) and carries the parameter hash in its metadata, so a reader can refuse
reports of other parameters. Like the store, the files hold no device, no time finer than the day.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import Engine

from dp_governor.mechanisms import (
    Mechanism,
    Reports,
)
from dp_governor.pipeline.fold import part_payloads, published_parts

__all__ = [
    "ExportResult",
    "Reports",
    "dataset_files",
    "export_reports",
    "iter_reports",
    "partition_dir",
    "reports_table",
    "write_reports",
]

_META_PARAMS = b"dpgov.params"
_READ_CHUNK = 50_000


def partition_dir(root: Path, use_case: str, day: int, params: str) -> Path:
    """The directory of one (use case, day, parameter set) partition."""
    return root / f"use_case={use_case}" / f"day={day}" / f"params={params}"


def _column(values: np.ndarray) -> pa.Array:
    """A report column: packed-bit rows as fixed-width binary, integers as int32 (int8 kept)."""
    if values.ndim == 2:
        flat = pa.py_buffer(np.ascontiguousarray(values, dtype=np.uint8).tobytes())
        return pa.Array.from_buffers(pa.binary(values.shape[1]), len(values), [None, flat])
    return pa.array(values if values.dtype == np.int8 else values.astype(np.int32))


def reports_table(reports: Reports) -> pa.Table:
    """A batch of reports as an Arrow table of its mechanism's columns."""
    return pa.table({name: _column(values) for name, values in reports.columns().items()})


def _values(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A column back as numpy: fixed-width binary as ``(n, width)`` uint8 rows, else integers."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_fixed_size_binary(arr.type):
        width = arr.type.byte_width
        data = arr.buffers()[1]
        out = np.frombuffer(data, dtype=np.uint8, count=len(arr) * width, offset=arr.offset * width)
        return out.reshape(len(arr), width)
    return np.asarray(arr.to_numpy(zero_copy_only=False))


def _from_batch(mechanism: Mechanism, batch: pa.RecordBatch) -> Reports:
    columns = {name: _values(batch.column(name)) for name in batch.schema.names}
    return mechanism.from_columns(columns)


def _tagged(mechanism: Mechanism, reports: Reports) -> pa.Table:
    """The reports' table with the parameter hash in its schema metadata."""
    meta = {_META_PARAMS: mechanism.fingerprint.params.encode()}
    return reports_table(reports).replace_schema_metadata(meta)


def write_reports(path: Path, mechanism: Mechanism, reports: Iterator[Reports]) -> int:
    """Write report batches to one Parquet file (zstd, one row group per batch); returns rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer: pq.ParquetWriter | None = None
    rows = 0
    try:
        for batch in reports:
            table = _tagged(mechanism, batch)
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema, compression="zstd")
            writer.write_table(table)
            rows += table.num_rows
    finally:
        if writer is not None:
            writer.close()
    return rows


def iter_reports(
    path: str | os.PathLike[str], mechanism: Mechanism, *, batch_rows: int = 1 << 20
) -> Iterator[Reports]:
    """Read one file's reports in batches of at most ``batch_rows`` (memory stays bounded).

    Raises ValueError if the file was written for other mechanism parameters.
    """
    file = pq.ParquetFile(path)
    meta = file.schema_arrow.metadata or {}
    expected = mechanism.fingerprint.params
    if meta.get(_META_PARAMS, b"").decode() != expected:
        raise ValueError(f"{path}: reports of parameters other than {expected}")
    for batch in file.iter_batches(batch_size=batch_rows):
        yield _from_batch(mechanism, batch)


def dataset_files(root: Path, use_case: str, days: Sequence[int], params: str) -> list[Path]:
    """The Parquet files of the given days' partitions (sorted, for a stable order)."""
    files: list[Path] = []
    for day in days:
        files.extend(sorted(partition_dir(root, use_case, day, params).glob("*.parquet")))
    return files


@dataclass(frozen=True, slots=True)
class ExportResult:
    """What :func:`export_reports` wrote: rows and files per (day, parameter hash)."""

    rows: int
    files: list[Path]
    partitions: dict[tuple[int, str], int]


def _pages(
    engine: Engine, batches: list[int], day: int, params: str, chunk: int
) -> Iterator[list[str]]:
    """Payloads of one partition: its published batch parts, ``chunk`` at a time."""
    for batch in batches:
        yield from part_payloads(engine, batch, params, day, chunk)


def _write_partition(
    staging: Path, mechanism: Mechanism, pages: Iterator[list[str]], rows_per_file: int
) -> tuple[list[Path], int]:
    """Stream decoded pages into files of at most ``rows_per_file`` rows; (files, rows)."""
    files: list[Path] = []
    writer: pq.ParquetWriter | None = None
    in_file = rows = 0
    try:
        for payloads in pages:
            table = _tagged(mechanism, mechanism.decode(payloads))
            while table.num_rows:
                if writer is None:
                    files.append(staging / f"part-{len(files):05d}.parquet")
                    writer = pq.ParquetWriter(files[-1], table.schema, compression="zstd")
                    in_file = 0
                take = min(table.num_rows, rows_per_file - in_file)
                writer.write_table(table.slice(0, take))
                in_file, rows, table = in_file + take, rows + take, table.slice(take)
                if in_file == rows_per_file:
                    writer.close()
                    writer = None
    finally:
        if writer is not None:
            writer.close()
    return files, rows


def export_reports(
    engine: Engine,
    root: Path,
    use_case: str,
    first_day: int,
    last_day: int,
    mechanisms: dict[str, Mechanism],
    *,
    rows_per_file: int = 1_000_000,
    progress: Callable[[int, int], None] | None = None,
) -> ExportResult:
    """Export a use case's published reports of ``first_day..last_day`` to ``root``.

    A batch still being moved into the store is not published yet: the next export has it.
    Each partition is written to a temporary directory and renamed into place, so a partition is
    either the previous export or the complete new one; re-exporting replaces it. Reports whose
    parameter hash is not in ``mechanisms`` are skipped (they cannot be decoded). ``progress``
    is called with the reports read so far and the reports to export, a page at a time.
    """
    if rows_per_file < 1:
        raise ValueError("rows_per_file must be positive")
    with engine.connect() as conn:
        groups = published_parts(conn, use_case, first_day, last_day)
    files: list[Path] = []
    partitions: dict[tuple[int, str], int] = {}
    total = sum(
        n for (_, params), parts in groups.items() if params in mechanisms for _, n in parts
    )
    read = 0

    def counted(pages: Iterator[list[str]]) -> Iterator[list[str]]:
        nonlocal read
        for page in pages:
            read += len(page)
            if progress is not None:
                progress(read, total)
            yield page

    for (day, params), parts in groups.items():
        mechanism = mechanisms.get(params)
        if mechanism is None:
            continue
        final = partition_dir(root, use_case, day, params)
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".export-", dir=final.parent))
        try:
            batches = [batch for batch, _ in parts]
            pages = counted(_pages(engine, batches, day, params, _READ_CHUNK))
            written, rows = _write_partition(staging, mechanism, pages, rows_per_file)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # the previous export stays as it was
            raise
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
        files.extend(final / p.name for p in written)
        partitions[(day, params)] = rows
    return ExportResult(sum(partitions.values()), files, partitions)

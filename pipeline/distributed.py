"""Aggregate a Parquet report dataset into one sketch, in this process or on a Dask cluster.

Sketches are additive, so aggregation is a map (fold a group of files into a partial sketch) and
a tree of merges. Each task reads its files in bounded batches, so a worker's memory is one
partial sketch plus one batch, whatever the dataset's size. Counts are integers: the result is
the same, bit for bit, whichever engine and grouping produced it.
"""

from __future__ import annotations

import heapq
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from dp_governor.mechanisms import Arrays, Mechanism, Sketch
from dp_governor.pipeline.parquet import iter_reports

if TYPE_CHECKING:
    from dask.distributed import Client

__all__ = [
    "DaskOptions",
    "EngineName",
    "aggregate_files",
    "dask_client",
    "dask_executor",
    "fold_files",
    "group_files",
    "merge_arrays",
]

EngineName = Literal["local", "dask"]
_CLIENT_FAN_IN = 4  # partials the client merges itself (more: merged pairwise on the cluster)


def fold_files(
    mechanism: Mechanism,
    files: Sequence[str | os.PathLike[str]],
    *,
    batch_rows: int = 1 << 20,
    progress: Callable[[int, int], None] | None = None,
) -> Arrays:
    """Fold files into one sketch and return its arrays (the unit of work of a task).

    ``progress`` is called with the files folded so far and their number, after each file.
    """
    sketch = mechanism.sketch()
    for i, path in enumerate(files, start=1):
        for reports in iter_reports(path, mechanism, batch_rows=batch_rows):
            sketch.add(reports)
        if progress is not None:
            progress(i, len(files))
    return sketch.to_arrays()


def merge_arrays(mechanism: Mechanism, a: Arrays, b: Arrays) -> Arrays:
    """The arrays of the sum of two partial sketches."""
    return mechanism.sketch_from_arrays(a).merge(mechanism.sketch_from_arrays(b)).to_arrays()


def group_files(files: Sequence[Path], groups: int) -> list[list[Path]]:
    """Split files into at most ``groups`` groups of similar total size (largest first)."""
    sizes = {p: p.stat().st_size for p in files}
    heap: list[tuple[int, int, list[Path]]] = [(0, i, []) for i in range(max(1, groups))]
    for path in sorted(files, key=lambda p: sizes[p], reverse=True):
        total, i, members = heapq.heappop(heap)  # the lightest group takes the next file
        members.append(path)
        heapq.heappush(heap, (total + sizes[path], i, members))
    return [sorted(members) for _, _, members in sorted(heap, key=lambda b: b[1]) if members]


@dataclass(frozen=True, slots=True)
class DaskOptions:
    """Where to run: an existing scheduler's address, or a LocalCluster of ``workers``.

    ``connect_timeout``: seconds to wait for ``scheduler`` before it counts as unreachable.
    """

    scheduler: str | None = None
    workers: int = 2
    memory_limit: str = "auto"
    connect_timeout: float = 5.0


def aggregate_files(
    mechanism: Mechanism,
    files: Sequence[Path],
    *,
    engine: EngineName = "local",
    dask: DaskOptions | None = None,
    batch_rows: int = 1 << 20,
    progress: Callable[[int, int], None] | None = None,
) -> Sketch:
    """Aggregate report files into one sketch with the chosen engine.

    ``dask`` starts a ``LocalCluster`` unless ``DaskOptions.scheduler`` names one; the files
    are split into one group per worker thread (one partial sketch each, so a worker holds
    one sketch and one batch at a time) and folded in parallel; the partials are merged
    pairwise on the cluster down to a few, which this process fetches and merges.
    ``progress`` is called with the files folded so far and their number.
    """
    if engine == "local":
        arrays = fold_files(mechanism, files, batch_rows=batch_rows, progress=progress)
        return mechanism.sketch_from_arrays(arrays)
    if engine != "dask":
        raise ValueError(f"unknown engine {engine!r}; engines: local, dask")
    return _on_dask(mechanism, files, dask or DaskOptions(), batch_rows, progress)


@contextmanager
def dask_client(options: DaskOptions) -> Iterator[Client]:
    """A client of ``options.scheduler``, or of a ``LocalCluster`` started here (both closed after).

    Raises :class:`ImportError` without the ``scale`` extra and :class:`OSError` when the
    scheduler cannot be reached within ``options.connect_timeout``. A LocalCluster's workers
    log nothing below CRITICAL: a task's error reaches the caller, once, as its exception.
    """
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError as exc:
        raise ImportError(
            "the Dask engine needs the `scale` extra: pip install 'dp-governor[scale]'",
            name=exc.name,
        ) from None

    cluster = None
    if options.scheduler is None:
        cluster = LocalCluster(  # type: ignore[no-untyped-call]
            n_workers=options.workers,
            threads_per_worker=1,
            processes=True,
            memory_limit=options.memory_limit,
            dashboard_address=":0",  # None does not disable it (dask/distributed#8136)
            silence_logs=logging.CRITICAL,
        )
        try:
            client = Client(cluster)  # type: ignore[no-untyped-call]
        except BaseException:
            cluster.close()
            raise
    else:
        client = Client(options.scheduler, timeout=options.connect_timeout)  # type: ignore[no-untyped-call]
    try:
        yield client
    finally:
        client.close()  # type: ignore[no-untyped-call]
        if cluster is not None:
            cluster.close()


@contextmanager
def dask_executor(options: DaskOptions) -> Iterator[Executor]:
    """A :class:`concurrent.futures.Executor` on :func:`dask_client`'s workers (tasks not pure)."""
    with dask_client(options) as client:
        yield client.get_executor(pure=False)  # type: ignore[no-untyped-call]


def _on_dask(
    mechanism: Mechanism,
    files: Sequence[Path],
    options: DaskOptions,
    batch_rows: int,
    progress: Callable[[int, int], None] | None,
) -> Sketch:
    from dask.distributed import as_completed

    with dask_client(options) as client:
        info = client.scheduler_info()["workers"].values()
        threads = max(1, sum(int(w.get("nthreads", 1)) for w in info))
        groups = group_files(files, threads) if files else [[]]
        paths = [[str(p.resolve()) for p in g] for g in groups]
        folds = client.map(
            fold_files, [mechanism] * len(paths), paths, batch_rows=batch_rows, pure=False
        )
        partials = list(folds)
        while len(partials) > _CLIENT_FAN_IN:  # merge on the cluster down to a few partials
            pairs = [partials[i : i + 2] for i in range(0, len(partials), 2)]
            partials = [
                client.submit(merge_arrays, mechanism, *p, pure=False) if len(p) == 2 else p[0]
                for p in pairs
            ]
        if progress is not None:  # the folds finish while the merges above wait for them
            _report_folds(folds, [len(g) for g in paths], progress)
        del folds  # a fold's result is released once its merge has it
        total: Sketch | None = None
        for done in as_completed(partials):  # type: ignore[no-untyped-call]
            # fetch the rest as they finish, one at a time
            part = mechanism.sketch_from_arrays(done.result())
            done.release()
            total = part if total is None else total.merge(part)
        assert total is not None
        return total


def _report_folds(folds: list[Any], sizes: list[int], progress: Callable[[int, int], None]) -> None:
    """Call ``progress`` with the files folded so far as each fold task finishes."""
    from dask.distributed import as_completed

    files = dict(zip((f.key for f in folds), sizes, strict=True))
    folded = 0
    for fold in as_completed(folds):  # type: ignore[no-untyped-call]
        folded += files[fold.key]
        progress(folded, sum(sizes))

"""Distributed aggregation of HCMS reports from Parquet; prints a Markdown table.

Usage: ``python -m benchmarks.aggregate [--n 1e7 1e8] [--root /tmp/dpgov-bench-parquet]``.

The helper ``generate`` writes n Safari-domain reports (the default policy's HCMS, eps 4,
k=1024, m=32768; 250,000 domains, Zipf 1.1) as the service's Parquet layout, in files of
``--rows-per-file`` reports (kept between runs: generation is not what is measured). Then
each dataset is aggregated:
- in-process (``--engine local``), in a fresh subprocess so its peak RSS is its own;
- on a 2-worker ``LocalCluster`` (one thread per worker, started before timing), with each
  worker's peak RSS (``VmHWM``) read after the run; the workers import dp-governor before
  timing, as the workers of a running cluster have.
Memory bounded by the partition size means: the same per-worker peak at 1e7 and 1e8 reports.
Every engine's result is checked identical (SHA-256 of the sketch arrays) to the in-process one.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from dp_governor.api.demo.simulation import zipf_indices
from dp_governor.mechanisms import HCMS
from dp_governor.pipeline.codec import sketch_digest
from dp_governor.pipeline.distributed import DaskOptions, aggregate_files
from dp_governor.pipeline.parquet import dataset_files, partition_dir, write_reports
from dp_governor.policies import default_policies, mechanism_for

USE_CASE = "safari-energy-domains"
CHUNK = 10_000_000


def mechanism() -> HCMS:
    """The default Safari-domains HCMS (its parameter hash names the partition)."""
    mech = mechanism_for({p.name: p for p in default_policies()}[USE_CASE])
    assert isinstance(mech, HCMS)
    return mech


def generate(root: Path, n: int, rows_per_file: int, seed: int = 7) -> list[Path]:
    """Write (or reuse) ``n`` privatized reports as Parquet files of ``rows_per_file``."""
    mech = mechanism()
    part = partition_dir(root, USE_CASE, 0, mech.fingerprint.params)
    done = root / ".complete"
    if done.exists():
        return dataset_files(root, USE_CASE, [0], mech.fingerprint.params)
    rng = np.random.default_rng(seed)
    vocab = [f"www.domain{i}.example" for i in range(250_000)]
    written = 0
    for number in range((n + rows_per_file - 1) // rows_per_file):
        rows = min(rows_per_file, n - written)

        def batches(rows: int = rows) -> object:
            for s in range(0, rows, CHUNK):
                size = min(CHUNK, rows - s)
                yield mech.privatize_indices(
                    vocab, zipf_indices(len(vocab), size, 1.1, rng=rng), rng=rng
                )

        write_reports(part / f"part-{number:05d}.parquet", mech, batches())  # type: ignore[arg-type]
        written += rows
    done.touch()
    return dataset_files(root, USE_CASE, [0], mech.fingerprint.params)


def _peak_mib() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss, not inherited across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_local(files: list[Path]) -> dict[str, object]:
    """Aggregate in this process; timing, peak RSS, digest."""
    mech = mechanism()
    t0 = time.perf_counter()
    sketch = aggregate_files(mech, files)
    seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "n": sketch.n,
        "peak": [_peak_mib()],
        "digest": sketch_digest(sketch),
    }


def run_dask(files: list[Path], workers: int) -> dict[str, object]:
    """Aggregate on a LocalCluster started beforehand; per-worker peak RSS afterwards."""
    from dask.distributed import Client, LocalCluster

    with (
        LocalCluster(  # type: ignore[no-untyped-call]
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,  # type: ignore[no-untyped-call]
    ):
        # a running cluster's state
        client.run(importlib.import_module, "dp_governor.pipeline.distributed")
        baseline = client.run(_peak_mib)
        t0 = time.perf_counter()
        sketch = aggregate_files(
            mechanism(), files, engine="dask", dask=DaskOptions(scheduler=cluster.scheduler_address)
        )
        seconds = time.perf_counter() - t0
        peaks = client.run(_peak_mib)
    return {
        "seconds": seconds,
        "n": sketch.n,
        "peak": sorted(peaks.values()),
        "baseline": sorted(baseline.values()),
        "digest": sketch_digest(sketch),
    }


def main(argv: list[str] | None = None) -> None:
    """Generate the datasets, aggregate each with both engines, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=float, nargs="+", default=[1e7, 1e8])
    parser.add_argument("--root", type=Path, default=Path("/tmp/dpgov-bench-parquet"))
    parser.add_argument("--rows-per-file", type=int, default=5_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--local-only", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.local_only:  # the subprocess of the in-process run
        files = sorted(args.local_only.glob("*.parquet"))
        print(json.dumps(run_local(files)))
        return
    mech = mechanism()
    sketch_mib = mech.k * mech.m * 4 / 2**20
    print(
        f"HCMS k={mech.k} m={mech.m} (sketch {sketch_mib:.0f} MiB int32); files of "
        f"{args.rows_per_file:,} reports read in batches of 1,048,576; {os.cpu_count()} CPUs"
    )
    print()
    print("| reports | files | engine | seconds | reports/s | peak RSS per process (MiB) | same |")
    print("|---:|---:|---|---:|---:|---|---|")
    for n in (int(x) for x in args.n):
        root = args.root / f"n{n}-f{args.rows_per_file}"
        t0 = time.perf_counter()
        files = generate(root, n, args.rows_per_file)
        gen = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in files) / 2**20
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.aggregate", "--local-only", str(files[0].parent)],
            capture_output=True,
            text=True,
            check=True,
        )
        local = json.loads(proc.stdout)
        on_dask = run_dask(files, args.workers)
        for engine, r in (("in-process", local), (f"dask, {args.workers} workers", on_dask)):
            assert r["n"] == n, (engine, r["n"])
            peaks = ", ".join(f"{p:,.0f}" for p in r["peak"])  # type: ignore[union-attr]
            if "baseline" in r:
                peaks += " (idle " + ", ".join(f"{p:,.0f}" for p in r["baseline"]) + ")"  # type: ignore[union-attr]
            same = "yes" if r["digest"] == local["digest"] else "NO"
            print(
                f"| {n:,} | {len(files)} | {engine} | {r['seconds']:.2f} | "
                f"{n / r['seconds'] / 1e6:.2f} M | {peaks} | {same} |"  # type: ignore[operator]
            )
        print(f"<!-- n={n:,}: {size:,.0f} MiB of Parquet, generated in {gen:.0f} s -->")


if __name__ == "__main__":
    main()

"""Distributed aggregation on a real Dask cluster: the same sketch as in process, bit for bit.

A system test: it starts a ``LocalCluster`` of worker processes (and ``dpgov aggregate --engine
dask`` starts its own), so it lives beside the other multi-process tests. The stored service it
reads is :func:`tests.pipeline.test_distributed.service`'s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from dp_governor.mechanisms import CMS, HCMS, SFP
from dp_governor.pipeline.distributed import DaskOptions, aggregate_files
from dp_governor.pipeline.parquet import dataset_files
from dp_governor.policies import mechanism_for
from tests.pipeline.test_distributed import CASES, DAY0, KEYS, Service, _same, service

__all__ = ["service"]  # the module-scoped fixture, shared

pytestmark = pytest.mark.usefixtures("small_batches")


def test_dask_local_cluster_gives_the_same_sketch_bit_for_bit(
    service: Service, tmp_path: Path
) -> None:
    first, last = service.days
    sketches = {}
    for name in CASES:
        mech = mechanism_for(service.ledger.policies.get(name))
        service.export(tmp_path, name, rows_per_file=150)
        sketches[name] = (
            mech,
            dataset_files(tmp_path, name, [first, last], mech.fingerprint.params),
        )
    # one cluster, three use cases (start-up is the slow part); six threads make six partials,
    # so some are merged on the cluster and the rest in this process
    from dask.distributed import Client, LocalCluster

    with (
        LocalCluster(  # type: ignore[no-untyped-call]
            n_workers=2, threads_per_worker=3, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,  # type: ignore[no-untyped-call]
    ):
        address = client.scheduler.address
        for name, (mech, files) in sketches.items():
            folded: list[tuple[int, int]] = []
            local = aggregate_files(mech, files)
            on_dask = aggregate_files(
                mech,
                files,
                engine="dask",
                dask=DaskOptions(scheduler=address),
                progress=lambda *p: folded.append(p),  # noqa: B023 - called within the loop
            )
            assert on_dask.n == local.n == 1400
            assert folded[-1] == (len(files), len(files)) and folded == sorted(folded)
            a, b = local.to_arrays(), on_dask.to_arrays()
            assert _same(a, b), name
            assert all(a[k].dtype == b[k].dtype for k in a)
            assert isinstance(mech, CMS | HCMS | SFP)


def test_cli_aggregate_on_a_local_cluster_matches_in_process(
    service: Service, tmp_path: Path
) -> None:
    env = {**os.environ, **KEYS}
    first, last = DAY0.date().isoformat(), (DAY0 + timedelta(days=1)).date().isoformat()
    base = [
        sys.executable, "-m", "dp_governor.api.cli", "aggregate", "emoji",
        "--from", first, "--to", last, "--database-url", service.url, "--out", str(tmp_path / "pq"),
    ]  # fmt: skip
    runs = {}
    for engine in ("local", "dask"):
        proc = subprocess.run(
            [*base, "--engine", engine, "--sketch", str(tmp_path / f"{engine}.npz")],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        runs[engine] = json.loads(proc.stdout)
        # piped: plain progress lines on stderr, the JSON result alone on stdout
        progress = proc.stderr.splitlines()
        assert "aggregate emoji: export: 1,400 of 1,400 reports (100%)" in progress
        files = runs[engine]["files"]
        assert f"aggregate emoji: fold: {files:,d} of {files:,d} files (100%)" in progress
    assert runs["local"]["reports"] == runs["dask"]["reports"] == 1400
    assert runs["local"]["sketch_sha256"] == runs["dask"]["sketch_sha256"]
    assert (tmp_path / "local.npz").read_bytes() == (tmp_path / "dask.npz").read_bytes()

"""``dpgov audit report --engine dask``: the parts on a Dask cluster, the report bit for bit.

A system test: it starts a ``LocalCluster`` of worker processes, which open the SQLite files by
their paths. The service and its shards are :mod:`tests.api.test_audit_shards`'s.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.api.test_audit_shards import _report, service

__all__ = ["service"]  # the fixture, shared

Service = tuple[dict[str, str], list[str]]


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    """The address of a LocalCluster of two worker processes, for the module's tests."""
    from dask.distributed import LocalCluster

    with LocalCluster(  # type: ignore[no-untyped-call]
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster:
        yield str(cluster.scheduler_address)


def _json(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """The report's JSON, less the instant it was computed at."""
    result = _report(["--json", *args], env)
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.stdout)
    report.pop("computed_at")
    return report


def test_the_partitions_on_dask_report_as_local_processes(service: Service, scheduler: str) -> None:
    env, _ = service
    dask = ["--engine", "dask", "--scheduler", scheduler]
    full_on_dask = _json(["--partitions", "3", "--full", *dask], env)  # the ranges on Dask
    full_local = _json(["--partitions", "3", "--full", "--workers", "2"], env)
    forward_on_dask = _json(["--partitions", "3", *dask], env)  # the summary brought forward
    one_scan = _json([], env)
    assert full_on_dask == full_local == forward_on_dask == one_scan


def test_the_shards_on_dask_report_as_local_processes(service: Service, scheduler: str) -> None:
    env, urls = service
    shards = [arg for url in urls for arg in ("--shard", url)]
    dask = ["--engine", "dask", "--scheduler", scheduler]
    on_dask = _json([*shards, "--partitions", "2", "--full", *dask], env)
    local = _json([*shards, "--partitions", "2", "--full", "--workers", "2"], env)
    assert on_dask == local
    assert on_dask["provenance"]["shards"]["devices"] == 60


def test_a_cluster_of_its_own_reports_the_same(service: Service) -> None:
    env, _ = service
    own = _json(["--partitions", "2", "--full", "--engine", "dask", "--workers", "2"], env)
    assert own == _json(["--partitions", "2", "--full", "--workers", "1"], env)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--engine", "dask"], "Error: --engine dask needs --partitions (more than 1) or --shard"),
        (["--scheduler", "tcp://127.0.0.1:1"], "Error: --scheduler needs --engine dask"),
    ],
)
def test_engine_options_that_cannot_hold_are_one_line(
    service: Service, args: list[str], line: str
) -> None:
    env, _ = service
    refused = _report(args, env)
    assert refused.exit_code == 2 and refused.stdout == "", refused.output
    assert refused.stderr.strip().splitlines() == [line]


def test_an_unknown_engine_is_refused(service: Service) -> None:
    env, _ = service
    refused = _report(["--partitions", "2", "--engine", "spark"], env)
    assert refused.exit_code == 2 and refused.stdout == ""
    assert "'spark' is not one of 'local', 'dask'" in refused.stderr


def test_an_unreachable_scheduler_is_one_line(service: Service) -> None:
    env, _ = service
    args = ["--partitions", "2", "--engine", "dask", "--scheduler", "tcp://127.0.0.1:9"]
    refused = _report(args, env)
    assert refused.exit_code == 2 and refused.stdout == "", refused.output
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("Error: --scheduler tcp://127.0.0.1:9: cannot reach"), line


def test_a_malformed_scheduler_address_is_one_line(service: Service) -> None:
    env, _ = service
    args = ["--partitions", "2", "--engine", "dask", "--scheduler", "not a url::"]
    refused = _report(args, env)
    assert refused.exit_code == 2 and refused.stdout == "", refused.output
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("Error: --scheduler not a url::: cannot reach"), line

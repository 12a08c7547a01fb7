"""``dpgov audit report --engine dask``: the parts on a Dask cluster, the report bit for bit.

A system test: it starts a ``LocalCluster`` of worker processes, which open the SQLite files by
their paths and PostgreSQL by its URL. The SQLite service and its shards are
:mod:`tests.api.test_audit_shards`'s; the PostgreSQL one is the same service on a schema of
``DPGOV_TEST_DATABASE_URL`` (skipped when it is unset).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from dp_governor.api.app import create_app
from dp_governor.budget.storage.db import scratch_schema
from tests.api.test_audit_shards import TOKEN, _env, _report, service
from tests.conftest import BACKENDS, PG_URL
from tests.live import app_settings

__all__ = ["service"]  # the fixture, shared

Service = tuple[dict[str, str], list[str]]


@pytest.fixture(scope="module")
def workers_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the cluster's workers run in (a relative SQLite path is relative to it)."""
    return tmp_path_factory.mktemp("workers")


@pytest.fixture(scope="module")
def scheduler(workers_folder: Path) -> Iterator[str]:
    """The address of a LocalCluster of two worker processes, for the module's tests."""
    from dask.distributed import LocalCluster

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workers_folder)  # the workers start here, and stay
        cluster = LocalCluster(  # type: ignore[no-untyped-call]
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        )
    with cluster:
        yield str(cluster.scheduler_address)


@pytest.fixture(params=BACKENDS)
def ledger_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a service whose 60 devices each sent a report: SQLite or PostgreSQL."""
    settings = app_settings(tmp_path, TOKEN)
    database: AbstractContextManager[str] = nullcontext(settings.database_url)
    if request.param == "postgresql":
        assert PG_URL is not None
        database = scratch_schema(PG_URL, "dask")
    with database as url:
        with TestClient(create_app(settings.model_copy(update={"database_url": url}))) as client:
            items = [
                {"device_id": f"d{i}", "report": {"j": 1, "l": 2, "bit": 1}} for i in range(60)
            ]
            r = client.post(
                "/v1/use-cases/safari-energy-domains/reports:batch",
                json={"items": items},
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            assert r.json()["accepted"] == 60, r.text
        yield {**_env(tmp_path), "DPGOV_DATABASE_URL": url}


def _json(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """The report's JSON, less the instant it was computed at."""
    result = _report(["--json", *args], env)
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.stdout)
    report.pop("computed_at")
    return report


def _line(args: list[str], env: dict[str, str]) -> str:
    """The one line a refused report prints on stderr (exit 2, nothing on stdout)."""
    refused = _report(args, env)
    assert refused.exit_code == 2 and refused.stdout == "", refused.output
    assert "Traceback" not in refused.output and refused.exception is not None
    (line,) = refused.stderr.strip().splitlines()
    return line


def test_the_partitions_on_dask_report_as_local_processes(
    ledger_env: dict[str, str], scheduler: str
) -> None:
    dask = ["--engine", "dask", "--scheduler", scheduler]
    full_on_dask = _json(["--partitions", "3", "--full", *dask], ledger_env)  # ranges on Dask
    full_local = _json(["--partitions", "3", "--full", "--workers", "2"], ledger_env)
    forward_on_dask = _json(["--partitions", "3", *dask], ledger_env)  # the summary forward
    one_scan = _json(["--full"], ledger_env)
    assert full_on_dask == full_local == forward_on_dask == one_scan
    assert sum(line["spent_window"]["devices"] for line in one_scan["use_cases"]) == 60


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


def test_no_cluster_starts_when_the_summaries_suffice(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each shard's stored summary brought forward in this process: no worker is asked for."""
    import dp_governor.pipeline.distributed as distributed

    env, urls = service
    shards = [arg for url in urls for arg in ("--shard", url)]
    stored = _json([*shards, "--full", "--workers", "1"], env)  # each shard's summary stored

    def no_cluster(*_: object) -> None:
        raise AssertionError("a Dask cluster was started")

    monkeypatch.setattr(distributed, "dask_executor", no_cluster)
    assert _json([*shards, "--partitions", "2", "--engine", "dask"], env) == stored


def test_a_refusal_on_a_worker_is_the_local_engines_line(
    service: Service, scheduler: str, workers_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative SQLite path names a file here and none in the workers' folder."""
    env, _ = service
    monkeypatch.chdir(Path(env["DPGOV_DATABASE_URL"].removeprefix("sqlite:///")).parent)
    relative = {**env, "DPGOV_DATABASE_URL": "sqlite:///service.sqlite"}
    args = ["--partitions", "2", "--full"]
    on_dask = _line([*args, "--engine", "dask", "--scheduler", scheduler], relative)
    monkeypatch.chdir(workers_folder)  # where the workers looked: the local engine's own line
    assert on_dask == _line([*args, "--workers", "2"], relative)
    assert on_dask.startswith(f"Error: no database at {workers_folder / 'service.sqlite'}: ")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--engine", "dask"], "Error: --engine dask needs --partitions (more than 1) or --shard"),
        (["--scheduler", "tcp://127.0.0.1:1"], "Error: --scheduler needs --engine dask"),
        (
            ["--partitions", "2", "--engine", "dask", "--scheduler-timeout", "1"],
            "Error: --scheduler-timeout needs --scheduler",
        ),
        (
            ["--partitions", "2", "--engine", "spark"],
            "Error: --engine must be one of local, dask, got 'spark'",
        ),
    ],
)
def test_engine_options_that_cannot_hold_are_one_line(
    service: Service, args: list[str], line: str
) -> None:
    env, _ = service
    assert _line(args, env) == line


def test_an_unreachable_scheduler_is_one_line_naming_the_timeout(service: Service) -> None:
    env, _ = service
    args = ["--partitions", "2", "--full", "--engine", "dask", "--scheduler", "tcp://127.0.0.1:9"]
    assert _line([*args, "--scheduler-timeout", "0.5"], env) == (
        "Error: --scheduler tcp://127.0.0.1:9: cannot reach the Dask scheduler within 0.5 s"
        " (--scheduler-timeout)"
    )


def test_a_malformed_scheduler_address_is_one_line(service: Service) -> None:
    env, _ = service
    args = ["--partitions", "2", "--full", "--engine", "dask", "--scheduler", "not a url::"]
    line = _line(args, env)
    assert line.startswith("Error: --scheduler not a url::: not a Dask scheduler address ("), line

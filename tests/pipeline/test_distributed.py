"""Parquet export and distributed aggregation: the same sketch, bit for bit, on every engine."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from dp_governor.api._keys import service_keys
from dp_governor.api.cli import app
from dp_governor.api.database import init_service_db
from dp_governor.api.demo.simulation import zipf_indices
from dp_governor.api.settings import Settings
from dp_governor.budget import Ledger, create_db_engine, utc_day
from dp_governor.mechanisms import HCMS
from dp_governor.pipeline.distributed import aggregate_files, group_files
from dp_governor.pipeline.flush import flush_inbox
from dp_governor.pipeline.fold import aggregate, load_sketch, mechanisms_by_params
from dp_governor.pipeline.ingest import Ingestor
from dp_governor.pipeline.parquet import (
    ExportResult,
    dataset_files,
    export_reports,
    iter_reports,
    partition_dir,
    write_reports,
)
from dp_governor.pipeline.seal import InboxSeal
from dp_governor.policies import default_policies, mechanism_for

# a few devices publish: the pipeline here, not the defaults' batch minimums
pytestmark = pytest.mark.usefixtures("small_batches")

SECRET = b"dist-secret-dist-secret-dist-secret!"
SEAL = InboxSeal([b"dist-shuffler-dist-shuffler-dist-shuffler"])
AUDIT_KEY = b"dist-audit-dist-audit-dist-audit-key!"
KEYS = {"DPGOV_DEVICE_KEY_SECRET": SECRET.decode(), "DPGOV_AUDIT_KEY": AUDIT_KEY.decode()}
DAY0 = datetime(2026, 11, 20, 12, tzinfo=UTC)
CASES = ("safari-energy-domains", "emoji", "quicktype")
runner = CliRunner()


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", CASES)
def test_parquet_round_trip_keeps_every_report(tmp_path: Path, name: str) -> None:
    policy = {p.name: p for p in default_policies()}[name]
    mech = mechanism_for(policy)
    rng = np.random.default_rng(5)
    words = ["hello", "world", "privacy", "budget"]
    batches = [mech.privatize([words[i % 4] for i in range(n)], rng=rng) for n in (300, 7)]
    path = tmp_path / "part.parquet"
    assert write_reports(path, mech, iter(batches)) == 307
    read = list(iter_reports(path, mech, batch_rows=100))
    assert [len(r) for r in read] == [100, 100, 100, 7]
    direct: Any = mech.sketch()  # the policy's mechanism: each sketch takes its own reports
    direct.add(batches[0]).add(batches[1])
    folded: Any = mech.sketch()
    for r in read:
        folded.add(r)
    assert _same(direct.to_arrays(), folded.to_arrays())


def test_files_of_other_parameters_are_refused(tmp_path: Path) -> None:
    mech = HCMS(epsilon=4.0, k=16, m=64)
    path = tmp_path / "part.parquet"
    write_reports(path, mech, iter([mech.privatize(["a"] * 10, rng=np.random.default_rng(1))]))
    other = HCMS(epsilon=2.0, k=16, m=64)
    with pytest.raises(ValueError, match="parameters other than"):
        list(iter_reports(path, other))


def test_file_groups_are_balanced_and_complete(tmp_path: Path) -> None:
    files = []
    for i, size in enumerate([900, 500, 400, 300, 200, 100]):
        f = tmp_path / f"f{i}"
        f.write_bytes(b"x" * size)
        files.append(f)
    groups = group_files(files, 2)
    assert sorted(p for g in groups for p in g) == sorted(files)
    sizes = sorted(sum(p.stat().st_size for p in g) for g in groups)
    assert sizes == [1200, 1200]
    assert len(group_files(files[:1], 4)) == 1


@dataclass
class Service:
    """A service database holding two days of reports of three use cases, folded by the job."""

    url: str
    ledger: Ledger
    ingestor: Ingestor
    days: tuple[int, int]

    def export(self, root: Path, name: str, **options: Any) -> ExportResult:
        """Export both days of a use case's stored reports to ``root``."""
        first, last = self.days
        mechanisms = mechanisms_by_params(self.ledger, name)
        return export_reports(self.ledger.engine, root, name, first, last, mechanisms, **options)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("dist")
    url = f"sqlite:///{tmp / 'dist.sqlite'}"
    engine = create_db_engine(url)
    init_service_db(engine)
    settings = Settings(device_key_secret=SECRET.decode(), audit_key=AUDIT_KEY.decode())  # type: ignore[arg-type]
    service_keys(settings, engine, record=True)  # the fingerprints a service's start records
    ledger = Ledger(engine, SECRET, audit_key=AUDIT_KEY)
    ledger.policies.ensure_defaults()
    ingestor = Ingestor(ledger, SECRET, seal=SEAL)
    policies = {p.name: p for p in default_policies()}
    rng = np.random.default_rng(11)
    words = ["hello", "world", "privacy", "budget", "sketch", "device"]
    for offset in (0, 1):
        now = DAY0 + timedelta(days=offset)
        for name in CASES:
            mech = mechanism_for(policies[name])
            values = [words[i] for i in zipf_indices(len(words), 700, 1.2, rng=rng)]
            reports = mech.privatize(values, rng=rng).to_dicts()
            items = [{"device_id": f"dev-{i}", "report": r} for i, r in enumerate(reports)]
            results = ingestor.submit_many(name, items, now=now)
            assert all(r.decision is not None and r.decision.accepted for r in results)
        flush_inbox(engine, seal=SEAL, now=now)  # a batch a day: each stored under its day
    assert aggregate(ledger).reports == 6 * 700
    yield Service(url, ledger, ingestor, (utc_day(DAY0), utc_day(DAY0) + 1))
    engine.dispose()


@pytest.mark.parametrize("name", CASES)
def test_export_then_aggregate_equals_the_services_sketches(
    service: Service, tmp_path: Path, name: str
) -> None:
    first, last = service.days
    policy = service.ledger.policies.get(name)
    read: list[tuple[int, int]] = []
    exported = service.export(tmp_path, name, rows_per_file=97, progress=lambda *p: read.append(p))
    assert exported.rows == 1400 and read[-1] == (1400, 1400) and read == sorted(read)
    mech = mechanism_for(policy)
    params = mech.fingerprint.params
    assert exported.partitions == {(first, params): 700, (last, params): 700}
    files = dataset_files(tmp_path, name, [first, last], params)
    assert len(files) == 2 * 8  # 700 rows in files of at most 97
    stored, _ = load_sketch(service.ledger, service.ingestor, policy, first, last)
    local = aggregate_files(mech, files)
    assert _same(local.to_arrays(), stored.to_arrays())
    # re-exporting replaces the partitions and leaves no staging directory behind
    service.export(tmp_path, name)
    assert len(dataset_files(tmp_path, name, [first, last], params)) == 2
    assert not list(tmp_path.rglob(".export-*"))
    day_dir = partition_dir(tmp_path, name, first, params)
    assert day_dir.parent.name == f"day={first}"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["aggregate", "nope"], 2, "unknown use case 'nope'"),
        (["aggregate", "emoji", "--scheduler", "tcp://127.0.0.1:1"], 2, "--engine dask"),
        (["aggregate", "emoji", "--from", "2026-11-02", "--to", "2026-11-01"], 2, "--from"),
        (["aggregate", "emoji", "--from", "yesterday"], 2, "--from"),
        (  # one line, as `audit report` says it
            ["aggregate", "emoji", "--engine", "spark"],
            2,
            "Error: --engine must be one of local, dask, got 'spark'",
        ),
        (["aggregate", "emoji", "--rows-per-file", "0"], 2, "--rows-per-file"),
    ],
)
def test_cli_aggregate_bad_input(
    service: Service, tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    result = runner.invoke(
        app,
        [*args, "--database-url", service.url, "--out", str(tmp_path / "pq")],
        env=KEYS,
    )
    assert result.exit_code == code, result.output
    assert message in result.output

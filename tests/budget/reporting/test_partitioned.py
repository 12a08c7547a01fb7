"""The report's pass over key ranges in worker processes merges into the single pass, exactly."""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from typer.testing import CliRunner

from benchmarks import scale
from dp_governor.api.app import create_app
from dp_governor.api.cli import app
from dp_governor.budget import Ledger, create_db_engine
from dp_governor.budget.reporting.loss import effective_epsilon_basis
from dp_governor.budget.reporting.partitioned import partitioned_basis
from dp_governor.budget.reporting.report import finish_report
from dp_governor.pipeline.purge import purge
from dp_governor.policies import PolicyUpdate
from tests.conftest import BACKENDS, make_engine
from tests.live import app_settings

DAYS = 12
TOKEN = "partitions-admin-token-partitions-0123"


@pytest.fixture(params=BACKENDS)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """A fresh database of one backend."""
    yield from make_engine(request.param, tmp_path)


def _open(url: str) -> Ledger:
    """The generated ledger at ``url``, opened in a worker process."""
    return Ledger(create_db_engine(url), scale.SECRET)


def _record(seen: list[tuple[int, int | None]], n: int, total: int | None) -> None:
    seen.append((n, total))


def test_partitioned_report_equals_the_single_pass(engine: Engine) -> None:
    """A random ledger (half the history purged): every split gives the same report, bit for bit."""
    ledger = Ledger(engine, scale.SECRET)
    rng = np.random.default_rng(1)
    devices = int(rng.integers(150, 400))
    scale.build(ledger, devices=devices, days=DAYS, rng=rng, retention_days=DAYS // 2)
    now = scale.noon(scale.FIRST_DAY + DAYS - 1)
    purge(ledger, now=now)  # horizons inside some windows: undated spend counts too
    single = finish_report(effective_epsilon_basis(ledger, now=now), accountant=ledger.accountant)
    assert single.totals.spent_lifetime.devices > devices // 2
    url = engine.url.render_as_string(hide_password=False)
    for partitions, workers in ((1, 1), (7, 2), (devices * 2, 2)):
        seen: list[tuple[int, int | None]] = []
        basis = partitioned_basis(
            ledger,
            functools.partial(_open, url),
            now=now,
            partitions=partitions,
            workers=workers,
            full=True,
            done=functools.partial(_record, seen),
        )
        merged = finish_report(basis, accountant=ledger.accountant)
        assert merged.to_dict() == single.to_dict(), (partitions, workers)
        ranges = min(partitions, single.totals.spent_lifetime.devices)
        assert seen == [(n, ranges) for n in range(ranges + 1)]  # the whole known at once
    seen = []
    forward = partitioned_basis(  # the summary the full passes stored, brought forward
        ledger,
        functools.partial(_open, url),
        now=now,
        partitions=7,
        workers=2,
        done=functools.partial(_record, seen),
    )
    assert finish_report(forward, accountant=ledger.accountant).to_dict() == single.to_dict()
    assert seen == [(1, None), (1, 1)]  # the whole is known once the summary is brought forward
    ledger.policies.update("emoji", PolicyUpdate(epsilon_per_report=1.0), allow_loosen=True)
    seen = []
    stale = partitioned_basis(  # a policy version added: the summary is stale, a full pass due
        ledger,
        functools.partial(_open, url),
        now=now,
        partitions=7,
        workers=2,
        done=functools.partial(_record, seen),
    )
    again = finish_report(effective_epsilon_basis(ledger, now=now), accountant=ledger.accountant)
    assert finish_report(stale, accountant=ledger.accountant).to_dict() == again.to_dict()
    parts = 1 + min(7, single.totals.spent_lifetime.devices)
    assert seen == [(1, None), *((n, parts) for n in range(1, parts + 1))]


def test_account_splits_cut_the_keys_into_equal_ranges(engine: Engine) -> None:
    ledger = Ledger(engine, scale.SECRET)
    scale.build(ledger, devices=100, days=3, rng=np.random.default_rng(3))
    keys = [dk for dk, _ in ledger.accounts()]
    splits = ledger.account_splits(4)
    assert splits == [keys[len(keys) * k // 4 - 1] for k in (1, 2, 3)]
    bounds: list[str | None] = ["", *splits, None]
    parts = [
        [dk for dk, _ in ledger.accounts(after=a or "", through=t)]
        for a, t in itertools.pairwise(bounds)
    ]
    assert [dk for part in parts for dk in part] == keys
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert ledger.account_splits(len(keys) + 5) == keys[:-1]  # one device a range at most


def test_audit_report_partitions_from_the_command_line(tmp_path: Path) -> None:
    env = {
        "DPGOV_DATABASE_URL": f"sqlite:///{tmp_path / 'service.sqlite'}",
        "DPGOV_SECRET_FILE": str(tmp_path / "secret"),
        "DPGOV_AUDIT_KEY_FILE": str(tmp_path / "audit.key"),
        "DPGOV_SHUFFLER_KEY_FILE": str(tmp_path / "shuffler.key"),
    }
    with TestClient(create_app(app_settings(tmp_path, TOKEN))) as client:
        items = [{"device_id": f"d{i}", "report": {"j": 1, "l": 2, "bit": 1}} for i in range(40)]
        r = client.post(
            "/v1/use-cases/safari-energy-domains/reports:batch",
            json={"items": items},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert r.json()["accepted"] == 40, r.text
    runner = CliRunner()
    partitioned = ["audit", "report", "--json", "--partitions", "3", "--workers", "2"]
    first = runner.invoke(app, partitioned, env=env)  # no summary yet: the ranges follow
    assert first.exit_code == 0, first.output
    assert "of 1 parts" not in first.stderr  # no whole claimed before the ranges are known
    assert "audit report: the summary or key ranges: 4 of 4 parts (100%)" in first.stderr
    single = runner.invoke(app, ["audit", "report", "--json", "-q"], env=env)
    assert single.exit_code == 0, single.output
    split = runner.invoke(app, [*partitioned, "--full"], env=env)
    assert split.exit_code == 0, split.output
    assert "audit report: the summary or key ranges: 3 of 3 parts (100%)" in split.stderr
    forward = runner.invoke(app, partitioned, env=env)  # the summary the full pass stored
    assert forward.exit_code == 0, forward.output
    assert "audit report: the summary or key ranges: 1 of 1 parts (100%)" in forward.stderr
    one, other, again = (json.loads(r.stdout) for r in (single, split, forward))
    for each in (one, other, again):
        each.pop("computed_at")  # the instant each run read the ledger
    assert one == other == again and one["totals"]["spent_lifetime"]["devices"] == 40
    refused = runner.invoke(app, ["audit", "report", "--workers", "2"], env=env)
    assert refused.exit_code == 2 and "--workers needs --partitions" in refused.stderr
    refused = runner.invoke(app, ["audit", "report", "--partitions", "0"], env=env)
    assert refused.exit_code == 2 and "--partitions" in refused.stderr

"""A ledger split by device key over several databases reports as one database would, exactly.

Each ledger is generated (``benchmarks.scale``), half its history purged, then its devices
copied into 2-3 shard databases by the routing rule of docs/scaling.md (``benchmarks.shards``);
with ``DPGOV_TEST_DATABASE_URL`` set the last shard is a PostgreSQL schema.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from benchmarks import scale
from benchmarks.shards import split
from dp_governor.budget import Ledger, create_db_engine, init_db
from dp_governor.budget.clock import utc_day
from dp_governor.budget.privacy.accountant import Accountant
from dp_governor.budget.reporting.central import (
    CentralLine,
    CentralLoss,
    central_line,
    central_lines,
)
from dp_governor.budget.reporting.loss import effective_epsilon_basis
from dp_governor.budget.reporting.report import ReportBasis, finish_report
from dp_governor.budget.reporting.sharded import (
    ShardMisrouted,
    ShardPoliciesDiffer,
    merge_central,
    shard_of,
    sharded_basis,
)
from dp_governor.budget.reporting.views import what_if_device_budget
from dp_governor.budget.storage.db import scratch_schema
from dp_governor.budget.storage.tables import Account, ShuffledBatch
from dp_governor.pipeline.purge import purge
from dp_governor.policies import PolicyCreate
from dp_governor.policies.device import DeviceBudgetCreate
from dp_governor.policies.model import Policy
from tests.conftest import PG_URL

DAYS = 10
NOW = scale.noon(scale.FIRST_DAY + DAYS - 1)


def _open(url: str) -> Ledger:
    """A shard at ``url``, opened in a worker process."""
    return Ledger(create_db_engine(url), scale.SECRET)


@contextmanager
def _shards(tmp_path: Path, n: int) -> Iterator[list[Engine]]:
    """``n`` fresh shard databases: SQLite files, the last a PostgreSQL schema if there is one."""
    with ExitStack() as stack:
        urls = [f"sqlite:///{tmp_path / f'shard{i}.sqlite'}" for i in range(n)]
        if PG_URL is not None:
            urls[-1] = stack.enter_context(scratch_schema(PG_URL, "shard"))
        engines = [create_db_engine(url) for url in urls]
        for engine in engines:
            stack.callback(engine.dispose)
            init_db(engine)
        yield engines


def _batch_rows(rng: np.random.Generator, days: int) -> list[dict[str, Any]]:
    """Random published batches of emoji and quicktype over the last ``days`` days."""
    rows = []
    for _ in range(int(rng.integers(1, 6))):
        layers = sorted(rng.integers(1, 5_000, size=int(rng.integers(1, 3))).tolist())[::-1]
        day = scale.FIRST_DAY + DAYS - 1 - int(rng.integers(0, days))
        rows.append(
            {
                "use_case": str(rng.choice(["emoji", "quicktype"])),
                "day": day,
                "first_day": day,
                "last_day": day,
                "devices": layers[0],
                "reports": sum(layers),
                "max_per_device": len(layers),
                "layers": orjson.dumps(layers).decode(),
                "untagged": 0,
                "epsilon_micro": 4_000_000,
                "min_batch_devices": 1000,
            }
        )
    return rows


def _publish(engine: Engine, rows: Sequence[dict[str, Any]]) -> None:
    if rows:
        with engine.begin() as conn:
            conn.execute(ShuffledBatch.__table__.insert(), list(rows))  # type: ignore[attr-defined]


def _without_shards(basis: ReportBasis, accountant: Accountant) -> dict[str, Any]:
    """The report at its policies' delta, as JSON, without what only a sharded one says."""
    report = finish_report(basis, accountant=accountant)
    out = report.to_dict()
    out["provenance"].pop("shards", None)
    return out


def _sharded(engines: Sequence[Engine], partitions: int) -> ReportBasis:
    urls = [e.url.render_as_string(hide_password=False) for e in engines]
    ledgers = [Ledger(e, scale.SECRET) for e in engines]
    openers = [functools.partial(_open, url) for url in urls]
    return sharded_basis(ledgers, openers, now=NOW, partitions=partitions, workers=2)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_sharded_report_equals_the_single_database(tmp_path: Path, seed: int) -> None:
    """Seeded random ledgers over 2-3 shards: the merged report is the single one, bit for bit.

    The published batches live in one shard (as if one shard's flush published them all),
    so the central figures must come out the same too.
    """
    rng = np.random.default_rng(seed)
    source = create_db_engine(f"sqlite:///{tmp_path / 'source.sqlite'}")
    init_db(source)
    ledger = Ledger(source, scale.SECRET)
    devices = int(rng.integers(120, 320))
    scale.build(ledger, devices=devices, days=DAYS, rng=rng, retention_days=DAYS // 2)
    purge(ledger, now=NOW)  # horizons inside some windows: undated spend counts too
    batches = _batch_rows(rng, DAYS)
    _publish(source, batches)
    single = effective_epsilon_basis(ledger, now=NOW)
    n = int(rng.integers(2, 4))
    with _shards(tmp_path, n) as engines:
        accounts = split(source, engines)
        _publish(engines[seed % n], batches)
        keys = [dk for dk, _ in ledger.accounts()]
        assert accounts == [sum(shard_of(k, n) == i for k in keys) for i in range(n)]
        merged = _sharded(engines, partitions=int(rng.integers(1, 4)))
    assert _without_shards(merged, ledger.accountant) == _without_shards(single, ledger.accountant)
    assert single.central, "no central figure compared"
    covered = merged.provenance["shards"]
    assert covered["shards"] == n and covered["devices"] == single.spent_lifetime.devices
    assert sum(covered["devices_per_shard"]) == covered["devices"]
    source.dispose()


def test_shards_with_other_policies_are_refused(tmp_path: Path) -> None:
    """A shard whose policies differ is named; when and by whom a version was written is not."""
    source = create_db_engine(f"sqlite:///{tmp_path / 'source.sqlite'}")
    init_db(source)
    scale.build(
        Ledger(source, scale.SECRET), devices=60, days=3, rng=np.random.default_rng(5), audit=False
    )
    with _shards(tmp_path, 3) as engines:
        split(source, engines)
        with engines[0].begin() as conn:
            conn.execute(text("UPDATE policies SET actor = 'someone', created_at = created_at"))
        assert _sharded(engines, partitions=1).provenance["shards"]["devices"] > 0
        with engines[2].begin() as conn:
            conn.execute(text("UPDATE policies SET max_reports_per_day = 7 WHERE name = 'emoji'"))
        with pytest.raises(ShardPoliciesDiffer) as refused:
            _sharded(engines, partitions=1)
        assert refused.value.shard == 2
    source.dispose()


# -- the central figures' merge, over random batches in random shards ----------------------------

TODAY = utc_day(datetime(2026, 11, 22, tzinfo=UTC))
EMOJI = Policy(
    version=1,
    **PolicyCreate.model_validate(
        {
            "name": "emoji",
            "mechanism": "cms",
            "k": 16,
            "m": 64,
            "epsilon_per_report": 4.0,
            "max_reports_per_day": 2,
            "retention_days": 30,
            "min_batch_devices": 1000,
        }
    ).model_dump(),
)


@st.composite
def _shard_batches(draw: st.DrawFn) -> list[list[ShuffledBatch]]:
    """2-3 shards' batches of emoji: days in and out of the 30-day window, a few sizes."""
    sizes = st.sampled_from([1, 40, 1_000, 30_000])
    shards = []
    for _ in range(draw(st.integers(2, 3))):
        batches = []
        for _ in range(draw(st.integers(0, 3))):
            layers = sorted(draw(st.lists(sizes, min_size=1, max_size=2)), reverse=True)
            day = TODAY - draw(st.integers(0, 40))
            untagged = draw(st.sampled_from([0, 0, 0, 2]))
            batches.append(
                ShuffledBatch(
                    use_case="emoji",
                    day=day,
                    first_day=day - draw(st.integers(0, 1)),
                    last_day=day,
                    devices=layers[0],
                    reports=sum(layers) + untagged,
                    max_per_device=len(layers),
                    layers=orjson.dumps(layers).decode(),
                    untagged=untagged,
                    epsilon_micro=4_000_000,
                    min_batch_devices=1000,
                )
            )
        shards.append(batches)
    return shards


def _eps(loss: CentralLoss | None) -> float | None:
    return None if loss is None else loss.epsilon


@settings(max_examples=20, deadline=None)
@given(_shard_batches())
def test_the_merged_central_figure_is_the_worst_shards(shards: list[list[ShuffledBatch]]) -> None:
    """Per horizon the largest shard figure (none if a shard with batches has none); days add."""
    lines = [central_lines({"emoji": EMOJI}, {"emoji": [EMOJI]}, b, TODAY) for b in shards]
    merged = merge_central(lines)
    present = [ls[0] for ls in lines if ls]
    if not present:
        assert merged == []
        return
    (line,) = merged
    if len(present) == 1:
        assert line == present[0]
        return

    def expected(horizon: str, of: list[CentralLine]) -> float | None:
        figures: list[CentralLoss | None] = [getattr(x, horizon) for x in of]
        known = [f.epsilon for f in figures if f is not None]
        return max(known) if of and len(known) == len(figures) else None

    windowed = [x for x in present if x.days]
    assert _eps(line.window) == expected("window", windowed)
    assert _eps(line.window_adaptive) == expected("window_adaptive", windowed)
    assert _eps(line.year) == expected("year", present)
    assert _eps(line.year_adaptive) == expected("year_adaptive", present)
    union = central_line(EMOJI, [EMOJI], [b for s in shards for b in s], TODAY)
    assert [(d.day, d.published, d.devices, d.reports) for d in line.days] == [
        (d.day, d.published, d.devices, d.reports) for d in union.days
    ]
    for mine, all_of in zip(line.days, union.days, strict=True):
        assert sorted((b.devices, b.reports) for b in mine.batches) == sorted(
            (b.devices, b.reports) for b in all_of.batches
        )
    assert any("merged over" in note for note in line.notes)


def test_the_sharded_what_if_adds_the_shards_counts(tmp_path: Path) -> None:
    """A policy edit's and a device budget's what-if over 2 shards equal the one database's."""
    from dp_governor.budget.reporting.sharded_what_if import (
        sharded_what_if,
        sharded_what_if_device_budget,
    )
    from dp_governor.budget.reporting.views import what_if, what_if_device_budget
    from dp_governor.policies.device import DeviceBudgetCreate

    source = create_db_engine(f"sqlite:///{tmp_path / 'source.sqlite'}")
    init_db(source)
    ledger = Ledger(source, scale.SECRET)
    rng = np.random.default_rng(7)
    scale.build(ledger, devices=250, days=DAYS, rng=rng, audit=False)
    current = ledger.policies.get("emoji")
    fields = current.model_dump(include=set(PolicyCreate.model_fields))
    proposed = PolicyCreate.model_validate(
        {**fields, "max_reports_per_day": 1, "window_epsilon_cap": 8.0}
    )
    device = DeviceBudgetCreate(epsilon_per_day=5.0)
    single = what_if(ledger, "emoji", proposed, now=NOW)
    single_device = what_if_device_budget(ledger, device, now=NOW)
    assert single.refused_next_report_today["proposed"] > 0, "nothing counted"
    with _shards(tmp_path, 2) as engines:
        split(source, engines)
        urls = [e.url.render_as_string(hide_password=False) for e in engines]
        ledgers = [Ledger(e, scale.SECRET) for e in engines]
        openers = [functools.partial(_open, url) for url in urls]
        merged = sharded_what_if(ledgers, openers, "emoji", proposed, now=NOW, workers=2)
        merged_device = sharded_what_if_device_budget(ledgers, openers, device, now=NOW, workers=2)
    assert merged == single
    assert merged_device == single_device
    source.dispose()


# -- every device read is checked to route to the shard it was read from ------------------------


def _alias(url: str, link: Path) -> str:
    """Another URL of the same database: a symlink ``link`` to the file, or PostgreSQL by name."""
    if url.startswith("sqlite:///"):
        link.symlink_to(url.removeprefix("sqlite:///"))
        return f"sqlite:///{link}"
    assert "127.0.0.1" in url, url
    return url.replace("127.0.0.1", "localhost", 1)


def _basis_of(urls: Sequence[str], partitions: int = 2, full: bool = True) -> ReportBasis:
    ledgers = [_open(url) for url in urls]
    try:
        openers = [functools.partial(_open, url) for url in urls]
        return sharded_basis(ledgers, openers, now=NOW, partitions=partitions, workers=2, full=full)
    finally:
        for ledger in ledgers:
            ledger.close()


def _device_what_if(urls: Sequence[str], full: bool = True) -> object:
    from dp_governor.budget.reporting.sharded_what_if import sharded_what_if_device_budget
    from dp_governor.policies.device import DeviceBudgetCreate

    ledgers = [_open(url) for url in urls]
    try:
        openers = [functools.partial(_open, url) for url in urls]
        budget = DeviceBudgetCreate(epsilon_per_day=5.0)
        return sharded_what_if_device_budget(
            ledgers, openers, budget, now=NOW, workers=2, full=full
        )
    finally:
        for ledger in ledgers:
            ledger.close()


def _copy_account(source: Engine, target: Engine, key: str, as_key: str | None = None) -> None:
    """``source``'s account ``key`` written into ``target`` (under ``as_key`` if given)."""
    table = Account.__table__  # type: ignore[attr-defined]
    with source.connect() as conn:
        row = dict(conn.execute(table.select().where(table.c.device_key == key)).mappings().one())
    row["device_key"] = as_key or key
    with target.begin() as conn:
        conn.execute(table.insert(), [row])


def _refusal(run: Any, urls: Sequence[str]) -> ShardMisrouted:
    with pytest.raises(ShardMisrouted) as refused:
        run(urls)
    return refused.value


def test_a_shard_holding_devices_routed_elsewhere_is_refused(tmp_path: Path) -> None:
    """The same database twice (two URLs), shards swapped, one device misrouted: each named.

    The report's and the what-if's full passes check every device they read; the good order
    passes. From the shards' stored summaries they check the devices they read and each
    shard's smallest and largest key: a swap shows there too (a lower bound, saying so), a
    single stray device only in a full pass. With ``DPGOV_TEST_DATABASE_URL`` set the second
    shard is a PostgreSQL schema.
    """
    source = create_db_engine(f"sqlite:///{tmp_path / 'source.sqlite'}")
    init_db(source)
    ledger = Ledger(source, scale.SECRET)
    scale.build(ledger, devices=80, days=3, rng=np.random.default_rng(11), audit=False)
    keys = [dk for dk, _ in ledger.accounts()]
    with _shards(tmp_path, 2) as engines:
        held = split(source, engines)
        assert all(held), "a shard without devices checks nothing"
        urls = [e.url.render_as_string(hide_password=False) for e in engines]
        assert _basis_of(urls).provenance["shards"]["devices_per_shard"] == held
        assert _device_what_if(urls) == what_if_device_budget(
            ledger, DeviceBudgetCreate(epsilon_per_day=5.0), now=NOW
        )
        for run in (_basis_of, _device_what_if):
            swapped = _refusal(run, urls[::-1])
            assert (swapped.shard, swapped.check.misrouted) == (0, held[1])
            assert swapped.check.example == 1
            twice = _refusal(run, [urls[1], _alias(urls[1], tmp_path / f"{run.__name__}.sqlite")])
            assert (twice.shard, twice.check.misrouted, twice.check.example) == (0, held[1], 1)
        from_summaries = functools.partial(_basis_of, full=False)
        for run in (from_summaries, functools.partial(_device_what_if, full=False)):
            swapped = _refusal(run, urls[::-1])  # the keys at each end route elsewhere
            assert (swapped.shard, swapped.check.example) == (0, 1) and swapped.check.partial
            assert 1 <= swapped.check.misrouted <= held[1]
            assert "at least" in str(swapped) and "--full counts every device" in str(swapped)
        stray = next(k for k in keys if shard_of(k, 2) == 0)
        _copy_account(source, engines[1], stray)
        for run in (_basis_of, _device_what_if):
            misrouted = _refusal(run, urls)
            assert (misrouted.shard, misrouted.check.misrouted, misrouted.check.example) == (
                1,
                1,
                0,
            )
            assert stray not in str(misrouted)
        assert from_summaries(urls).provenance["shards"]["devices_per_shard"] == [
            held[0],
            held[1] + 1,
        ]
        _device_what_if(urls, full=False)  # the stray, at neither end, is not read: no refusal
        with engines[1].begin() as conn:
            conn.execute(text("DELETE FROM accounts WHERE device_key = :k"), {"k": stray})
        _copy_account(source, engines[0], stray, as_key="not-a-hex-key")
        unroutable = _refusal(_basis_of, urls)
        assert (unroutable.shard, unroutable.check.unroutable) == (0, 1)
        assert "not hex" in str(unroutable)
    source.dispose()

"""Sharded and partitioned reports from stored summaries equal one database's full pass.

One ledger and the same devices routed over 2 shards (a SQLite file, and a PostgreSQL schema
when ``DPGOV_TEST_DATABASE_URL`` is set) take the same seeded random steps: charges, days
passing, purges (the pipeline's, and the ledger's alone), and policy edits (epsilon, retention,
group moves, retirement and re-creation). After each step the report over the shards, each
from its stored summary brought forward, and the one database's report over key ranges equal
the basis of a from-scratch scan of the one ledger, bit for bit.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from dp_governor.budget import Ledger, create_db_engine, init_db, utc_day
from dp_governor.budget.gate.prepared import device_key
from dp_governor.budget.reporting.partitioned import partitioned_basis
from dp_governor.budget.reporting.report import ReportBasis, basis_of
from dp_governor.budget.reporting.sharded import shard_of, sharded_basis
from dp_governor.budget.reporting.summary import brought_forward, report_passes
from dp_governor.budget.storage.db import scratch_schema
from dp_governor.pipeline.purge import purge
from dp_governor.policies import PolicyCreate, PolicyUpdate
from tests.budget.reporting.test_summary import DEVICES, START, reference
from tests.conftest import PG_URL, SECRET

STEPS = 30


def _open(url: str) -> Ledger:
    """A shard, or the one ledger, at ``url`` (in a worker process, or here)."""
    return Ledger(create_db_engine(url), SECRET)


@pytest.fixture
def shard_urls(tmp_path: Path) -> Iterator[list[str]]:
    """Two fresh shards with the default policies: SQLite, then PostgreSQL if there is one."""
    with ExitStack() as stack:
        urls = [f"sqlite:///{tmp_path / f'shard{i}.sqlite'}" for i in range(2)]
        if PG_URL is not None:
            urls[-1] = stack.enter_context(scratch_schema(PG_URL, "shardsum"))
        for url in urls:
            engine = create_db_engine(url)
            init_db(engine)
            Ledger(engine, SECRET).policies.ensure_defaults()
            engine.dispose()
        yield urls


def _edit(ledgers: Sequence[Ledger], name: str, change: PolicyUpdate) -> None:
    """``change`` written everywhere; one refused (the same everywhere) writes nothing."""
    for ledger in ledgers:
        try:
            ledger.policies.update(name, change, allow_loosen=True)
        except ValueError:
            pass


def _retire_or_restore(ledgers: Sequence[Ledger], rng: np.random.Generator, name: str) -> None:
    """A retired use case created again, or an active one retired, everywhere."""
    book = ledgers[0].book()
    retired = sorted(n for n, p in book.latest.items() if not p.active)
    if retired and rng.random() < 0.5:
        data = book.latest[retired[0]].model_dump(include=set(PolicyCreate.model_fields))
        for ledger in ledgers:
            try:
                ledger.policies.create(PolicyCreate(**data), allow_loosen=True)
            except ValueError:
                pass
    elif len(book.active) > 2:
        for ledger in ledgers:
            ledger.policies.delete(name)


def _step(
    whole: Ledger, shards: Sequence[Ledger], rng: np.random.Generator, now: datetime
) -> datetime:
    """One random change, made to the one ledger and to the shards alike; the time after it."""
    everywhere = [whole, *shards]
    kinds = ["charge", "day", "purge", "raw purge", "epsilon", "retention", "move", "retire"]
    kind = kinds[int(rng.choice(len(kinds), p=np.array([8, 4, 2, 1, 1, 1, 1, 1]) / 19))]
    names = [p.name for p in whole.book().active]
    name = names[int(rng.integers(len(names)))]
    if kind == "charge":
        for _ in range(int(rng.integers(1, 11))):
            device = DEVICES[int(rng.integers(len(DEVICES)))]
            use_case = names[int(rng.integers(len(names)))]
            routed = shards[shard_of(device_key(SECRET, device), len(shards))]
            for ledger in (whole, routed):
                ledger.charge(device, use_case, now=now)
    elif kind == "day":
        now += timedelta(days=int(rng.integers(1, 4)))
    elif kind == "purge":
        for ledger in everywhere:
            purge(ledger, now=now)
    elif kind == "raw purge":  # without the pipeline: the summaries stay behind the horizons
        for ledger in everywhere:
            ledger.purge(now=now)
    elif kind == "epsilon":
        _edit(everywhere, name, PolicyUpdate(epsilon_per_report=[1.0, 2.0, 4.0][rng.integers(3)]))
    elif kind == "retention":
        _edit(everywhere, name, PolicyUpdate(retention_days=int(rng.integers(1, 7))))
    elif kind == "move":
        _edit(everywhere, name, PolicyUpdate(budget_group=[None, "g", "h"][rng.integers(3)]))
    else:
        _retire_or_restore(everywhere, rng, name)
    return now


def _record(parts: list[tuple[int, int]], finished: int, known: int) -> None:
    parts.append((finished, known))


def _as_one(basis: ReportBasis) -> ReportBasis:
    """``basis`` without what only a sharded report says."""
    return replace(basis, provenance={k: v for k, v in basis.provenance.items() if k != "shards"})


@pytest.mark.parametrize("seed", [1, 2])
def test_reports_from_summaries_equal_a_full_pass_across_random_steps(
    ledger: Ledger, shard_urls: list[str], seed: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dpgov.reporting")
    rng = np.random.default_rng(seed)
    shards = [_open(url) for url in shard_urls]
    openers = [functools.partial(_open, url) for url in shard_urls]
    url = ledger.engine.url.render_as_string(hide_password=False)
    for i, name in enumerate(p.name for p in ledger.book().active):  # windows of a few days
        _edit([ledger, *shards], name, PolicyUpdate(retention_days=1 + i % 4))
    now, forwarded = START, 0
    try:
        for _ in range(STEPS):
            now = _step(ledger, shards, rng, now)
            expected = reference(ledger, now)
            parts: list[tuple[int, int]] = []
            merged = sharded_basis(
                shards,
                openers,
                now=now,
                partitions=int(rng.integers(1, 4)),
                workers=1,
                done=functools.partial(_record, parts),
            )
            assert _as_one(merged) == expected
            forwarded += parts[-1] == (2, 2)  # both summaries brought forward, no range read
            one = partitioned_basis(
                ledger, functools.partial(_open, url), now=now, partitions=3, workers=1
            )
            assert one == expected
        stale = [r.getMessage() for r in caplog.records if "stale" in r.getMessage()]
        edits = [m for m in stale if "policy version" in m]
        # most reports started from the summaries: a full pass only after an edit or a raw purge
        assert forwarded >= STEPS // 2 and len(stale) - len(edits) <= 3 * STEPS // 4, stale
        for full in (True, False):  # in worker processes, as the command line runs them
            merged = sharded_basis(shards, openers, now=now, partitions=2, workers=2, full=full)
            assert _as_one(merged) == expected
    finally:
        for shard in shards:
            shard.close()


@pytest.mark.parametrize("read_again", [500, 0])
def test_a_full_pass_in_small_chunks_under_charges_stores_a_summary_that_carries_forward(
    ledger: Ledger, read_again: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of 3 accounts while devices are charged: each chunk's new charges are exact.

    A chunk that missed one of its devices' charges (or claimed another's) would leave a
    summary that the next report cannot bring forward, or brings forward wrong. With
    ``read_again`` 0 every chunk on PostgreSQL settles the ids first.
    """
    monkeypatch.setattr("dp_governor.budget.reporting.new_charges._READ_AGAIN", read_again)
    now, stop, errors = START, threading.Event(), []

    def charge(offset: int) -> None:
        rng = np.random.default_rng(offset)
        try:
            while not stop.is_set():
                device = DEVICES[int(rng.integers(len(DEVICES)))]
                ledger.charge(f"{device}-{rng.integers(4)}", "emoji", now=now)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    for device in DEVICES:
        ledger.charge(device, "emoji", now=now)
    writers = [threading.Thread(target=charge, args=(i,)) for i in range(2)]
    for w in writers:
        w.start()
    try:
        for _ in range(4):
            report_passes(ledger, now=now, chunk=3, full=True)
    finally:
        stop.set()
        for w in writers:
            w.join(60)
    assert not errors
    forward = brought_forward(ledger, now=now)
    assert forward is not None, "the stored summary could not be brought forward"
    book, summary = forward
    day = utc_day(now)
    basis = basis_of(book, day, summary.window, summary.lifetime, computed_at=now.isoformat())
    expected = reference(ledger, now)
    assert replace(basis, central=expected.central) == expected

"""The effective-epsilon report over a ledger sharded by device key against one database.

Usage: ``python -m benchmarks.shards [--devices 100000] [--days 30] [--shards 2]
[--next-day-charges 1000] [--database-url URL]``.

Builds one ledger (:func:`benchmarks.scale.build`, no audit entries: the report does not read
them), copies its devices into ``--shards`` databases by the routing rule of docs/scaling.md
(:func:`split`), then runs the report's basis on the one database
(:func:`~dp_governor.budget.reporting.loss.effective_epsilon_basis`) and over the shards
(:func:`~dp_governor.budget.reporting.sharded.sharded_basis`, one worker process a shard), each
in a spawned process of its own, and checks the two equal. Then charges
``--next-day-charges`` devices on the next day (each through its shard's gate) and runs the
sharded report again from the summaries the first run stored (each shard's brought forward in
a worker), then as a full pass (``full``), and checks the two equal; the what-if over the shards
of a tighter first use case (:func:`proposal`) the same way, from each shard's stored what-if
(written on the day before) and as a full pass, then from the stored what-ifs again after as many
more charges the same day. Prints a Markdown table:
CPU seconds (the process and its workers), wall seconds and peak RSS (the largest process), and
the CPU seconds the sharded pass spends checking that each device routes to its shard.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import multiprocessing
import resource
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from typing import Any

import numpy as np
from sqlalchemy import Engine, Table, select, text

from benchmarks import scale
from dp_governor.budget import Ledger, create_db_engine
from dp_governor.budget.gate.prepared import device_key
from dp_governor.budget.reporting.routing import RouteCheck
from dp_governor.budget.reporting.sharded import shard_of
from dp_governor.budget.reporting.sharded_what_if import sharded_what_if
from dp_governor.budget.storage.tables import (
    Account,
    Charge,
    IdempotencyRecord,
    RetentionHorizon,
    SlotBudgets,
)
from dp_governor.policies.device import DeviceBudgetVersion
from dp_governor.policies.model import Policy, PolicyCreate

__all__ = ["main", "proposal", "split"]

_WHOLE: tuple[Any, ...] = (Policy, DeviceBudgetVersion, RetentionHorizon, SlotBudgets)
_ROUTED: tuple[Any, ...] = (Account, Charge, IdempotencyRecord)
_CHUNK = 20_000


def _rows(engine: Engine, table: Table) -> Iterator[list[dict[str, Any]]]:
    """Every row of ``table``, :data:`_CHUNK` at a time, as column mappings."""
    with engine.connect() as conn:
        result = conn.execution_options(stream_results=True).execute(select(table))
        for part in result.mappings().partitions(_CHUNK):
            yield [dict(r) for r in part]


def split(source: Engine, targets: Sequence[Engine]) -> list[int]:
    """Copy ``source``'s ledger into ``targets`` (initialised, empty) as shards; accounts each.

    The policy tables, horizons and the slot-budget mark replace every shard's own; each
    account, charge and idempotency record goes to the shard its device key routes to
    (:func:`dp_governor.budget.reporting.sharded.shard_of`). Nothing else is copied (the
    audit log, the inbox and the published batches are each shard's own). On PostgreSQL each
    shard's charge id sequence is set past the ids copied, as the gate's next charge needs.
    """
    accounts = [0] * len(targets)
    for model in (*_WHOLE, *_ROUTED):
        table: Table = model.__table__
        if model in _WHOLE:  # what the schema's creation wrote is the source's to say
            for target in targets:
                with target.begin() as conn:
                    conn.execute(table.delete())
        for rows in _rows(source, table):
            parts: list[list[dict[str, Any]]] = [[] for _ in targets]
            for row in rows:
                if model in _WHOLE:
                    for part in parts:
                        part.append(row)
                else:
                    parts[shard_of(row["device_key"], len(targets))].append(row)
            for shard, (target, part) in enumerate(zip(targets, parts, strict=True)):
                if part:
                    with target.begin() as conn:
                        conn.execute(table.insert(), part)
                    if model is Account:
                        accounts[shard] += len(part)
    for target in targets:
        _sequence_past_ids(target)
    return accounts


def _sequence_past_ids(engine: Engine) -> None:
    """PostgreSQL: the charges' id sequence set to the largest id held (rows copied with ids)."""
    if engine.dialect.name != "postgresql":
        return
    with engine.begin() as conn:
        conn.execute(
            text(
                "SELECT setval(pg_get_serial_sequence('charges', 'id'),"
                " coalesce(max(id), 1), max(id) IS NOT NULL) FROM charges"
            )
        )


def _open(url: str) -> Ledger:
    """A generated ledger (or shard) at ``url``, opened in a worker process."""
    return Ledger(create_db_engine(url), scale.SECRET)


def proposal(ledger: Ledger) -> tuple[str, PolicyCreate]:
    """The first active use case with one report a day and a window cap of twice its epsilon."""
    policy = ledger.book().active[0]
    fields = policy.model_dump(include=set(PolicyCreate.model_fields))
    change = {"max_reports_per_day": 1, "window_epsilon_cap": 2 * policy.epsilon_per_report}
    return policy.name, PolicyCreate.model_validate({**fields, **change})


def _what_if(urls: list[str], ledgers: list[Ledger], now: Any, full: bool, workers: int) -> Any:
    """The what-if of :func:`proposal` over the shards ``urls`` (opened as ``ledgers``)."""
    name, proposed = proposal(ledgers[0])
    openers = [functools.partial(_open, url) for url in urls]
    return sharded_what_if(ledgers, openers, name, proposed, now=now, workers=workers, full=full)


def _timed(urls: list[str], day: int, full: bool, workers: int, what: str, queue: Any) -> None:
    """The report's basis (or ``what`` ``"what-if"``) on one database or over shards ``urls``."""
    from dp_governor.budget.reporting.loss import effective_epsilon_basis
    from dp_governor.budget.reporting.sharded import sharded_basis

    now = scale.noon(day)
    ledgers = [_open(url) for url in urls]
    t0, cpu = time.perf_counter(), time.process_time()
    if what == "what-if":
        basis = _what_if(urls, ledgers, now, full, workers)
    elif len(urls) == 1:
        basis = effective_epsilon_basis(ledgers[0], now=now, full=full)
    else:
        openers = [functools.partial(_open, url) for url in urls]
        basis = sharded_basis(ledgers, openers, now=now, workers=workers, full=full)
        kept = {k: v for k, v in basis.provenance.items() if k != "shards"}
        basis = dataclasses.replace(basis, provenance=kept)  # as the one database's
    wall, own = time.perf_counter() - t0, time.process_time() - cpu
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    workers_cpu = children.ru_utime + children.ru_stime
    peak = max(scale.own_peak_rss_mib(), children.ru_maxrss / 1024)
    for ledger in ledgers:
        ledger.close()
    queue.put((basis, own + workers_cpu, wall, peak))


def _run(
    urls: list[str], day: int, full: bool = True, workers: int | None = None, what: str = "report"
) -> tuple[Any, float, float, float]:
    """:func:`_timed` in a spawned process: ``(basis or what-if, CPU s, wall s, peak RSS MiB)``.

    ``workers``: processes of the sharded report (default one a shard; ``1``: none, in this one).
    """
    spawn = multiprocessing.get_context("spawn")
    queue = spawn.Queue()
    args = (urls, day, full, workers or len(urls), what, queue)
    process = spawn.Process(target=_timed, args=args)
    process.start()
    result = queue.get()
    process.join()
    return result  # type: ignore[no-any-return]


def _route_check_cpu(shards: Sequence[Engine]) -> float:
    """CPU seconds of the routing check alone over every shard's device keys, read beforehand.

    What the report's workers add to their pass: one :meth:`RouteCheck.see` a device.
    """
    keys = [[dk for dk, _ in Ledger(e, scale.SECRET).accounts()] for e in shards]
    cpu = time.process_time()
    for position, held in enumerate(keys):
        check = RouteCheck(position, len(shards))
        for key in held:
            check.see(key)
        check.refuse()
    return time.process_time() - cpu


def _charge_next_day(shards: Sequence[Engine], day: int, charges: int, first: int = 0) -> None:
    """``charges`` new devices (from number ``first``) charged once on ``day``, in their shards."""
    ledgers = [Ledger(e, scale.SECRET) for e in shards]
    use_case = ledgers[0].book().active[0].name
    for i in range(first, first + charges):
        device = f"next-day-{i}"
        shard = shard_of(device_key(scale.SECRET, device), len(shards))
        ledgers[shard].charge(device, use_case, now=scale.noon(day))


def main(argv: Sequence[str] | None = None) -> None:
    """Build, shard, and time the report both ways; print one row each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=100_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--database-url", default=None, help="default: temporary SQLite files")
    parser.add_argument("--next-day-charges", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=33)
    args = parser.parse_args(argv)
    if args.days < 2 or args.devices < 1 or args.shards < 2:
        parser.error("--days and --shards must be at least 2, --devices at least 1")
    with ExitStack() as stack:
        source = stack.enter_context(scale.database(args.database_url))
        built = scale.build(
            Ledger(source, scale.SECRET),
            devices=args.devices,
            days=args.days,
            rng=np.random.default_rng(args.seed),
            audit=False,
        )
        shards = [
            stack.enter_context(scale.database(args.database_url)) for _ in range(args.shards)
        ]
        accounts = split(source, shards)
        urls = [e.url.render_as_string(hide_password=False) for e in [source, *shards]]
        last = scale.FIRST_DAY + args.days - 1
        single, *one = _run(urls[:1], last)
        merged, *many = _run(urls[1:], last)  # stores each shard's summary
        assert merged == single, "the sharded report differs from the single database's"
        checked = _route_check_cpu(shards)
        _run(urls[1:], last, what="what-if")  # stores each shard's what-if
        _charge_next_day(shards, last + 1, args.next_day_charges)
        forward, *incremental = _run(urls[1:], last + 1, full=False)
        scanned, *full = _run(urls[1:], last + 1, full=True)
        again, *inline = _run(urls[1:], last + 1, full=False, workers=1)
        assert forward == scanned == again, "the report from the summaries differs from a full pass"
        what_if, *what_if_forward = _run(urls[1:], last + 1, full=False, what="what-if")
        what_if_again, *what_if_full = _run(urls[1:], last + 1, what="what-if")
        assert what_if == what_if_again, "the what-if from the summaries differs from a full pass"
        _charge_next_day(shards, last + 1, args.next_day_charges, first=args.next_day_charges)
        _, *what_if_same_day = _run(urls[1:], last + 1, full=False, what="what-if")
        print("| ledger | devices | charges | report CPU s | wall s | peak RSS MiB |")
        print("|---" * 6 + "|")
        print(
            f"| one database | {built.devices:,} | {built.charges:,}"
            f" | {one[0]:.1f} | {one[1]:.1f} | {one[2]:.0f} |"
        )
        each = " + ".join(f"{n:,}" for n in accounts)
        print(
            f"| {args.shards} shards ({each} accounts) | {built.devices:,} | {built.charges:,}"
            f" | {many[0]:.1f} | {many[1]:.1f} | {many[2]:.0f} |"
        )
        print(
            f"| of which the routing check of every device | {sum(accounts):,} | |"
            f" {checked:.3f} | | |"
        )
        after = built.devices + args.next_day_charges
        for name, (cpu, wall, peak), devices in (
            ("full pass", full, after),
            ("from the summaries", incremental, after),
            ("from the summaries, no worker process", inline, after),
            ("what-if, full pass", what_if_full, after),
            ("what-if from the stored what-ifs", what_if_forward, after),
            (
                f"what-if from the stored what-ifs, {args.next_day_charges:,} charges later",
                what_if_same_day,
                after + args.next_day_charges,
            ),
        ):
            print(
                f"| {args.shards} shards, next day after {args.next_day_charges:,} charges:"
                f" {name} | {devices:,} | | {cpu:.1f} | {wall:.1f} | {peak:.0f} |"
            )


if __name__ == "__main__":
    main()

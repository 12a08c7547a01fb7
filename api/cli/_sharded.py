"""``--shard URL ...``: the report and the what-if over a ledger sharded by device key.

Each shard is opened here (a refusal is one line naming the shard, exit 2), then its stored
summary brought forward, or its key ranges read, in worker processes by
:func:`dp_governor.budget.reporting.sharded.sharded_basis`.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn, TextIO

import typer

from dp_governor.api.cli._engine import worker_opener
from dp_governor.api.cli.common import Progress, Stages, load_settings, open_ledger, refuse

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from dp_governor.budget.ledger import Ledger
    from dp_governor.budget.reporting.report import EffectiveEpsilonReport
    from dp_governor.budget.reporting.routing import ShardMisrouted

__all__ = [
    "open_shards",
    "refuse_misrouted",
    "refuse_other_policies",
    "sharded_report",
    "shown",
]


def shown(url: str) -> str:
    """``url`` with its password hidden, as a message names it."""
    from sqlalchemy import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def _open_shard(shard: int, url: str) -> tuple[Ledger, Callable[[], Ledger]]:
    """Shard ``shard`` opened here, and its opener for a worker; a refusal names the shard.

    The settings' and the database's own refusal (one line) is caught and said again with
    the shard's number and URL in front, naming ``--shard`` where it names the database
    setting, exit 2: the command was given a shard it cannot use. Each shard is its own
    transparency log, opened under the origin its checkpoints are signed with (the report
    reads no checkpoint); the keys must be the same everywhere.
    """
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            settings = load_settings(url)
            ledger = open_ledger(settings, own_origin=True)
    except typer.Exit:
        problem = said.getvalue().strip().removeprefix("Error: ")
        problem = problem.replace("DPGOV_DATABASE_URL (or --database-url)", "--shard")
        refuse(f"--shard {shard} ({shown(url)}): {problem}")
    if said.getvalue():  # a warning of an open that went through: said as it was
        typer.echo(said.getvalue(), err=True, nl=False)
    return ledger, worker_opener(settings, own_origin=True)


def open_shards(urls: Sequence[str], opened: list[tuple[Ledger, Callable[[], Ledger]]]) -> None:
    """Open every shard into ``opened`` (the caller closes them); refuse one URL, or one twice.

    Each is ``(ledger, opener)``: the shard opened here, and its opener for a worker process.
    A single ``--shard`` is refused: one shard of several would be a part of the ledger reported
    as the whole (the routing rule over one shard holds every device).
    """
    if len(urls) == 1:
        refuse(
            "--shard needs every shard's database URL, two or more (one database: --database-url)"
        )
    repeated = next((u for i, u in enumerate(urls) if u in urls[:i]), None)
    if repeated is not None:
        refuse(f"--shard {shown(repeated)} is given twice: its devices would count twice")
    for shard, url in enumerate(urls):
        opened.append(_open_shard(shard, url))


def refuse_other_policies(urls: Sequence[str], shard: int) -> NoReturn:
    """The one line saying shard ``shard``'s policies differ from the first's (exit 2)."""
    refuse(
        f"--shard {shard} ({shown(urls[shard])}) has other policies than --shard 0"
        f" ({shown(urls[0])}): apply the same policies to every shard"
    )


def refuse_misrouted(urls: Sequence[str], exc: ShardMisrouted) -> NoReturn:
    """The one line saying a shard holds devices routed to another (exit 2), keys unnamed.

    A device key is a pseudonym of a device id: the line gives counts and a shard, no key.
    """
    refuse(
        f"--shard {exc.shard} ({shown(urls[exc.shard])}) {exc.problem('--shard')}: give each"
        " shard's database once, in routing order (--shard i holds the devices routed to i)"
    )


def sharded_report(
    urls: Sequence[str],
    partitions: int,
    workers: int,
    delta: float | None,
    sink: TextIO | None,
    full: bool = False,
    executor: Executor | None = None,
) -> EffectiveEpsilonReport:
    """Every shard's summary or key ranges in worker processes, merged (exit on refusal).

    ``executor`` (Dask's), when given, runs the parts instead of ``workers`` processes.
    """
    from dp_governor.budget import SystemClock
    from dp_governor.budget.reporting.report import finish_report
    from dp_governor.budget.reporting.sharded import (
        PoliciesChanged,
        ShardMisrouted,
        ShardPoliciesDiffer,
        sharded_basis,
    )

    opened: list[tuple[Ledger, Callable[[], Ledger]]] = []
    try:
        open_shards(urls, opened)
        ledgers = [ledger for ledger, _ in opened]
        with (
            Progress("audit report: the shards' summaries or ranges", "parts", stream=sink) as bar,
            Stages("audit report", stream=sink) as stages,
        ):
            bar(0)  # the whole is known once every summary is brought forward or found stale
            try:
                basis = sharded_basis(
                    ledgers,
                    [opener for _, opener in opened],
                    now=SystemClock().now(),
                    partitions=partitions,
                    workers=workers,
                    full=full,
                    done=bar,
                    executor=executor,
                )
            except ShardPoliciesDiffer as exc:
                refuse_other_policies(urls, exc.shard)
            except ShardMisrouted as exc:
                refuse_misrouted(urls, exc)
            except PoliciesChanged as exc:
                refuse(f"--shard {exc.source} ({shown(urls[exc.source])}): {exc}", 1)
            bar.close()
            stages("the bounds of every policy")
            return finish_report(basis, accountant=ledgers[0].accountant, delta=delta)
    finally:
        for ledger, _ in opened:
            ledger.close()

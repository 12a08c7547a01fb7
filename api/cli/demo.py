"""``dpgov demo``: the service on a temporary database (or the served one), a fleet over HTTP."""

from __future__ import annotations

from typing import Annotated

import typer

from dp_governor.api.cli.common import (
    Progress,
    load_settings,
    print_table,
    refuse,
    result_table,
)


def _cap(value: float | None) -> str:
    """A cap as the demo prints it: its value, or ``none``."""
    return "none" if value is None else f"{value:g}"


def demo(
    devices: Annotated[
        int, typer.Option(min=100, max=1_000_000, help="Simulated devices.")
    ] = 20_000,
    days: Annotated[int, typer.Option(min=1, max=30, help="Days of collection.")] = 3,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the simulation.")] = 7,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            help="Write into this database (the one `dpgov serve` uses, with the same keys)"
            " so that its dashboard shows the demo; default: a temporary database.",
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=65535,
            help="Port of the demo's own server on 127.0.0.1 (default: a free one).",
        ),
    ] = None,
) -> None:
    """Start the service on a database, run a fleet over real HTTP, show the results.

    Into a served database, the demo waits for the server's own job runs, and the same
    command run again the same UTC day completes an interrupted fleet instead of adding another.
    """
    import httpx
    from pydantic import TypeAdapter

    from dp_governor.api.client import ServiceError
    from dp_governor.api.demo.demo import run_demo
    from dp_governor.api.server import PortInUse
    from dp_governor.budget.reporting.report import EffectiveEpsilonReport
    from dp_governor.budget.reporting.report_text import render_text

    settings = None if database_url is None else load_settings(database_url)
    where = "a temporary database" if settings is None else "the database given"
    typer.echo(
        f"Simulating {devices:,d} devices over {days} days (emoji + new words), over HTTP,"
        f" into {where}."
    )
    with Progress("demo", "reports") as progress:
        try:
            result = run_demo(
                devices, days, seed=seed, progress=progress, settings=settings, port=port
            )
        except RuntimeError as exc:
            refuse(f"{exc} (check --database-url and the keys beside it)")
        except PortInUse as exc:
            refuse(f"--port: {exc.strerror}")
        except (ServiceError, httpx.HTTPError) as exc:
            again = (
                ""
                if settings is None
                else "; run the same command again today (UTC) to complete"
                " this fleet: what it sent is replayed, not charged twice"
            )
            refuse(f"the demo stopped: {exc}{again}", 1)
    true_top = sorted(result.emoji_truth, key=lambda k: -result.emoji_truth[k])[:10]
    print(
        f"\n{result.accepted:,d} of {result.submitted:,d} reports accepted, {result.refused:,d}"
        f" refused by a cap ({result.seconds:.0f} s)."
    )
    if result.replayed:
        print(
            f"{result.replayed:,d} of them had been sent by an earlier run of this fleet"
            f" ({result.fleet}), interrupted or not: replayed from their first decision, not"
            " charged again."
        )
    print("\nEmoji (CMS, eps 4): estimated top 10 beside the truth")
    table = result_table("rank", "emoji", "estimate", "95% +-", "true", "true rank")
    for rank, e in enumerate(result.emoji_top, start=1):
        true_rank = true_top.index(e["item"]) + 1 if e["item"] in true_top else "-"
        table.add_row(
            str(rank),
            e["item"],
            f"{e['count']:,.0f}",
            f"{1.96 * e['stderr']:,.0f}",
            f"{result.emoji_truth[e['item']]:,d}",
            str(true_rank),
        )
    print_table(table)
    if result.others:
        print(
            f"  The database holds {result.others:,d} more emoji reports in these days (another"
            " fleet or real devices): the estimates count them, the true column does not."
        )
    print("\nQuickType new words (SFP, eps 2 + 6): discovered without a dictionary")
    words = result_table("word", "estimate", "95% +-", "true", left=1)
    for d in result.words:
        words.add_row(
            d["word"],
            f"{d['count']:,.0f}",
            f"{1.96 * d['stderr']:,.0f}",
            f"{result.word_truth.get(d['word'], 0):,d}",
        )
    print_table(words)
    if not result.words:
        most = max(result.word_truth.values(), default=0)
        threshold = round(result.word_threshold)
        why = (  # a threshold of 0 publishes every word found: none was found
            f"No word reached the publication threshold of {threshold:,d} estimated reports"
            if threshold > 0
            else "No word was discovered"
        )
        print(
            f"  {why}; the most frequent word was sent {most:,d} times. SFP finds a word once"
            " thousands of devices send it: run with more --devices."
        )
    alike = "the same for every demo device: a refused report spends nothing"
    print(f"\nPrivacy spent by {result.spend_device}, from its ledger ({alike}):")
    for row in result.spend:
        print(
            f"  {row['use_case']:<12} {row['epsilon_lifetime']:>5g} in {result.days} days"
            f" (window {row['epsilon_window']:g}); "
            + (
                "no window or lifetime cap: unbounded over time"
                if row["window_cap"] is None and row["lifetime_cap"] is None
                else f"caps: window {_cap(row['window_cap'])}, lifetime {_cap(row['lifetime_cap'])}"
            )
        )
    report = TypeAdapter(EffectiveEpsilonReport).validate_python(result.effective_epsilon)
    print()
    print(render_text(report), end="")
    chain = result.audit
    print(
        f"\nAudit log: {'verified' if chain['ok'] else 'FAILED: ' + str(chain['problem'])},"
        f" {chain['entries']:,d} entries, signed checkpoint at entry"
        f" {chain['latest_checkpoint_seq']}."
    )
    if settings is not None:
        print("\n`dpgov serve` on this database shows all of it on its dashboard, at `/`.")

"""``dpgov budget``: a device's remaining budget for every use case."""

from __future__ import annotations

from typing import Annotated

import typer

from dp_governor.api.cli.common import DatabaseOption, load_settings, open_ledger


def budget(
    device_id: Annotated[str, typer.Argument(help="The device's id.")],
    database_url: DatabaseOption = None,
) -> None:
    """A device's remaining budget for every use case."""
    from dp_governor.budget import SystemClock

    if not device_id or len(device_id) > 256:
        typer.echo("Error: DEVICE_ID must be 1 to 256 characters", err=True)
        raise typer.Exit(2)
    ledger = open_ledger(load_settings(database_url))
    print(
        f"{'use case':<24} {'today':>5} {'left':>4} {'eps today':>9}"
        f" {'eps window':>10} {'eps ever':>9}"
    )
    for s in ledger.status(device_id, now=SystemClock().now()):
        print(
            f"{s.use_case:<24} {s.reports_today:>5} {s.reports_left_today:>4} {s.epsilon_today:>9g}"
            f" {s.epsilon_window:>10g} {s.epsilon_lifetime:>9g}"
        )

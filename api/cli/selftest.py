"""``dpgov selftest``: audit every policy's randomizer as installed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from dp_governor.api.cli.common import DatabaseOption, Progress, load_settings, open_ledger, refuse

if TYPE_CHECKING:
    from dp_governor.policies import PolicyBase


def selftest(
    samples: Annotated[
        int, typer.Option(min=10_000, max=100_000_000, help="Reports drawn per input.")
    ] = 2_000_000,
    seed: Annotated[int | None, typer.Option(min=0, help="Fixed seed (default: fresh).")] = None,
    defaults: Annotated[
        bool,
        typer.Option("--defaults", help="Audit Apple's default policies instead of a database's."),
    ] = False,
    database_url: DatabaseOption = None,
) -> None:
    """Audit every policy's randomizer in the database: exact at a small size, then empirically.

    The database is the one the other commands read (DPGOV_DATABASE_URL or --database-url),
    opened read-only with its keys checked; --defaults audits Apple's default policies instead.
    """
    if defaults and database_url is not None:
        refuse("give --defaults or --database-url, not both")
    policies = _policies(defaults, database_url)
    import numpy as np

    from dp_governor.mechanisms.empirical_audit import audit, exact_max_log_ratio
    from dp_governor.policies import mechanism_for

    rng = np.random.default_rng(seed)
    print(
        f"{'use case':<24} {'mech':<5} {'eps':>5} {'exact':>9} {'samples':>10}"
        f" {'lower':>7} {'estimate':>8} {'upper':>7}  verdict"
    )
    failed = 0
    progress = Progress("selftest", "reports")
    for policy in policies:
        mech = mechanism_for(policy)
        exact = exact_max_log_ratio(mech)
        result = audit(
            mech,
            "selftest-alpha",
            "selftest-zulu!",
            epsilon=policy.epsilon_per_report,
            samples=samples,
            rng=rng,
            progress=progress.step(f"selftest {policy.name}"),
        )
        progress.close()  # the bar's line ends before the policy's row
        exact_ok = abs(exact - policy.epsilon_per_report) < 1e-9
        verdict = "ok" if result.passed and exact_ok else "FAILED"
        if not exact_ok:
            verdict += " (exact loss differs from epsilon)"
        elif result.leaks_more:
            verdict += " (leaks more than charged)"
        elif not result.reaches:
            verdict += " (less signal than designed)"
        failed += verdict != "ok"
        print(
            f"{policy.name:<24} {policy.mechanism:<5} {policy.epsilon_per_report:>5g}"
            f" {exact:>9.6f} {samples:>10,d} {result.lower:>7.3f} {result.estimate:>8.3f}"
            f" {result.upper:>7.3f}  {verdict}",
            flush=True,
        )
    print(
        f"\nClopper-Pearson bounds at alpha = {1e-6:g} on ln P(E|x)/P(E|x') for the worst-case"
        " event E; exact = max |ln P(y|x) - ln P(y|x')| by enumeration at a small k and m."
    )
    if failed:
        typer.echo(f"Error: {failed} randomizer(s) failed the audit", err=True)
        raise typer.Exit(1)


def _policies(defaults: bool, database_url: str | None) -> list[PolicyBase]:
    """Apple's defaults, or the active policies of the configured database (read-only)."""
    from dp_governor.api._handles import policy_store

    if defaults:
        from dp_governor.policies import default_policies

        return list(default_policies())
    ledger = open_ledger(load_settings(database_url))
    try:
        return list(policy_store(ledger).list())
    finally:
        ledger.close()

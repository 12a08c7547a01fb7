"""``dpgov selftest``: audit every policy's randomizer as installed."""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
import typer

from api.cli.common import load_settings, open_ledger
from mechanisms.empirical_audit import audit, exact_max_log_ratio
from policies import default_policies, mechanism_for


def selftest(
    samples: Annotated[
        int, typer.Option(min=10_000, max=100_000_000, help="Reports drawn per input.")
    ] = 2_000_000,
    seed: Annotated[int | None, typer.Option(min=0, help="Fixed seed (default: fresh).")] = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url", help="Audit this database's policies (default: Apple's defaults)."
        ),
    ] = None,
) -> None:
    """Audit every policy's randomizer as installed: exact at a small size, then empirically."""
    if database_url is None:
        policies: list[Any] = list(default_policies())
    else:
        ledger = open_ledger(load_settings(database_url))
        policies = ledger.policies.list()
        ledger.engine.dispose()
    rng = np.random.default_rng(seed)
    print(
        f"{'use case':<24} {'mech':<5} {'eps':>5} {'exact':>9} {'samples':>10}"
        f" {'lower':>7} {'estimate':>8} {'upper':>7}  verdict"
    )
    failed = 0
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
        )
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
            f" {result.upper:>7.3f}  {verdict}"
        )
    print(
        f"\nClopper-Pearson bounds at alpha = {1e-6:g} on ln P(E|x)/P(E|x') for the worst-case"
        " event E; exact = max |ln P(y|x) - ln P(y|x')| by enumeration at a small k and m."
    )
    if failed:
        typer.echo(f"Error: {failed} randomizer(s) failed the audit", err=True)
        raise typer.Exit(1)

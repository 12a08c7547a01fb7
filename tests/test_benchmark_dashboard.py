"""The dashboard benchmark runs end to end on a small ledger and prints every row it names."""

from __future__ import annotations

import re

from benchmarks import dashboard


def test_the_dashboard_benchmark_measures_every_case_on_a_small_ledger() -> None:
    rows = dashboard.run("sqlite", None, charges=300, requests=3)
    whats = [row.split(" | ")[2] for row in rows]
    assert whats == [
        "fresh install: first page, computes the figures",
        "snapshot job (`dashboard`)",
        "first page of a new process",
        "steady page (mean of 3)",
        "steady report (mean of 3)",
        "steady distribution (mean of 3)",
        "first page after a job run",
    ]
    for row in rows:  # figures, not their size: no test depends on the machine's speed
        assert re.fullmatch(r"\| sqlite \| 300 \| .+ \| [\d,.]+ ms \| [\d,.]+ ms \|", row), row

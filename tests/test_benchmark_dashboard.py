"""The dashboard benchmark runs end to end on a small ledger and prints every row it names."""

from __future__ import annotations

import re

from benchmarks import dashboard


def test_the_dashboard_benchmark_measures_every_case_on_a_small_ledger() -> None:
    rows = dashboard.run("sqlite", None, devices=200, days=3, new_charges=20, requests=3)
    whats = [row.split(" | ")[3] for row in rows]
    assert re.fullmatch(r"fresh install: first page, answered (200|503, Retry-After \d+)", whats[0])
    assert re.fullmatch(r"`dashboard` job after \d+ new charges", whats[3])
    assert re.fullmatch(r"`dashboard` job the next day, after \d+ new charges", whats[5])
    assert re.fullmatch(r"the series brought forward, the next day after \d+ new charges", whats[6])
    assert whats[1:3] + whats[4:5] + whats[7:] == [
        "fresh install: figures stored by the refresher, from that request",
        "fresh install: first page once stored",
        "`dashboard` job, nothing new",
        "the series from their windows' charges (as many use cases)",
        "first page of a new process",
        "steady page (mean of 3)",
        "steady report (mean of 3)",
        "steady distribution (mean of 3)",
        "first page after a job run",
    ]
    for row in rows:  # figures, not their size: no test depends on the machine's speed
        assert re.fullmatch(
            r"\| sqlite \| 200 \| [\d,]+ \| .+ \| [\d,.]+ ms \| [\d,.]+ ms \|", row
        ), row

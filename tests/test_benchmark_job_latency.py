"""The job-latency benchmark runs end to end against a real server (its table is well formed)."""

from __future__ import annotations

import re

import pytest

from benchmarks import job_latency


def test_the_job_latency_benchmark_prints_a_row_per_job(capsys: pytest.CaptureFixture[str]) -> None:
    job_latency.main(
        ["--reports", "300", "--interval-ms", "20", "--baseline-seconds", "0.5", "--postgres", ""]
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| backend | job | rows handled |") and len(lines) == 9
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert [r[1] for r in rows] == ["none (baseline)", *job_latency.JOBS]
    assert all(len(r) == 9 and r[0] == "sqlite" for r in rows), rows
    work = {r[1]: r[2] for r in rows}
    assert "moved" in work["flush-inbox"] and "folded" in work["aggregate"]
    assert "charges" in work["purge"] and "reports" in work["purge"]
    for r in rows[1:]:  # each job: its run time (a fast checkpoint rounds to 0.00), its writes
        assert float(r[3]) >= 0 and re.fullmatch(r"[\d,]+, longest [\d.]+ ms", r[4]), r
    for r in rows:  # the single reports sent meanwhile, all accepted, and their latency
        assert re.fullmatch(r"[\d,]+", r[5]), r
        assert all(c == "-" or float(c) > 0 for c in r[6:9]), r

"""The tlog step benchmark prints a row per step size, each step's write counted."""

from __future__ import annotations

import pytest

from benchmarks import tlog_steps


def test_the_step_benchmark_prints_a_row_per_step(capsys: pytest.CaptureFixture[str]) -> None:
    tlog_steps.main(["--entries", "1200", "--steps", "1000", "500", "--pause", "0"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| entries a step | writes |") and len(lines) == 4
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert [(r[0], r[1]) for r in rows] == [("1,000", "2"), ("500", "3")]

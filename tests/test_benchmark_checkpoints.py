"""The checkpoints benchmark runs end to end: a row per count, every cell a figure."""

from __future__ import annotations

import pytest

from benchmarks import checkpoints


def test_the_checkpoints_benchmark_prints_a_row_per_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    checkpoints.main(["--entries", "40", "--checkpoints", "4", "40", "--runs", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| backend | checkpoints stored |") and len(lines) == 4
    stored = []
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == "SQLite" and len(cells) == 8
        stored.append(int(cells[1].replace(",", "")))
    assert stored[0] < stored[1]  # both logs signed every 10 entries, then after every entry

"""The verify benchmark runs end to end, with the archive's table (its rows well formed)."""

from __future__ import annotations

import pytest

from benchmarks import verify


def test_the_verify_benchmark_prints_both_tables(capsys: pytest.CaptureFixture[str]) -> None:
    verify.main(["--devices", "300", "--days", "2", "--charges", "100", "--archive"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| backend | devices |") and lines[3] == ""
    assert lines[4].startswith("| backend | audit_log rows before |") and len(lines) == 7
    cells = [c.strip() for c in lines[6].strip("|").split("|")]
    assert cells[0] == "sqlite" and len(cells) == 10
    before, after = (int(c.replace(",", "")) for c in cells[1:3])
    assert after == 1 < before  # everything but the boundary entry moved to the file
    assert float(cells[3]) > float(cells[4]) == float(cells[5]) and float(cells[6]) >= 0

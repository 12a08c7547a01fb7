"""The relay benchmark runs end to end on a tiny batch (its table row is well formed)."""

from __future__ import annotations

import pytest

from benchmarks import relay


def test_the_relay_benchmark_prints_its_table(capsys: pytest.CaptureFixture[str]) -> None:
    relay.main(["--batch", "40", "--warm", "1", "--batches", "2", "--postgres", ""])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| backend | batch |") and len(lines) == 3
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:3] == ["sqlite", "40", "40"]
    assert cells[3].endswith("/s") and cells[4].endswith("/s") and cells[6].endswith("KiB")

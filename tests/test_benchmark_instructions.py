"""The instruction-count benchmark runs end to end under valgrind on a tiny batch."""

from __future__ import annotations

import shutil

import pytest

from benchmarks import instructions

pytestmark = pytest.mark.skipif(
    shutil.which("valgrind") is None, reason="valgrind is not installed (Debian package)"
)


def test_the_instruction_benchmark_prints_its_table(capsys: pytest.CaptureFixture[str]) -> None:
    instructions.main(["--batch", "50", "--batches", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[0].startswith("| path | batch |")
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:3] == ["relay, in-process, SQLite", "50", "50"]
    per_report = int(cells[4].replace(",", ""))
    assert 10_000 < per_report < 10_000_000  # counted, and only the timed batch

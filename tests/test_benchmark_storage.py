"""``python -m benchmarks.storage`` prints a row a zlib level, each sketch read back equal."""

from __future__ import annotations

import pytest

from benchmarks import storage


def test_the_storage_benchmark_prints_a_row_a_level(capsys: pytest.CaptureFixture[str]) -> None:
    storage.main(["--n", "200", "--workload", "safari", "--level", "1", "6"])
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].startswith("| sketch | reports in the day | zlib level |")
    assert rows[2].startswith("| safari HCMS | 200 | 1 (stored) |")
    assert rows[3].startswith("| safari HCMS | 200 | 6 (other) |")


def test_the_storage_benchmark_refuses_a_level_zlib_has_not() -> None:
    with pytest.raises(SystemExit):
        storage.main(["--level", "10"])

"""``python -m benchmarks.shards`` prints its table, the sharded reports and what-ifs checked."""

from __future__ import annotations

import pytest

from benchmarks import shards


def test_the_shards_benchmark_prints_its_rows(capsys: pytest.CaptureFixture[str]) -> None:
    shards.main(["--devices", "400", "--days", "3", "--shards", "2", "--next-day-charges", "20"])
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].startswith("| ledger | devices | charges | report CPU s")
    assert rows[2].startswith("| one database | 400 |")
    assert rows[3].startswith("| 2 shards (") and "| 400 |" in rows[3]
    assert rows[4].startswith("| of which the routing check of every device | ")
    for row, name in zip(rows[5:], ("full pass", "from the summaries"), strict=False):
        assert row.startswith(f"| 2 shards, next day after 20 charges: {name} | 420 |")
    assert rows[7].startswith("| 2 shards, next day after 20 charges: from the summaries, no")
    for row, name in zip(rows[8:], ("what-if, full pass", "what-if from the stored"), strict=False):
        assert row.startswith(f"| 2 shards, next day after 20 charges: {name}")
    assert rows[10].startswith(
        "| 2 shards, next day after 20 charges: what-if from the stored what-ifs, 20 charges"
        " later | 440 |"
    )
    assert len(rows) == 11


def test_the_shards_benchmark_refuses_one_shard() -> None:
    with pytest.raises(SystemExit) as refused:
        shards.main(["--shards", "1"])
    assert refused.value.code == 2

"""The HTTP benchmark runs end to end against a real server (its relay row is well formed)."""

from __future__ import annotations

import os
import sys

import pytest

from benchmarks import http


def test_the_http_benchmark_prints_its_relay_row(capsys: pytest.CaptureFixture[str]) -> None:
    http.main(["--loads", "relay", "--seconds", "1", "--batch-items", "50", "--postgres", ""])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| backend | load |") and len(lines) == 3
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:2] == ["sqlite, 1 worker", "batches of 50, 2 connections"]
    assert cells[2].endswith("/s") and cells[5] == "0" and cells[7] == "yes"
    if sys.platform == "linux":  # the server's CPU from /proc: per report, then the worker's share
        assert cells[6].endswith("%)") and " us (" in cells[6], cells[6]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_server_cpu_counts_a_process_tree() -> None:
    tree = http._process_tree(os.getpid())
    assert tree[0] == os.getpid()
    assert http._cpu_seconds(tree)[os.getpid()] > 0


def test_the_http_benchmark_reports_the_logs_cadence(capsys: pytest.CaptureFixture[str]) -> None:
    load = ["--loads", "relay", "--seconds", "3", "--batch-items", "50", "--postgres", ""]
    http.main([*load, "--checkpoint-seconds", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert "between signed checkpoints" in lines[0] and len(lines) == 3
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert len(cells) == 11 and cells[7] == "yes"
    assert cells[8].endswith(" signed)") and " / " in cells[8], cells[8]  # seconds between
    assert cells[9].endswith(" s"), cells[9]  # the longest stretch with entries unsigned
    assert cells[10].count(" / ") == 2, cells[10]  # lag: median / max / at the end

"""The job-latency benchmark runs end to end against a real server (its table is well formed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from contextlib import suppress

import psutil
import pytest

from benchmarks import job_latency


def test_the_job_latency_benchmark_prints_a_row_per_job(capsys: pytest.CaptureFixture[str]) -> None:
    job_latency.main(
        [
            *("--reports", "300", "--interval-ms", "20", "--baseline-seconds", "0.5"),
            *("--postgres", "", "--control-seconds", "0"),
        ]
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
        # but those the purge (ten years ahead) left dated on a deleted day: refused, counted
        behind = r" \([\d,]+ dated before the purge's horizons\)" if r[1] == "purge" else ""
        assert re.fullmatch(r"[\d,]+" + f"({behind})?", r[5]), r
        assert all(c == "-" or float(c) > 0 for c in r[6:9]), r


def test_chosen_jobs_repeat_after_the_control_row(capsys: pytest.CaptureFixture[str]) -> None:
    """``--jobs`` fills the ledger first, ``--repeat`` runs each again, the control comes first."""
    job_latency.main(
        [
            *("--reports", "200", "--interval-ms", "20", "--baseline-seconds", "0.3"),
            *("--postgres", "", "--control-seconds", "0.5", "--jobs", "verify", "--repeat", "2"),
        ]
    )
    lines = capsys.readouterr().out.splitlines()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    names = [r[1] for r in rows]
    assert names == ["none (baseline)", "busy process (control)", "verify (1)", "verify (2)"]
    assert rows[1][2].startswith("no database work, niceness ") and rows[1][3] == "0.50"
    assert all("entries" in r[2] for r in rows[2:]), rows  # the two fills' entries verified


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--jobs", "vacuum"], "--jobs: unknown vacuum"),
        (["--no-sqlite", "--postgres", ""], "--no-sqlite needs --postgres"),
        (["--control-seconds", "-1"], "--control-seconds must not be negative"),
        (["--jobs", "dashboard,purge", "--repeat", "2"], "--repeat runs only dashboard and verify"),
        (["--served", "--jobs", "purge"], "--served cannot run purge"),
    ],
)
def test_bad_options_are_refused_in_one_line(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        job_latency.main(argv)
    assert stop.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or not {0, 1} <= os.sched_getaffinity(0),
    reason="needs Linux and CPUs 0 and 1",
)
def test_cores_apart_keeps_the_gate_and_the_jobs_on_their_own_cpus() -> None:
    """The server and this process on the gate's CPU; its children and the jobs' on the other.

    A child started after the pinning is pinned by the loop; this process gets its CPUs back.
    """
    sleep = "import time; time.sleep(60)"
    spawn_child = (
        f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {sleep!r}]); {sleep}"
    )
    own = os.sched_getaffinity(0)
    with (
        subprocess.Popen([sys.executable, "-c", spawn_child]) as server,
        subprocess.Popen([sys.executable, "-c", sleep]) as job,
    ):
        children = psutil.Process(server.pid).children  # the server's child, once started
        cores = job_latency.CoresApart(server.pid, None)
        try:
            cores.add(job.pid)
            child = None
            for _ in range(600):  # until the loop has started and pinned the child
                kids = children()
                if kids and os.sched_getaffinity(kids[0].pid) == job_latency.JOB_CPUS:
                    child = kids[0].pid
                    break
                time.sleep(0.1)
            assert child is not None
            assert os.sched_getaffinity(server.pid) == job_latency.GATE_CPUS
            assert os.sched_getaffinity(job.pid) == job_latency.JOB_CPUS
            assert os.sched_getaffinity(0) == job_latency.GATE_CPUS  # the test's main thread
        finally:
            cores.close()
            for proc in children():
                with suppress(psutil.NoSuchProcess):
                    proc.kill()
            server.kill()
            job.kill()
        assert os.sched_getaffinity(0) == own

"""The round-trip benchmark counts a single report's messages and round trips to PostgreSQL."""

from __future__ import annotations

import pytest

from benchmarks import round_trips
from tests.conftest import PG_URL


@pytest.mark.skipif(not PG_URL, reason="DPGOV_TEST_DATABASE_URL is not set")
def test_a_single_report_is_counted_message_by_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert PG_URL is not None
    round_trips.main(["--postgres", PG_URL, "--batch", "5"])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "| path | reports | messages sent | round trips | round trips a report |"
    messages, trips = (int(cell) for cell in lines[2].split("|")[3:5])
    listed = [line for line in lines if line[:1].isdigit()]
    assert messages == len(listed) and "`COMMIT`" in listed[-1]
    assert not any("send_prepare" in line or "DEALLOCATE" in line for line in listed)
    assert trips <= 4  # issue #33's bound, the figure in docs/performance.md
    assert int(lines[3].split("|")[4]) <= trips  # a relay's batch waits no more than one report


def test_a_bad_batch_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        round_trips.main(["--batch", "0"])
    assert "--batch" in capsys.readouterr().err


@pytest.mark.skipif(not PG_URL, reason="DPGOV_TEST_DATABASE_URL is not set")
def test_the_timing_run_goes_through_the_latency_relay(capsys: pytest.CaptureFixture[str]) -> None:
    assert PG_URL is not None
    round_trips.main(["--postgres", PG_URL, "--batch", "1", "--cpu", "3", "--rtt", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3].startswith("| client (compiled psycopg), 1 ms added round trip | reports")
    assert lines[-1].startswith("| single report, one after another | 3 |")


@pytest.mark.parametrize(("option", "value"), [("--cpu", "-1"), ("--rtt", "2000")])
def test_a_bad_timing_option_is_refused(
    capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    with pytest.raises(SystemExit):
        round_trips.main([option, value])
    assert option in capsys.readouterr().err

"""The ``dpgov`` command line: ``--version``, the simulation job and its input errors."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version

import pytest
from typer.testing import CliRunner

from dp_governor.api.cli import app

runner = CliRunner()


def test_emoji_simulation_prints_the_top_ten_beside_the_truth() -> None:
    result = runner.invoke(app, ["simulate", "--devices", "200000", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert "CMS eps=4, k=65536, m=1024" in result.output
    lines = [ln for ln in result.output.splitlines() if re.match(r"^\d+ +\S", ln)]
    assert len(lines) == 10
    assert "😂" in lines[0]  # the most popular emoji is found first
    assert "10/10 of the true top 10 recovered" in result.output
    assert "Each report is 4-LDP" in result.output


def test_safari_and_quicktype_simulations_run() -> None:
    safari = runner.invoke(app, ["simulate", "-u", "safari", "-n", "50000", "--top", "3"])
    assert safari.exit_code == 0, safari.output
    assert "HCMS eps=4, k=1024, m=32768" in safari.output
    quick = runner.invoke(app, ["simulate", "-u", "quicktype", "-n", "200000", "--top", "5"])
    assert quick.exit_code == 0, quick.output
    assert "SFP eps=2+6" in quick.output and "words discovered" in quick.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["simulate", "--devices", "0"], "--devices"),
        (["simulate", "--devices", "many"], "--devices"),
        (["simulate", "--use-case", "health"], "--use-case"),
        (["simulate", "--exponent", "nan"], "--exponent"),
        (["simulate", "--seed", "-1"], "--seed"),
    ],
)
def test_bad_input_exits_non_zero_with_a_message(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code != 0
    assert message in result.output


EMPTY_PATHS = [
    (["audit", "verify", "--full", "--checkpoints", ""], "'--checkpoints'"),
    (["audit", "verify", "--full", "--archive", " "], "'--archive'"),
    (["audit", "archive", "--through", "verified", "-o", ""], "'--out'"),
    (["audit", "checkpoints", "-o", ""], "'--output'"),
    (["audit", "tiles", "--out", ""], "'--out'"),
    (["audit", "export", "-o", ""], "'--out'"),
    (["audit", "recompute", ""], "'FILE'"),
    (["audit", "recompute", "--log", "x", "--save", ""], "'--save'"),
    (["aggregate", "--sketch", ""], "'--sketch'"),
    (["policies", "apply", ""], "'FILE'"),
    (["witness", "key", "--name", "w.example/w", "--key-file", ""], "'--key-file'"),
]


@pytest.mark.parametrize(("args", "option"), EMPTY_PATHS)
def test_an_empty_path_is_refused_as_empty_not_read_as_the_current_folder(
    args: list[str], option: str
) -> None:
    result = runner.invoke(app, args, env={"DPGOV_DATABASE_URL": "nowhere://never-opened"})
    assert result.exit_code == 2
    assert f"Invalid value for {option}" in result.output and "empty path" in result.output


def test_console_entry_point_runs_in_a_real_process() -> None:
    # A small fleet (about 3 s of CPU) and timeouts far beyond it: a busy machine is slow,
    # not wrong.
    proc = subprocess.run(
        [sys.executable, "-m", "dp_governor.api.cli", "simulate", "-n", "2000", "--top", "3"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "rank" in proc.stdout
    # piped: plain progress lines on stderr, the table on stdout
    assert "simulate: privatize and sketch: 2,000 of 2,000 devices (100%)" in proc.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "dp_governor.api.cli", "simulate", "-n", "-5"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert bad.returncode != 0 and "--devices" in bad.stderr


def test_selftest_audits_every_default_randomizer() -> None:
    result = runner.invoke(app, ["selftest", "--defaults", "--samples", "100000", "--seed", "5"])
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.stdout.splitlines() if ln.rstrip().endswith(" ok")]
    assert len(lines) == 7
    # piped: plain progress lines on stderr, a tenth of each policy's reports at a time
    progress = result.stderr.splitlines()
    assert "selftest emoji: 200,000 of 200,000 reports (100%)" in progress
    assert len([ln for ln in progress if ln.startswith("selftest emoji: ")]) <= 11
    bad = runner.invoke(app, ["selftest", "--samples", "5"])
    assert bad.exit_code != 0 and "--samples" in bad.output
    both = runner.invoke(app, ["selftest", "--defaults", "--database-url", "sqlite:///x.db"])
    assert both.exit_code == 2 and "--defaults or --database-url" in both.stderr


def test_version_prints_the_installed_version_and_exits_0() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dp_governor.api.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"dpgov {version('dp-governor')}\n"
    assert proc.stderr == ""

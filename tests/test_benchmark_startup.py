"""The start-up benchmark's commands import only what they need (import sets, not timings)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import startup


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    env = startup.environment(Path(tmp_path_factory.mktemp("startup")))
    init = [sys.executable, "-m", "dp_governor.api.cli", "db", "init"]
    subprocess.run(init, env=env, check=True, capture_output=True, timeout=300)
    return env


@pytest.mark.parametrize("args", startup.COMMANDS, ids=" ".join)
def test_help_and_the_read_commands_import_none_of_the_heavy_packages(
    env: dict[str, str], args: list[str]
) -> None:
    modules = startup.imported(args, env)
    assert startup.heavy(modules) == []
    assert "dp_governor.api.database" not in modules  # a read creates and upgrades nothing
    if args != ["--help"]:
        assert (
            "dp_governor.budget.ledger" in modules
        )  # the command did run (and the check sees imports)
    else:
        assert not any(m == "budget" or m.startswith("budget.") for m in modules)

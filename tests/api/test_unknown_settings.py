"""A ``DPGOV_`` variable that names no setting stops every command and the server, naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dp_governor.api._unknown_settings import NOT_SETTINGS, UnknownSetting, check_environment
from dp_governor.api.app import create_app
from dp_governor.api.cli import app as cli
from dp_governor.api.settings import Settings, setting_names

TYPO = "DPGOV_DATABASE_ULR"
SUGGESTION = "did you mean DPGOV_DATABASE_URL?"

COMMANDS = [
    ["budget", "device-1"],
    ["audit", "verify"],
    ["audit", "report"],
    ["db", "init"],
    ["db", "upgrade"],
    ["db", "current"],
    ["jobs", "run", "aggregate"],
    ["policies", "list"],
    ["selftest", "--defaults"],
    ["simulate", "--use-case", "emoji"],
    ["demo"],
    ["serve"],
]


def _clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without its ``DPGOV_`` variables, keys in ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("DPGOV_")}
    env["DPGOV_SECRETS_DIR"] = str(tmp_path / "keys")
    env.update(extra)
    return env


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a))
def test_every_command_refuses_an_unknown_variable_before_it_runs(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, args, env={TYPO: f"sqlite:///{tmp_path / 'x.sqlite'}"})
    assert result.exit_code == 2, result.output
    assert TYPO in result.output and SUGGESTION in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert list(tmp_path.iterdir()) == []  # no database, no key: nothing ran


def test_a_real_process_says_it_in_one_line_and_creates_nothing(tmp_path: Path) -> None:
    env = _clean_env(tmp_path, **{TYPO: "postgresql+psycopg://dpgov@db.internal/dpgov"})
    done = subprocess.run(
        [sys.executable, "-m", "dp_governor.api.cli", "budget", "device-1"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"Error: unknown setting {TYPO} ({SUGGESTION}): every DPGOV_ variable must be a"
        " setting listed in docs/configuration.md; unset or rename it"
    ]
    assert list(tmp_path.iterdir()) == []  # not the default ledger in the current folder


def test_dpgov_serve_refuses_before_it_listens(tmp_path: Path) -> None:
    env = _clean_env(tmp_path, DPGOV_ADMIN_TOKNE="t" * 40)
    done = subprocess.run(
        [sys.executable, "-m", "dp_governor.api.cli", "serve", "--port", "1"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "DPGOV_ADMIN_TOKNE (did you mean DPGOV_ADMIN_TOKEN?)" in done.stderr
    assert "Traceback" not in done.stderr and "dp-governor on" not in done.stdout


def test_a_server_worker_refuses_it_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("dpgov_flush_secs", "5")  # the prefix in any case, as the settings read it
    with pytest.raises(UnknownSetting, match="did you mean DPGOV_FLUSH_SECONDS"):
        create_app()
    with pytest.raises(UnknownSetting, match="dpgov_flush_secs"):
        Settings()


def test_known_variables_and_the_test_suites_own_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*NOT_SETTINGS, "DPGOV_PORT", "dpgov_host"):
        monkeypatch.setenv(name, "9000" if "PORT" in name else "127.0.0.1")
    monkeypatch.delenv("DPGOV_TEST_DATABASE_URL", raising=False)
    assert Settings().port == 9000


def test_a_name_far_from_every_setting_gets_no_suggestion() -> None:
    with pytest.raises(UnknownSetting) as refused:
        check_environment({"DPGOV_QQQ": "1"}, setting_names())
    assert refused.value.suggestion is None
    assert "did you mean" not in str(refused.value)

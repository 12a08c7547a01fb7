"""``dpgov audit`` and ``dpgov witness``: a database that cannot be used is one line, exit 2.

An empty file, or a ledger whose schema is behind this release, for every command that opens one.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from dp_governor.api.cli import app as cli
from dp_governor.budget.storage.schema import head_revision

# each database command's required arguments besides --database-url ({tmp}: the test's folder)
ARGS: dict[str, list[str]] = {
    "audit verify": [],
    "audit archive": ["--through", "verified", "--out", "{tmp}/archive.gz"],
    "audit checkpoints": ["--output", "{tmp}/checkpoints"],
    "audit tiles": ["--out", "{tmp}/tiles"],
    "audit report": [],
    "audit export": ["--out", "{tmp}/export.jsonl"],
}
# commands that open no database: they read files or other services
NO_DATABASE = {"audit recompute", "witness key", "witness serve", "witness run"}
# the tables the transparency log and what came after it added (migrations 0010 to 0018)
LATER_TABLES = (
    "tlog_leaves",
    "tlog_tiles",
    "tlog_checkpoints",
    "dashboard_snapshots",
    "tlog_cosignatures",
    "audit_verifications",
    "audit_archives",
    "report_summaries",
)


def _commands() -> dict[str, bool]:
    """Each ``audit`` and ``witness`` subcommand, and whether it takes ``--database-url``."""
    found: dict[str, bool] = {}
    root: Any = typer.main.get_command(cli)
    for group in ("audit", "witness"):
        for name, command in root.commands[group].commands.items():
            opts = {o for p in command.params for o in p.opts}
            found[f"{group} {name}"] = "--database-url" in opts
    return found


def test_every_database_command_is_listed() -> None:
    found = _commands()
    assert {c for c, db in found.items() if db} == set(ARGS)
    assert {c for c, db in found.items() if not db} == NO_DATABASE


def _run(command: str, url: str, tmp: Path) -> tuple[int, str]:
    args = [*command.split(), *(a.format(tmp=tmp) for a in ARGS[command])]
    env = {"DPGOV_DATABASE_URL": url, "DPGOV_SECRETS_DIR": str(tmp / "keys")}
    result = CliRunner().invoke(cli, [*args, "--database-url", url], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output.strip()


@pytest.fixture(scope="module")
def old_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ledger as revision 0009 left it: before the transparency log."""
    tmp = tmp_path_factory.mktemp("old")
    path = tmp / "old.sqlite"
    made = CliRunner().invoke(
        cli,
        ["db", "init"],
        env={"DPGOV_DATABASE_URL": f"sqlite:///{path}", "DPGOV_SECRETS_DIR": str(tmp / "keys")},
    )
    assert made.exit_code == 0, made.output
    with sqlite3.connect(path) as conn:
        for table in LATER_TABLES:
            conn.execute(f"DROP TABLE {table}")
        conn.execute("UPDATE alembic_version SET version_num = '0009'")
    conn.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the copies below take the file alone
    conn.close()
    return path


@pytest.mark.parametrize("command", sorted(ARGS))
def test_an_empty_sqlite_file_is_one_line_and_exit_2(tmp_path: Path, command: str) -> None:
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    code, output = _run(command, f"sqlite:///{empty}", tmp_path)
    assert code == 2, output
    assert len(output.splitlines()) == 1 and "Traceback" not in output
    assert "not initialised by dp-governor" in output
    with sqlite3.connect(empty) as conn:  # nothing created
        assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)


# `audit archive` writes: like `jobs run`, it upgrades an old SQLite ledger (PostgreSQL refuses)
READS = sorted(set(ARGS) - {"audit archive"})


@pytest.mark.parametrize("command", READS)
def test_a_ledger_behind_this_release_is_one_line_and_exit_2(
    tmp_path: Path, old_ledger: Path, command: str
) -> None:
    copy = tmp_path / "old.sqlite"
    copy.write_bytes(old_ledger.read_bytes())
    (tmp_path / "keys").symlink_to(old_ledger.parent / "keys")
    code, output = _run(command, f"sqlite:///{copy}", tmp_path)
    assert code == 2, output
    assert len(output.splitlines()) == 1 and "Traceback" not in output
    assert f"at revision 0009; this release needs revision {head_revision()}" in output
    assert "dpgov db upgrade" in output
    with sqlite3.connect(copy) as conn:  # nothing upgraded
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone() == ("0009",)

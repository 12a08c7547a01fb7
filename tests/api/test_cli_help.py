"""Every command's ``--help`` reads as plain text: no reStructuredText, no Python types.

The walk finds every command of the tree (a command added later is checked too): its help has
no double backticks or Sphinx roles, no ``<type>`` labels and no box drawing; every option
reads ``--flag``, ``--flag / --no-flag`` or ``--option METAVAR`` with a metavar in capitals
(or a choice's ``[a|b]``, a date's ``YYYY-MM-DD``).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from dp_governor.api.cli import app as cli
from dp_governor.api.cli._help import plain_text

_METAVAR = r"(?:[A-Z][A-Z_]*|\[[a-z0-9|-]+\]|YYYY-MM-DD)"
_OPTION = re.compile(
    rf"^  (?:-[a-zA-Z], )?--[a-z][a-z0-9-]*(?: / --no-[a-z0-9-]+| {_METAVAR})?(?:  |$)"
)
_ARGUMENT = re.compile(r"^  [A-Z][A-Z_]*(?:  |$)")
_MARKUP = re.compile(r"``|:[a-z]+:`|<[a-zA-Z%][^>]*>|[─│╭╮╰╯]")


def _commands(command: Any, path: list[str]) -> list[list[str]]:
    found = [path]
    for name, sub in getattr(command, "commands", {}).items():
        found += _commands(sub, [*path, name])
    return found


COMMANDS = _commands(typer.main.get_command(cli), [])


def _section(text: str, title: str) -> list[str]:
    """The lines of a help section that start an entry (its continuation lines indent more)."""
    lines = (
        text.split(f"\n{title}:\n", 1)[1].split("\n\n", 1)[0].splitlines() if title in text else []
    )
    return [line for line in lines if not line.startswith("   ")]


def test_the_walk_finds_every_command() -> None:
    names = {" ".join(p) for p in COMMANDS}
    assert {"", "audit verify", "audit tiles", "witness run", "db init", "serve"} <= names
    assert len(names) >= 30


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "dpgov")
def test_every_help_is_plain_text(path: list[str]) -> None:
    done = CliRunner().invoke(cli, [*path, "--help"], env={"COLUMNS": "100"})
    assert done.exit_code == 0, done.output
    text = done.stdout
    assert text.startswith("Usage: dpgov"), text
    bad = _MARKUP.findall(text)
    assert not bad, f"`dpgov {' '.join(path)} --help` shows {bad}:\n{text}"
    options = _section(text, "Options")
    assert any(line.startswith("  --help") for line in options), text
    odd = [line for line in options if not _OPTION.match(line)]
    assert not odd, f"`dpgov {' '.join(path)} --help`: options shown oddly: {odd}"
    arguments = [line for line in _section(text, "Arguments") if not _ARGUMENT.match(line)]
    assert not arguments, f"`dpgov {' '.join(path)} --help`: arguments shown oddly: {arguments}"


def test_a_command_list_shows_each_commands_first_line_whole() -> None:
    listed = CliRunner().invoke(cli, ["--help"]).stdout.split("\nCommands:\n", 1)[1]
    text = " ".join(listed.split())
    assert "Simulate a fleet privatizing with the real mechanism; print the top estimates" in text
    assert "..." not in text


def test_help_keeps_square_brackets_rich_markup_would_eat() -> None:
    done = CliRunner().invoke(cli, ["aggregate", "--help"], env={"COLUMNS": "200"})
    assert "pip install 'dp-governor[scale]'" in done.stdout, done.stdout


def test_a_flag_reads_as_a_switch_and_an_option_names_what_it_takes() -> None:
    text = CliRunner().invoke(cli, ["audit", "verify", "--help"]).stdout
    assert re.search(r"^  --full  ", text, re.M) and re.search(r"^  -q, --quiet  ", text, re.M)
    assert re.search(r"^  --archive PATH  ", text, re.M)
    assert re.search(r"^  --database-url URL  ", text, re.M)
    assert "--full replays everything" in " ".join(text.split())
    assert "--export / --no-export" in CliRunner().invoke(cli, ["aggregate", "--help"]).stdout


@pytest.mark.parametrize(
    ("rst", "plain"),
    [
        ("``--full``", "--full"),
        ("``dpgov audit archive``", "`dpgov audit archive`"),
        (":func:`~dp_governor.budget.reporting.views.what_if`", "`what_if`"),
        (":mod:`.serve`", "`serve`"),
        (
            ":meth:`dp_governor.budget.ledger.Ledger.loosenings`",
            "`dp_governor.budget.ledger.Ledger.loosenings`",
        ),
        ("`one` stays, [scale] too", "`one` stays, [scale] too"),
    ],
)
def test_plain_text_of_restructuredtext(rst: str, plain: str) -> None:
    assert plain_text(rst) == plain


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["aggregate", "emoji", "--from", "yesterday"],
            "Invalid value for '--from': 'yesterday' does not match the formats '%Y-%m-%d'.",
        ),
        (["audit", "export", "--out", ""], "Invalid value for '--out' / '-o': empty path"),
    ],
)
def test_a_refused_value_reads_without_pydantics_prefix(args: list[str], said: str) -> None:
    """Typer's validation says ``Value error, `` before the reason; the CLI does not."""
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and said in result.output, result.output
    assert "Value error" not in result.output

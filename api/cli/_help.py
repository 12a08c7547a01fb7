"""Every command's ``--help`` as plain terminal text, converted once from the docstrings.

The commands' docstrings are written for the code's readers (reStructuredText: ````x````,
``:func:`x```); a terminal shows them as words. :class:`PlainHelpGroup` is the root command's
class: when the command tree is built, it converts every command's help and every option's help
(:func:`plain_text`), gives every option that takes a value a metavar in capitals
(:func:`metavar`) and switches off rich markup (which would hide ``[scale]``-like text and
show each option's Python type). A flag then reads ``--full`` or ``--export / --no-export``.
Its refusals of a value read as the CLI's own (no ``Value error, `` prefix).
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import PurePath
from typing import Any, get_args, get_origin

import typer
from typer.core import TyperGroup

__all__ = ["PlainHelpGroup", "metavar", "plain_text"]

_LITERAL = re.compile(r"``(.+?)``")
_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_NAMES: dict[object, str] = {int: "N", float: "NUMBER"}
_PYDANTIC_PREFIX = "Value error, "  # how pydantic reports a ValueError its validator raised


def _literal(match: re.Match[str]) -> str:
    """An option stays bare (``--full``: --full); other code is quoted once: `x`."""
    code = match[1]
    return code if code.startswith("-") else f"`{code}`"


def _role(match: re.Match[str]) -> str:
    """A cross-reference names its target's last part: :func:`~a.b.c` is `c`."""
    target = match[1]
    return f"`{target.rsplit('.', 1)[-1] if match[0].count('~') else target.lstrip('.')}`"


def plain_text(text: str) -> str:
    """Help text without reStructuredText markup: literals and roles become `quoted` words.

    >>> plain_text("``--full`` replays ``dpgov audit verify``, see :func:`~a.b.verify`")
    '--full replays `dpgov audit verify`, see `verify`'
    """
    return _LITERAL.sub(_literal, _ROLE.sub(_role, text))


def metavar(param: Any) -> str:
    """What an option takes, in capitals: ``PATH`` (``FILE``, ``DIR``), ``N``, ``NUMBER``, ``TEXT``.

    A choice lists its values (``[text|json]``), a date its format (``YYYY-MM-DD``); read from
    the option's annotated type (a list's: its element's, as the option is repeated).
    """
    described = getattr(param, "type_descriptor", None)
    if described is None:  # a Typer whose options carry click's type instead
        return _click_metavar(param.type)
    kind = described.annotation
    if get_origin(kind) is list:
        (kind,) = get_args(kind)
    if described.choices is not None:
        return "[" + "|".join(str(getattr(c, "value", c)) for c in described.choices) + "]"
    if kind is datetime:
        formats = described.parameter_info.formats or ["%Y-%m-%d"]
        return "|".join(
            f.replace("%Y", "YYYY").replace("%m", "MM").replace("%d", "DD") for f in formats
        )
    if isinstance(kind, type) and issubclass(kind, PurePath):
        info = described.parameter_info
        return "PATH" if info.dir_okay == info.file_okay else ("DIR" if info.dir_okay else "FILE")
    return _NAMES.get(kind, "TEXT")


_CLICK_NAMES = {"integer": "N", "integer range": "N", "float": "NUMBER", "float range": "NUMBER"}


def _click_metavar(kind: Any) -> str:
    """:func:`metavar` from a click parameter type (its ``name`` and attributes).

    >>> from types import SimpleNamespace as Type
    >>> _click_metavar(Type(name="path", dir_okay=True, file_okay=False))
    'DIR'
    >>> _click_metavar(Type(name="choice", choices=["a", "b"])), _click_metavar(Type(name="float"))
    ('[a|b]', 'NUMBER')
    """
    name = str(getattr(kind, "name", "")).lower()
    if name == "path":
        dirs, files = bool(kind.dir_okay), bool(kind.file_okay)
        return "PATH" if dirs == files else ("DIR" if dirs else "FILE")
    if name == "choice":
        return "[" + "|".join(str(c) for c in kind.choices) + "]"
    return _CLICK_NAMES.get(name, "TEXT")


def _no_type(ctx: object) -> None:
    """An argument's type in its help line: none (its name says what it takes)."""


def _convert(command: Any) -> None:
    """Convert one command's help and its options', then those of its subcommands."""
    command.rich_markup_mode = None
    for attribute in ("help", "short_help", "epilog"):
        value = getattr(command, attribute, None)
        if isinstance(value, str):
            setattr(command, attribute, plain_text(value))
    if not command.short_help and command.help:  # its line in a list: the first one, whole
        command.short_help = " ".join(command.help.split("\n\n", 1)[0].split())
    for param in command.params:
        if isinstance(getattr(param, "help", None), str):
            param.help = plain_text(param.help)
        if param.metavar is not None:
            continue
        if param.param_type_name == "argument":  # named, as the usage line names it
            param.metavar = str(param.name).upper()
            # its line in the list shows the name alone (Typer would add its Python type)
            setattr(param, "display_type_rich", _no_type)  # noqa: B010
        elif not param.is_flag:
            param.metavar = metavar(param)
    for sub in getattr(command, "commands", {}).values():
        _convert(sub)


class PlainHelpGroup(TyperGroup):
    """The root command: its tree's help converted to plain text when the tree is built.

    A value its parser refuses is said in the command line's words, without the ``Value
    error, `` that Typer's validation puts before the reason (:meth:`invoke`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["rich_markup_mode"] = None
        super().__init__(*args, **kwargs)
        _convert(self)

    def invoke(self, ctx: Any) -> Any:  # Typer's vendored click Context, not exported
        """Run the command; a refused value's message loses pydantic's ``Value error, ``."""
        try:
            return super().invoke(ctx)
        except typer.BadParameter as exc:
            exc.message = exc.message.removeprefix(_PYDANTIC_PREFIX)
            raise

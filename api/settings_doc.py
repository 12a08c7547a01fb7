"""Render ``docs/configuration.md`` from the settings model, so the page cannot drift.

``python -m dp_governor.api.settings_doc`` prints the page; ``python -m dp_governor.api.settings_doc
--write`` writes it to ``docs/configuration.md``. ``tests/test_docs.py`` checks the committed page
equals it.
"""

from __future__ import annotations

import json
import sys
import types
import typing
from pathlib import Path

from pydantic.fields import FieldInfo

from dp_governor.api.settings import Settings

__all__ = ["DOC_PATH", "REGENERATE", "render_configuration"]

DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
REGENERATE = "python -m dp_governor.api.settings_doc --write"

_HEADER = f"""\
# Configuration

<!-- Generated from api/settings.py by `{REGENERATE}`: do not edit by hand. -->

The service reads these settings from the environment when it starts (`dpgov serve`, and every
command that opens the database). Each is the upper-case field name of
`dp_governor.api.settings.Settings` with the prefix `DPGOV_`; an unknown `DPGOV_` variable is an
error. Keys and their files are described in [operations.md](operations.md), the HTTP limits in
its "Timeouts and limits".

| variable | type | default | description |
|---|---|---|---|
"""


def _type_name(annotation: object) -> str:
    """A short, stable name for a field's type (``int``, ``path or unset``, ``one of a, b``)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{value}`" for value in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        inner = " or ".join(_type_name(a) for a in args)
        return f"{inner} (optional)" if len(args) < len(typing.get_args(annotation)) else inner
    if origin is list:
        (item,) = typing.get_args(annotation)
        if typing.get_origin(item) is typing.Literal:  # a list of names: each one of them
            return "JSON list, each one of " + ", ".join(
                f"`{value}`" for value in typing.get_args(item)
            )
        return "JSON list of " + _type_name(item) + "s"
    names = {"SecretStr": "secret string", "Path": "path", "str": "string"}
    name = getattr(annotation, "__name__", str(annotation))
    return names.get(name, name)


def _bounds(field: FieldInfo) -> str:
    words = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    parts = [
        f"{symbol} {getattr(item, key):,}"
        for item in field.metadata
        for key, symbol in words.items()
        if getattr(item, key, None) is not None
    ] + [
        f"at least {item.min_length:,} item{'s' * (item.min_length != 1)}"
        for item in field.metadata
        if getattr(item, "min_length", None) is not None
    ]
    return f" ({', '.join(parts)})" if parts else ""


def _default(field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, list):  # as the variable takes it: JSON
        return f"`{json.dumps(value)}`"
    return f"`{value}`"


def render_configuration() -> str:
    """The whole of ``docs/configuration.md``."""
    rows = []
    for name, field in Settings.model_fields.items():
        description = (field.description or "").replace("|", "\\|").replace("\n", " ")
        rows.append(
            f"| `DPGOV_{name.upper()}` | {_type_name(field.annotation)}{_bounds(field)}"
            f" | {_default(field)} | {description} |"
        )
    return _HEADER + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = render_configuration()
    if args == ["--write"]:
        DOC_PATH.write_text(text, encoding="utf-8")
        sys.stdout.write(f"wrote {DOC_PATH}\n")
        return 0
    if args:
        sys.stderr.write(f"usage: python -m dp_governor.api.settings_doc [--write]\n{__doc__}")
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

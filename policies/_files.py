"""Policies as YAML or TOML files (``policies: [...]``), complete and validated by the model.

A file may also hold a ``device_budget`` table
(:class:`dp_governor.policies.device.DeviceBudgetCreate`): the device-wide budget every use case
draws from, with per-use-case ``quotas``.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomli_w
import yaml
from pydantic import ValidationError

from dp_governor.policies.device import DeviceBudgetCreate
from dp_governor.policies.errors import UNKNOWN_KEY, error_message
from dp_governor.policies.model import PolicyBase, PolicyCreate

__all__ = ["PolicyFileError", "dump_policies", "load_device_budget", "load_policies"]


class PolicyFileError(ValueError):
    """A policy file that cannot be read or does not validate: one line naming the file.

    The message starts with the file's path, then ``:line:column`` where the file does not
    parse, as compilers and linters say it.
    """


_TOML_AT = re.compile(  # tomllib's own words: "Invalid value (at line 3, column 5)"
    r"^(?P<reason>.*) \(at (?:line (?P<line>\d+), column (?P<column>\d+)|end of document)\)$"
)
_KINDS = {dict: "a table", list: "a list", str: "a string", bool: "a boolean", int: "a number"}


def _kind(value: object) -> str:
    """What a parsed YAML or TOML value is, in the file's words.

    >>> _kind(None), _kind([]), _kind(1.5)
    ('null', 'a list', 'a number')
    """
    if value is None:
        return "null"
    return _KINDS.get(type(value), "a number" if isinstance(value, float) else type(value).__name__)


def _line_column(text: str, position: int) -> tuple[int, int]:
    r"""The 1-based line and column of character ``position`` of ``text``.

    >>> _line_column("a: 1\nb: [", 9)
    (2, 5)
    """
    before = text[:position]
    return before.count("\n") + 1, position - (before.rfind("\n") + 1) + 1


def _syntax_error(path: Path, fmt: str, text: str, exc: Exception) -> PolicyFileError:
    """The parser's short reason, at ``path:line:column`` when the parser says where."""
    at: tuple[int, int] | None = None
    reason = str(exc)
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        at = (exc.problem_mark.line + 1, exc.problem_mark.column + 1)
        reason = exc.problem or reason
    elif isinstance(exc, yaml.reader.ReaderError):
        at = _line_column(text, exc.position)
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        reason = f"unacceptable character #x{code:04x}: {exc.reason}"
    elif isinstance(exc, tomllib.TOMLDecodeError) and (found := _TOML_AT.match(reason)):
        reason = found["reason"]
        end = (found["line"], found["column"])
        at = _line_column(text, len(text)) if end[0] is None else (int(end[0]), int(end[1]))
    elif not isinstance(exc, yaml.YAMLError | tomllib.TOMLDecodeError):  # Python's own refusal
        reason = reason.partition(";")[0]  # of a huge integer, less its advice to programmers
    where = "" if at is None else f":{at[0]}:{at[1]}"
    return PolicyFileError(f"{path}{where}: not valid {fmt.upper()}: {' '.join(reason.split())}")


def _parse(path: Path, text: str, fmt: str) -> Any:
    try:
        if fmt == "toml":
            return tomllib.loads(text)
        return yaml.safe_load(text)
    except RecursionError:
        raise PolicyFileError(f"{path}: not valid {fmt.upper()}: nested too deeply") from None
    except (tomllib.TOMLDecodeError, yaml.YAMLError, ValueError) as exc:  # ValueError: e.g.
        raise _syntax_error(path, fmt, text, exc) from None  # an integer of 4,300+ digits


def _format_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".toml":
        return "toml"
    if suffix in (".yaml", ".yml"):
        return "yaml"
    raise PolicyFileError(f"{path}: a policy file's name must end in .yaml, .yml or .toml")


# Fields that may be empty (``null`` in YAML; listed under ``unset`` in TOML, which has no null).
NULLABLE = tuple(
    name for name, f in PolicyBase.model_fields.items() if not f.is_required() and f.default is None
)
SFP_ONLY = ("k_fragment", "m_fragment", "epsilon_word", "epsilon_fragment")


def _read(path: Path) -> Any:
    fmt = _format_of(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyFileError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise PolicyFileError(
            f"{path}: cannot read: not UTF-8 text (byte {exc.start}: {exc.reason})"
        ) from None
    return _parse(path, text, fmt)


def _unknown_keys_hint(problems: Sequence[str], what: str, fields: Sequence[str]) -> str:
    """The allowed keys, said once after the problems when one of them is an unknown key."""
    if not any(x.endswith(f": {UNKNOWN_KEY}") for x in problems):
        return ""
    return f" ({what}: {', '.join(fields)})"


def load_device_budget(path: str | Path) -> DeviceBudgetCreate | None:
    """The file's ``device_budget`` table, validated (``None``: the file has none).

    Every limit left out is empty: a file states the whole device-wide budget.
    """
    path = Path(path)
    data = _read(path)
    if not isinstance(data, dict) or "device_budget" not in data:
        return None
    found = data["device_budget"]
    if not isinstance(found, dict):
        raise PolicyFileError(
            f"{path}: `device_budget` must be a table of fields, got {_kind(found)}"
        )
    try:
        return DeviceBudgetCreate.model_validate(found)
    except ValidationError as exc:
        problems = [
            f"device_budget `{'.'.join(str(x) for x in e['loc']) or 'device_budget'}`:"
            f" {error_message(e)}"
            for e in exc.errors()
        ]
        fields = list(DeviceBudgetCreate.model_fields)
        hint = _unknown_keys_hint(problems, "the fields of `device_budget`", fields)
        raise PolicyFileError(f"{path}: {'; '.join(problems)}{hint}") from None


def load_policies(path: str | Path) -> list[PolicyCreate]:
    """Read and validate every policy of a file, each complete; list every problem at once.

    A policy must give every field (the SFP-only ones only for SFP): an omitted field would
    otherwise take its default and silently undo what the stored policy says (a cap dropped,
    retention cut to 90 days). Empty fields are ``null`` in YAML and listed in ``unset`` in TOML.
    """
    path = Path(path)
    data = _read(path)
    if (
        not isinstance(data, dict)
        or set(data) - {"device_budget"} != {"policies"}
        or not isinstance(data["policies"], list)
    ):
        raise PolicyFileError(
            f"{path}: the file must hold exactly one key, `policies`, with a list (and may hold"
            f" `device_budget`); {_holds(data)}"
        )
    out: list[PolicyCreate] = []
    problems: list[str] = []
    names: set[str] = set()
    for i, item in enumerate(data["policies"]):
        name = item.get("name") if isinstance(item, dict) else None
        if isinstance(name, str):
            if name in names:
                problems.append(f"policies[{i}] `name`: {name!r} appears twice")
            names.add(name)
        before = len(problems)
        found = _complete(item, f"policies[{i}]", problems)
        if found is None:
            continue
        complete = len(problems) == before
        try:
            policy = PolicyCreate.model_validate(found)
        except ValidationError as exc:
            for error in exc.errors():
                # missing: reported above, by name; a cross-field rule waits for every field
                if error["type"] != "missing" and (complete or error["loc"]):
                    where = ".".join(str(x) for x in error["loc"]) or "policy"
                    problems.append(f"policies[{i}] `{where}`: {error_message(error)}")
            continue
        if complete:
            out.append(policy)
    if problems:
        hint = _unknown_keys_hint(problems, "a policy's fields", list(PolicyBase.model_fields))
        if any(": missing" in x for x in problems):
            hint += (
                " (a policy file gives every field of each policy: write null for an empty one,"
                " or in TOML list it in `unset`)"
            )
        raise PolicyFileError(f"{path}: {'; '.join(problems)}{hint}")
    return out


def _holds(data: object) -> str:
    """What a file that is not ``policies: [...]`` holds instead, in a few words.

    >>> _holds({"rules": [], "device_budget": {}}), _holds({"policies": None}), _holds(None)
    ('it holds `rules`', '`policies` is null', 'it is empty')
    """
    if data is None:
        return "it is empty"
    if not isinstance(data, dict):
        return f"it holds {_kind(data)}"
    others = sorted(str(k) for k in set(data) - {"policies", "device_budget"})
    if others:
        return f"it holds {', '.join(f'`{k}`' for k in others)}"
    if "policies" not in data:
        return "it holds no `policies`"
    return f"`policies` is {_kind(data['policies'])}"


def _complete(item: Any, where: str, problems: list[str]) -> dict[str, Any] | None:
    """The item's fields with ``unset`` ones as ``None``; appends what is missing or wrong.

    The fields given are returned even when some are missing, so that their values are
    checked too: a file is refused once, naming every problem (``None``: not a table).
    """
    if not isinstance(item, dict):
        problems.append(f"{where}: must be a table of fields, got {_kind(item)}")
        return None
    fields = dict(item)
    unset = fields.pop("unset", [])
    if not isinstance(unset, list) or not all(isinstance(x, str) for x in unset):
        problems.append(f"{where} `unset`: must be a list of field names")
        unset = []
    for name in unset:
        if name not in NULLABLE:
            problems.append(f"{where} `unset`: {name!r} cannot be empty; it takes a value")
        elif name in fields:
            problems.append(f"{where} `{name}`: both given and listed in `unset`")
        else:
            fields[name] = None
    not_needed = SFP_ONLY if fields.get("mechanism") != "sfp" else ()
    for name in PolicyBase.model_fields:
        if name not in fields and name not in not_needed:
            problems.append(f"{where} `{name}`: missing")
    return fields


def dump_policies(policies: Sequence[PolicyBase], fmt: str = "yaml") -> str:
    """Serialise policies completely, as :func:`load_policies` reads them back.

    YAML writes empty fields as ``null``; TOML, which has no null, lists them in ``unset``.
    The SFP-only fields are left out of other mechanisms' policies.
    """
    items: list[dict[str, Any]] = []
    for p in policies:
        values = p.model_dump(include=set(PolicyBase.model_fields))
        item = {
            k: values[k]
            for k in PolicyBase.model_fields
            if not (k in SFP_ONLY and p.mechanism != "sfp")
        }
        if fmt == "toml":
            empty = [k for k, v in item.items() if v is None]
            item = {k: v for k, v in item.items() if v is not None}
            if empty:
                item["unset"] = empty
        items.append(item)
    if fmt == "toml":
        return tomli_w.dumps({"policies": items})
    if fmt == "yaml":
        return yaml.safe_dump({"policies": items}, sort_keys=False, allow_unicode=True)
    raise PolicyFileError(f"`format` must be yaml or toml, got {fmt!r}")

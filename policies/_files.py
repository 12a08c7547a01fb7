"""Policies as YAML or TOML files (``policies: [...]``), complete and validated by the model.

A file may also hold a ``device_budget`` table
(:class:`dp_governor.policies.device.DeviceBudgetCreate`): the device-wide budget every use case
draws from, with per-use-case ``quotas``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomli_w
import yaml
from pydantic import ValidationError

from dp_governor.policies.device import DeviceBudgetCreate
from dp_governor.policies.errors import error_message
from dp_governor.policies.model import PolicyBase, PolicyCreate

__all__ = ["PolicyFileError", "dump_policies", "load_device_budget", "load_policies"]


class PolicyFileError(ValueError):
    """A policy file that cannot be read or does not validate; the message says where."""


def _parse(text: str, fmt: str) -> Any:
    try:
        if fmt == "toml":
            return tomllib.loads(text)
        return yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise PolicyFileError(f"not valid {fmt.upper()}: {exc}") from None
    except RecursionError:
        raise PolicyFileError(f"not valid {fmt.upper()}: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise PolicyFileError(f"not valid {fmt.upper()}: {exc}") from None


def _format_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".toml":
        return "toml"
    if suffix in (".yaml", ".yml"):
        return "yaml"
    raise PolicyFileError(f"policy files must end in .yaml, .yml or .toml, got {path.name!r}")


# Fields that may be empty (``null`` in YAML; listed under ``unset`` in TOML, which has no null).
NULLABLE = tuple(
    name for name, f in PolicyBase.model_fields.items() if not f.is_required() and f.default is None
)
SFP_ONLY = ("k_fragment", "m_fragment", "epsilon_word", "epsilon_fragment")


def _read(path: str | Path) -> Any:
    p = Path(path)
    fmt = _format_of(p)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyFileError(f"cannot read {p}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise PolicyFileError(
            f"cannot read {p}: not UTF-8 text (byte {exc.start}: {exc.reason})"
        ) from None
    return _parse(text, fmt)


def load_device_budget(path: str | Path) -> DeviceBudgetCreate | None:
    """The file's ``device_budget`` table, validated (``None``: the file has none).

    Every limit left out is empty: a file states the whole device-wide budget.
    """
    data = _read(path)
    if not isinstance(data, dict) or "device_budget" not in data:
        return None
    found = data["device_budget"]
    if not isinstance(found, dict):
        raise PolicyFileError("`device_budget` must be a table of fields")
    try:
        return DeviceBudgetCreate.model_validate(found)
    except ValidationError as exc:
        problems = [
            f"device_budget `{'.'.join(str(x) for x in e['loc']) or 'device_budget'}`:"
            f" {error_message(e)}"
            for e in exc.errors()
        ]
        raise PolicyFileError("; ".join(problems)) from None


def load_policies(path: str | Path) -> list[PolicyCreate]:
    """Read and validate every policy of a file, each complete; list every problem at once.

    A policy must give every field (the SFP-only ones only for SFP): an omitted field would
    otherwise take its default and silently undo what the stored policy says (a cap dropped,
    retention cut to 90 days). Empty fields are ``null`` in YAML and listed in ``unset`` in TOML.
    """
    data = _read(path)
    if (
        not isinstance(data, dict)
        or set(data) - {"device_budget"} != {"policies"}
        or not isinstance(data["policies"], list)
    ):
        raise PolicyFileError(
            "the file must hold exactly one key, `policies`, with a list (and may hold"
            " `device_budget`)"
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
        hint = ""
        if any(": missing" in x for x in problems):
            hint = (
                " (a policy file gives every field of each policy: write null for an empty one,"
                " or in TOML list it in `unset`)"
            )
        raise PolicyFileError("; ".join(problems) + hint)
    return out


def _complete(item: Any, where: str, problems: list[str]) -> dict[str, Any] | None:
    """The item's fields with ``unset`` ones as ``None``; appends what is missing or wrong.

    The fields given are returned even when some are missing, so that their values are
    checked too: a file is refused once, naming every problem (``None``: not a table).
    """
    if not isinstance(item, dict):
        problems.append(f"{where}: must be a table of fields, got {type(item).__name__}")
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

"""Name what a misbuilt device got wrong, from the ``family`` it sent.

A family identifier is a hash of every parameter that decides how a report is built and decoded
(:func:`dp_governor.mechanisms.family_id`), so the service cannot read parameters back from it. It
can recognise the randomizer of any policy version it ever published (a device built from an older
version, or from another use case) and name each parameter that differs from the current one;
an identifier it never published is named as such, with the parameters to check.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from dp_governor.mechanisms import Mechanism
from dp_governor.mechanisms.published import family_id, family_text

__all__ = ["differences", "mismatch_reason"]


def _flat(mech: Mechanism) -> dict[str, Any]:
    """The identifier's parameters, the hash family's as ``hash_family.<field>``."""
    data: dict[str, Any] = json.loads(family_text(mech))
    family = data.pop("hash_family")
    return data | {f"hash_family.{k}": v for k, v in family.items()}


def differences(expected: Mechanism, found: Mechanism) -> list[str]:
    """Each parameter whose value differs, as ``name expected here, found there``.

    >>> from dp_governor.mechanisms import CMS
    >>> differences(CMS(4.0, 16, 32), CMS(1.0, 16, 64))
    ['epsilon 4.0 (the report: 1.0)', 'm 32 (the report: 64)']
    """
    mine, theirs = _flat(expected), _flat(found)
    return [
        f"{name} {_shown(mine.get(name))} (the report: {_shown(theirs.get(name))})"
        for name in sorted(mine.keys() | theirs.keys())
        if mine.get(name) != theirs.get(name)
    ]


def _shown(value: object) -> str:
    return "absent" if value is None else str(value)


def mismatch_reason(
    sent: object, use_case: str, current: Mechanism, published: Iterable[tuple[str, int, Mechanism]]
) -> str:
    """Why a report's ``family`` is refused: what differs from ``use_case``'s current randomizer.

    ``published`` holds ``(use case, version, mechanism)`` of every policy version; a sent
    identifier found among them names that version and each parameter that differs.
    """
    head = f"is {sent!r}, but {use_case!r} decodes reports of family {family_id(current)!r}"
    for name, version, mech in published:
        if isinstance(sent, str) and family_id(mech) == sent:
            where = "an earlier version" if name == use_case else f"use case {name!r}"
            changed = "; ".join(differences(current, mech)) or "nothing"
            return (
                f"{head}: the report was built from {where} (version {version} of {name!r}),"
                f" which differs in {changed}; build the randomizer from"
                f" GET /v1/use-cases/{use_case}"
            )
    return (
        f"{head}, and no randomizer this service published has that family: the device was"
        f" built with other parameters or another algorithm (compare the mechanism, epsilon,"
        f" k, m, hash family algorithm and seed with `randomizer` in"
        f" GET /v1/use-cases/{use_case}; the family identifier is computed from the parameters"
        f" the device uses, never copied)"
    )

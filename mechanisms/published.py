"""What a device needs to build the server's randomizer, as JSON, and the way back.

:func:`describe` turns a mechanism into its published description: the mechanism, its
parameters, the hash family (algorithm and seed), the family identifier and the JSON schema of
one report body. :func:`from_published` builds the identical mechanism from that description (or
from a whole published policy that holds it under ``"randomizer"``), and checks the identifier,
so a device that mis-copies a parameter or implements another algorithm fails at once instead of
sending reports the server would fold under another family.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from dp_governor.mechanisms._base import FAMILY_FIELD
from dp_governor.mechanisms.cms import CMS
from dp_governor.mechanisms.hashing import HashFamily
from dp_governor.mechanisms.hcms import HCMS
from dp_governor.mechanisms.interface import Mechanism
from dp_governor.mechanisms.sfp import SFP

__all__ = [
    "FAMILY_FIELD",
    "MECHANISMS",
    "build",
    "describe",
    "family_id",
    "family_text",
    "from_published",
    "report_schema",
]


def family_text(mech: Mechanism) -> str:
    r"""The canonical JSON that :func:`family_id` hashes (docs/device.md).

    Keys sorted, no spaces, non-ASCII escaped, floats as Python's ``repr``, and the seed in hex
    without leading zeros, as it was first published.

    >>> print(family_text(CMS(4.0, 16, 32, HashFamily(0xAB))).replace(",", ",\n"))
    {"epsilon":4.0,
    "hash_family":{"algorithm":"blake2b-poly31-v1",
    "seed":"ab"},
    "k":16,
    "m":32,
    "mechanism":"cms"}
    """
    return mech.fingerprint.text


def family_id(mech: Mechanism) -> str:
    """A short identifier of the mechanism, its parameters and its hash family.

    ``"f1-"`` and the first 16 hex digits of SHA-256 over :func:`family_text`: equal for equal
    randomizers, different (but for a 2**-64 chance) for any other.
    """
    return mech.fingerprint.family_id


def report_schema(mech: Mechanism) -> dict[str, Any]:
    """The JSON schema of one report body, with its ``family`` field required."""
    return mech.report_schema()


def describe(mech: Mechanism) -> dict[str, Any]:
    """The published description: parameters, hash family, ``family_id``, ``report_schema``."""
    return mech.describe()


MECHANISMS: Final[Mapping[str, type[CMS] | type[HCMS] | type[SFP]]] = {
    CMS.name: CMS,
    HCMS.name: HCMS,
    SFP.name: SFP,
}
"""Every mechanism by its name: the one place a name becomes a class."""


def build(name: str, parameters: Mapping[str, Any], hash_family: HashFamily) -> CMS | HCMS | SFP:
    """The mechanism called ``name`` with ``parameters`` (the keys of its ``parameters()``).

    Raises ``ValueError`` naming an unknown mechanism, a missing or a wrong parameter.
    """
    cls = MECHANISMS.get(name)
    if cls is None:
        raise ValueError(f"`mechanism` must be one of {', '.join(MECHANISMS)}, got {name!r}")
    try:
        return cls.from_parameters(parameters, hash_family)
    except KeyError as exc:
        raise ValueError(f"`{exc.args[0]}` is missing from the randomizer's parameters") from None
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def from_published(data: Mapping[str, Any]) -> CMS | HCMS | SFP:
    """The mechanism a published description prescribes (or a policy's ``"randomizer"``).

    Raises ``ValueError`` if a field is missing or the rebuilt mechanism's identifier is not
    the published ``family_id``.
    """
    block = data.get("randomizer", data)
    if not isinstance(block, Mapping):
        raise ValueError("`randomizer` must be an object")
    if "hash_family" not in block or "mechanism" not in block:
        missing = "hash_family" if "hash_family" not in block else "mechanism"
        raise ValueError(f"`{missing}` is missing from the published randomizer")
    try:
        family = HashFamily.from_dict(dict(block["hash_family"]))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"`hash_family` is not a published hash family: {exc}") from None
    mech = build(block["mechanism"], block, family)
    expected = block.get("family_id")
    if expected is not None and expected != family_id(mech):
        raise ValueError(
            f"`family_id` is {expected!r} but these parameters give {family_id(mech)!r}:"
            " the description was altered or uses another algorithm version"
        )
    return mech

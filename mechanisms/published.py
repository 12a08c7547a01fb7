"""What a device needs to build the server's randomizer, as JSON, and the way back.

:func:`describe` turns a mechanism into its published description: the mechanism, its
parameters, the hash family (algorithm and seed), the family identifier and the JSON schema of
one report body. :func:`from_published` builds the identical mechanism from that description (or
from a whole published policy that holds it under ``"randomizer"``), and checks the identifier,
so a device that mis-copies a parameter or implements another algorithm fails at once instead of
sending reports the server would fold under another family.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

from dp_governor.mechanisms.cms import CMS
from dp_governor.mechanisms.hashing import HashFamily
from dp_governor.mechanisms.hcms import HCMS
from dp_governor.mechanisms.sfp import DEFAULT_ALPHABET, POSITIONS, SFP

__all__ = [
    "FAMILY_FIELD",
    "describe",
    "family_id",
    "family_text",
    "from_published",
    "report_schema",
]

FAMILY_FIELD: Final = "family"
_FAMILY_PREFIX: Final = "f1-"

Mechanism = CMS | HCMS | SFP


def _parameters(mech: Mechanism) -> dict[str, Any]:
    """The parameters that decide how a report is built and folded (no identifier, no schema)."""
    out: dict[str, Any] = {"mechanism": mech.name}
    if isinstance(mech, SFP):
        out |= {
            "epsilon_word": mech.epsilon_word,
            "epsilon_fragment": mech.epsilon_fragment,
            "k": mech.k,
            "m": mech.m,
            "k_fragment": mech.k_fragment,
            "m_fragment": mech.m_fragment,
            "alphabet": mech.alphabet,
        }
    else:
        out |= {"epsilon": mech.epsilon, "k": mech.k, "m": mech.m}
    out["hash_family"] = mech.hash_family.to_dict()
    return out


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
    return json.dumps(_parameters(mech), sort_keys=True, separators=(",", ":"))


def family_id(mech: Mechanism) -> str:
    """A short identifier of the mechanism, its parameters and its hash family.

    ``"f1-"`` and the first 16 hex digits of SHA-256 over :func:`family_text`: equal for equal
    randomizers, different (but for a 2**-64 chance) for any other.
    """
    return _FAMILY_PREFIX + hashlib.sha256(family_text(mech).encode()).hexdigest()[:16]


def _cms_schema(k: int, m: int) -> dict[str, Any]:
    n_bytes = (m + 7) // 8
    return {
        "type": "object",
        "required": ["j", "bits"],
        "additionalProperties": False,
        "properties": {
            "j": {"type": "integer", "minimum": 0, "maximum": k - 1, "description": "hash row"},
            "bits": {
                "type": "string",
                "contentEncoding": "base64",
                "minLength": 4 * ((n_bytes + 2) // 3),
                "maxLength": 4 * ((n_bytes + 2) // 3),
                "description": f"the {m} privatized coordinates (1 = +1), packed big-endian"
                f" into {n_bytes} bytes, padding bits zero, standard base64",
            },
        },
    }


def report_schema(mech: Mechanism) -> dict[str, Any]:
    """The JSON schema of one report body, with the optional ``family`` field."""
    if isinstance(mech, HCMS):
        schema: dict[str, Any] = {
            "type": "object",
            "required": ["j", "l", "bit"],
            "additionalProperties": False,
            "properties": {
                "j": {"type": "integer", "minimum": 0, "maximum": mech.k - 1},
                "l": {"type": "integer", "minimum": 0, "maximum": mech.m - 1},
                "bit": {"enum": [-1, 1]},
            },
        }
    elif isinstance(mech, CMS):
        schema = _cms_schema(mech.k, mech.m)
    else:
        schema = {
            "type": "object",
            "required": ["word", "fragment", "position"],
            "additionalProperties": False,
            "properties": {
                "word": _cms_schema(mech.k, mech.m),
                "fragment": _cms_schema(mech.k_fragment, mech.m_fragment),
                "position": {"enum": list(POSITIONS)},
            },
        }
    schema["properties"][FAMILY_FIELD] = {
        "const": family_id(mech),
        "description": "the randomizer's family identifier; a report under another is refused",
    }
    return schema


def describe(mech: Mechanism) -> dict[str, Any]:
    """The published description: parameters, hash family, ``family_id``, ``report_schema``.

    The seed is published fixed-width (64 hex digits, the key's 32 bytes); ``family_id`` keeps
    hashing the identity form of :meth:`HashFamily.to_dict`, so it is unchanged for every seed.
    """
    return _parameters(mech) | {
        "hash_family": mech.hash_family.to_published(),
        "family_id": family_id(mech),
        "report_schema": report_schema(mech),
    }


def from_published(data: Mapping[str, Any]) -> Mechanism:
    """The mechanism a published description prescribes (or a policy's ``"randomizer"``).

    Raises ``ValueError`` if a field is missing or the rebuilt mechanism's identifier is not
    the published ``family_id``.
    """
    block = data.get("randomizer", data)
    if not isinstance(block, Mapping):
        raise ValueError("`randomizer` must be an object")
    try:
        family = HashFamily.from_dict(dict(block["hash_family"]))
        name = block["mechanism"]
        mech: Mechanism
        if name == "cms":
            mech = CMS(block["epsilon"], block["k"], block["m"], family)
        elif name == "hcms":
            mech = HCMS(block["epsilon"], block["k"], block["m"], family)
        elif name == "sfp":
            mech = SFP(
                block["epsilon_word"],
                block["epsilon_fragment"],
                block["k"],
                block["m"],
                block["k_fragment"],
                block["m_fragment"],
                family,
                block.get("alphabet", DEFAULT_ALPHABET),
            )
        else:
            raise ValueError(f"`mechanism` must be cms, hcms or sfp, got {name!r}")
    except KeyError as exc:
        raise ValueError(f"`{exc.args[0]}` is missing from the published randomizer") from None
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    expected = block.get("family_id")
    if expected is not None and expected != family_id(mech):
        raise ValueError(
            f"`family_id` is {expected!r} but these parameters give {family_id(mech)!r}:"
            " the description was altered or uses another algorithm version"
        )
    return mech

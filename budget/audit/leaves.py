"""What the transparency log publishes of each audit entry, and the labels that hide its device.

A leaf says no more than a third party may see (docs/transparency.md):

- a charge: its UTC day (never a finer time), use case, policy version, epsilon, budget, the
  device's micro-epsilon on the use case that day after the charge (``spent``) and a *label*
  for this one charge, :func:`charge_label` of the charge's ordinal ``n`` among the device's
  charges of the use case that day (``v: 2``). The device label key is ``HMAC-SHA256(label
  secret, pseudonym)`` and the label secret is derived from the audit key. The device receives
  its label key with its record and so finds its own leaves; without it, any two labels are
  unrelated random strings. Charges recorded before per-charge labels (no ``n`` in their audit
  entry) keep their version 1 leaf: one :func:`day_label` for all the device's charges of a
  day. A refused decision is a leaf with its day and nothing else.
- a policy version, a device-wide budget version, a published batch, a purge or a privacy
  claim (:mod:`dp_governor.budget.reporting.claims`): the entry's data in full (public figures,
  no device in them), its actor and its day.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime
from typing import Any

import orjson

__all__ = [
    "LabelKeys",
    "charge_label",
    "day_label",
    "device_label_key",
    "hmac_sha256",
    "leaf_of",
    "project",
]

_DAY_SECONDS = 86_400
_SORTED = orjson.OPT_SORT_KEYS
_BLOCK = 64  # SHA-256's block: HMAC pads its key to it (RFC 2104)
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


def _pads(key: bytes) -> tuple[bytes, bytes]:
    """HMAC-SHA256's inner and outer padded keys (RFC 2104, section 2)."""
    if len(key) > _BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    return key.translate(_IPAD), key.translate(_OPAD)


def hmac_sha256(key: bytes, message: bytes) -> bytes:
    """``HMAC-SHA256(key, message)`` in two SHA-256 calls: ``hmac.digest``'s value, less work.

    The checkpoint job makes one a charge; OpenSSL's one-shot HMAC looks its algorithms up on
    every call, which costs more instructions than the hashing (``docs/performance.md``).

    >>> hmac_sha256(b"key", b"message") == hmac.digest(b"key", b"message", "sha256")
    True
    """
    inner, outer = _pads(key)
    return hashlib.sha256(outer + hashlib.sha256(inner + message).digest()).digest()


def device_label_key(label_secret: bytes, dk: str) -> bytes:
    """The key a device's labels are made with: ``HMAC-SHA256(label secret, pseudonym)``."""
    return hmac.digest(label_secret, b"device:" + dk.encode(), "sha256")


class LabelKeys:
    """Device label keys under one label secret, cached by actor (a bounded cache).

    The secret's padded keys are hashed once and the two SHA-256 states copied for each device
    (:func:`device_label_key`'s value, with half the instructions of a copied ``hmac`` object):
    the checkpoint job makes one a new device.
    """

    def __init__(self, label_secret: bytes, *, cached: int = 20_000) -> None:
        inner, outer = _pads(label_secret)
        self._inner, self._outer = hashlib.sha256(inner), hashlib.sha256(outer)
        self._cache: dict[str, bytes] = {}
        self._cached = cached

    def of(self, actor: str) -> bytes:
        """The device label key of ``actor`` (``device:<pseudonym>``)."""
        key = self._cache.get(actor)
        if key is None:
            if len(self._cache) >= self._cached:
                self._cache.clear()  # bounded memory: the cache only saves a repeated device
            inner, outer = self._inner.copy(), self._outer.copy()
            inner.update(b"device:" + actor.removeprefix("device:").encode())
            outer.update(inner.digest())
            key = self._cache[actor] = outer.digest()
        return key


def day_label(key: bytes, day: int) -> str:
    """A device's label on ``day``: ``HMAC-SHA256(device label key, "day:<day>")[:16]``, hex.

    >>> len(day_label(bytes(32), 20000)), day_label(bytes(32), 1) == day_label(bytes(32), 2)
    (32, False)
    """
    return hmac_sha256(key, f"day:{int(day)}".encode())[:16].hex()


def charge_label(key: bytes, day: int, use_case: str, n: int) -> str:
    """The label of a device's ``n``-th charge of ``use_case`` on ``day`` (a version 2 leaf).

    ``HMAC-SHA256(device label key, "charge:<day>:<use case>:<n>")[:16]``, hex.

    >>> charge_label(bytes(32), 1, "emoji", 1) == charge_label(bytes(32), 1, "emoji", 2)
    False
    """
    return hmac_sha256(key, f"charge:{int(day)}:{use_case}:{int(n)}".encode())[:16].hex()


def _day_of(at: str) -> int:
    """The UTC day number of an entry's ISO 8601 time."""
    moment = datetime.fromisoformat(at)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() // _DAY_SECONDS)


def leaf_of(label_secret: bytes, seq: int, body: str) -> bytes:
    """The public leaf of audit entry ``seq``: canonical JSON (sorted keys, no spaces), UTF-8."""
    return project(LabelKeys(label_secret), seq, body)[0]


def project(keys: LabelKeys, seq: int, body: str) -> tuple[bytes, str | None]:
    """:func:`leaf_of` and the leaf's label, from the entry's hashed body alone.

    The body (the chain's canonical JSON) holds the entry's action, actor, time and data, so
    nothing else of the entry is read; ``keys`` makes the device label keys.
    """
    entry = orjson.loads(body)
    action, data = entry["action"], entry["data"]
    if action == "charge":
        day = int(data["day"])
        if not data["accepted"]:
            return orjson.dumps({"day": day, "kind": "refusal", "seq": seq}), None
        n = data.get("n")
        if n is not None:
            return _charge_leaf(keys.of(entry["actor"]), seq, day, n, data)
        label = day_label(keys.of(entry["actor"]), day)  # before per-charge labels: version 1
        leaf: dict[str, Any] = {
            "kind": "charge",
            "use_case": data["use_case"],
            "policy_version": data["policy_version"],
            "epsilon_micro": data["epsilon_micro"],
            "budget": data.get("budget"),
            "label": label,
        }
    else:
        actor, day = entry["actor"], _day_of(entry["at"])
        if actor.startswith("device:"):  # no other action names a device; never publish one
            leaf = {"kind": action}
        else:
            leaf = {"kind": action, "actor": actor, "data": data}
        label = None
    leaf["day"] = day
    leaf["seq"] = seq
    return orjson.dumps(leaf, option=_SORTED), label


def _charge_leaf(key: bytes, seq: int, day: int, n: int, data: dict[str, Any]) -> tuple[bytes, str]:
    """The version 2 leaf of an accepted charge and its label (the checkpoint job's usual leaf).

    Its keys are written in sorted order, so it is canonical without a sort; its values are the
    charge's numbers and names (never an object a sort would reach into).
    """
    label = charge_label(key, day, data["use_case"], n)
    leaf = {
        "budget": data.get("budget"),
        "day": day,
        "epsilon_micro": data["epsilon_micro"],
        "kind": "charge",
        "label": label,
        "policy_version": data["policy_version"],
        "seq": seq,
        "spent": data["spent"],
        "use_case": data["use_case"],
        "v": 2,
    }
    return orjson.dumps(leaf), label

"""Sealed inbox rows: what waits in the inbox is ciphertext that only the shuffler's key opens.

An accepted report is written to the inbox in its charge's transaction, so anything that reads
the database's pages in commit order (a plain ``pg_dump`` writes heap order, SQLite's ``-wal``
holds each commit's pages, PostgreSQL's ``xmin`` names the writing transaction) can pair an
inbox row with its charge, and so with its device's pseudonym. The row's report and device tag
are therefore sealed to the shuffler key, which is kept outside the database with the other
keys (Prochlo's encoder-shuffler-analyzer split: the database stores what it cannot read): a
backup pairs a charge with ciphertext only. The use case, parameter hash and UTC day stay in
clear beside it; the charge records the same three (its use case, policy version and day).

The seal is AES-256-GCM (``cryptography``) under a key derived from the shuffler key for the
row's use case, parameter hash and UTC day, with a nonce that starts with the row's id (so a
sealed report opens only in its own row; :class:`InboxSeal`). Every report of a parameter set
is padded to one length (:meth:`InboxSeal.width`), so a sealed row's size says nothing about its
report either.

Layout: ``version (1) | key id (4) | nonce (12) | AES-GCM(flag (1) | tag (8) | report)``; the
key id is the first 4 bytes of the key's fingerprint
(:func:`dp_governor.budget.storage.db.key_fingerprint`), so a process holding several keys (a
rotation) knows which opens a row.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Sequence
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from dp_governor.budget.storage.db import key_fingerprint

__all__ = ["SEAL_VERSION", "InboxSeal", "SealError", "key_id"]

SEAL_VERSION = 1
_VERSION = bytes([SEAL_VERSION])
_NONCE = 12
_HEAD = 1 + 4 + _NONCE  # version, key id, nonce
# Not valid UTF-8, like the key fingerprint's label: no device id or report is HMACed to it.
_KEY_LABEL = b"\xffdp-governor/inbox-seal/v1\0"
_UNTAGGED = b"\0" * 9
_WIDEST_INT = -(10**18)  # 20 characters: no integer of a report is written wider
_CACHED_KEYS = 256  # (key, use case, parameters, day) ciphers kept per process

Row = tuple[
    int, str, str, int, bytes
]  # an inbox row as inserted: id, use case, params, day, sealed


class SealError(ValueError):
    """A sealed inbox row that cannot be opened: sealed under a key not held, or altered."""


def key_id(key: bytes) -> bytes:
    """The 4 bytes that name ``key`` in the rows it seals: the start of its fingerprint."""
    return bytes.fromhex(key_fingerprint(key)[:8])


def _widest(value: Any) -> Any:
    """``value`` (parsed JSON) with every integer replaced by the widest one a report holds."""
    if isinstance(value, dict):
        return {k: _widest(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_widest(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return _WIDEST_INT
    return value


class InboxSeal:
    """Seals and opens inbox rows under the shuffler key (the first of ``keys``).

    The other keys only open rows sealed before a rotation. With no key at all (a command run
    before any shuffler key was recorded) nothing can be sealed or opened: only rows queued
    before sealing flush. Each (key, use case, parameter hash, day) has its own AES-256-GCM key
    (``HMAC-SHA256(shuffler key, label || use case || params || day)``), derived once and
    cached: a sealed report opens only in a row of its own use case, parameters and day, and
    the nonce starts with the row's id, so only in its own row. The nonce is 95 bits from the
    OS CSPRNG, the row's 63-bit id among them: a derived key seals one day's reports of one
    parameter set, and a repeat is as likely as two of them drawing the same 95 bits.

    >>> seal = InboxSeal([b"k" * 64])
    >>> ((row_id, _, _, _, sealed),) = seal.seal_rows([("emoji", "p" * 64, 20_000, b'{"j":3}', 42)])
    >>> seal.open(row_id, "emoji", "p" * 64, 20_000, sealed)
    ('{"j":3}', 42)
    """

    __slots__ = ("_ciphers", "_current", "_keys", "_widths")

    def __init__(self, keys: Sequence[bytes]) -> None:
        self._keys: dict[bytes, bytes] = {}
        for key in keys:
            self._keys.setdefault(key_id(key), key)
        self._current = key_id(keys[0]) if keys else None
        self._ciphers: dict[tuple[bytes, str, str, int], AESGCM] = {}
        self._widths: dict[str, int] = {}  # parameter hash -> padded report length

    @property
    def can_seal(self) -> bool:
        """Whether this seal holds a shuffler key (without one it opens nothing either)."""
        return self._current is not None

    def _cipher(self, kid: bytes, use_case: str, params: str, day: int) -> AESGCM:
        """The AES-GCM cipher of one key, use case, parameter set and UTC day (cached)."""
        found = self._ciphers.get((kid, use_case, params, day))
        if found is None:
            if len(self._ciphers) >= _CACHED_KEYS:
                self._ciphers.clear()
            context = f"{use_case}\0{params}\0{day}".encode()
            derived = hmac.digest(self._keys[kid], _KEY_LABEL + context, "sha256")
            found = self._ciphers[(kid, use_case, params, day)] = AESGCM(derived)
        return found

    def _sealing_key(self) -> bytes:
        if self._current is None:
            raise SealError(
                "no shuffler key: set DPGOV_SHUFFLER_KEY or DPGOV_SHUFFLER_KEY_FILE (the server"
                " generates one at its first start)"
            )
        return self._current

    def width(self, params: str, payload: str | bytes) -> int:
        """The length every report of parameter set ``params`` is padded to (in bytes).

        The canonical JSON of ``payload`` (a report of those parameters) with each integer
        written as wide as any report's: the rest of a report's text (its keys, its base64
        bit strings) has one length per parameter set. Computed once per parameter set.
        """
        found = self._widths.get(params)
        if found is None:
            template = orjson.dumps(_widest(orjson.loads(payload)), option=orjson.OPT_SORT_KEYS)
            found = self._widths[params] = len(template)
        return found

    def _plain(self, params: str, body: bytes, tag: int | None) -> bytes:
        """The device tag and the report (UTF-8) padded to its parameter set's one length."""
        width = self._widths.get(params) or self.width(params, body)
        if len(body) > width:  # never for a valid report: padded to a multiple of 64
            width = -(-len(body) // 64) * 64
        head = _UNTAGGED if tag is None else b"\1" + tag.to_bytes(8, "big", signed=True)
        return head + body.ljust(width)

    def seal_rows(self, rows: Sequence[tuple[str, str, int, bytes, int | None]]) -> list[Row]:
        """New inbox rows for ``(use case, params, day, payload, tag)``: the report path's call.

        Each row gets a random 63-bit id (the first bits of its nonce), and its report (the
        canonical JSON's UTF-8 bytes) and device tag sealed.
        """
        kid = self._sealing_key()
        head = _VERSION + kid
        pool = secrets.token_bytes(_NONCE * len(rows))  # one CSPRNG read for the group
        from_bytes = int.from_bytes
        out: list[Row] = []
        last: tuple[str, str, int] = ("", "", -1)
        cipher: AESGCM | None = None
        widths = self._widths
        for k, (use_case, params, day, payload, tag) in enumerate(rows):
            drawn = pool[_NONCE * k : _NONCE * (k + 1)]
            nonce = bytes((drawn[0] & 0x7F,)) + drawn[1:]  # 95 random bits: the id's top is 0
            if cipher is None or day != last[2] or params != last[1] or use_case != last[0]:
                last, cipher = (use_case, params, day), self._cipher(kid, use_case, params, day)
            width = widths.get(params) or self.width(params, payload)
            plain = (
                (_UNTAGGED if tag is None else b"\1" + tag.to_bytes(8, "big", signed=True))
                + payload.ljust(width)
                if len(payload) <= width
                else self._plain(params, payload, tag)
            )
            sealed = head + nonce + cipher.encrypt(nonce, plain, None)
            out.append((from_bytes(nonce[:8], "big"), use_case, params, day, sealed))
        return out

    def seal(
        self, row_id: int, use_case: str, params: str, day: int, payload: str, tag: int | None
    ) -> bytes:
        """An existing row's report and device tag, sealed (rows queued before sealing)."""
        kid = self._sealing_key()
        nonce = row_id.to_bytes(8, "big") + secrets.token_bytes(_NONCE - 8)
        cipher = self._cipher(kid, use_case, params, day)
        return (
            _VERSION
            + kid
            + nonce
            + cipher.encrypt(nonce, self._plain(params, payload.encode(), tag), None)
        )

    def check_key(self, row_id: int, sealed: bytes) -> bytes:
        """The key id a sealed row names, if this seal holds that key; :class:`SealError` if not.

        Reads the row's header only: no decryption (the flush's plan, when it needs no tag).
        """
        if len(sealed) < _HEAD + 16 + 9 or sealed[0] != SEAL_VERSION:
            raise SealError(f"inbox row {row_id} is not a sealed report of version {SEAL_VERSION}")
        kid = bytes(sealed[1:5])
        if kid not in self._keys:
            raise SealError(
                f"inbox row {row_id} is sealed under shuffler key {kid.hex()}, which this process"
                " does not hold: give it after the current key in DPGOV_SHUFFLER_KEY or"
                " DPGOV_SHUFFLER_KEY_FILE"
            )
        return kid

    def open(
        self, row_id: int, use_case: str, params: str, day: int, sealed: bytes
    ) -> tuple[str, int | None]:
        """A sealed row's report (canonical JSON) and device tag; :class:`SealError` if it fails."""
        sealed = bytes(sealed)  # psycopg may return a memoryview for bytea
        kid = self.check_key(row_id, sealed)
        nonce = sealed[5:_HEAD]
        try:
            if int.from_bytes(nonce[:8], "big") != row_id:
                raise InvalidTag
            plain = self._cipher(kid, use_case, params, day).decrypt(nonce, sealed[_HEAD:], None)
        except InvalidTag:
            raise SealError(
                f"inbox row {row_id} does not open under shuffler key {kid.hex()}: altered, or"
                " moved from another row"
            ) from None
        tag = int.from_bytes(plain[1:9], "big", signed=True) if plain[0] else None
        return plain[9:].decode().rstrip(" "), tag

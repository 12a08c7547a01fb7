r"""C2SP signed notes, tlog checkpoints and Ed25519 cosignatures.

- ``c2sp.org/signed-note``: a text ending in a newline, a blank line, then signature lines
  ``— <key name> base64(key ID || signature)``; Ed25519 keys (type ``0x01``) have the key ID
  ``SHA-256(name || 0x0A || 0x01 || public key)[:4]`` and the verifier key
  ``<name>+<hex key ID>+base64(0x01 || public key)``.
- ``c2sp.org/tlog-checkpoint``: the note text is the log's origin, its size in decimal and its
  RFC 6962 root hash in base64, one per line.
- ``c2sp.org/tlog-cosignature`` (Ed25519, type ``0x04``): a witness signs
  ``cosignature/v1\\ntime <t>\\n`` followed by the checkpoint's text, and its signature is
  ``key ID || u64 big-endian t || Ed25519 signature``.

Everything here is the ``cryptography`` package's Ed25519 and the standard library; the formats
are interoperable with Go's ``golang.org/x/mod/sumdb/note`` and the transparency-dev witness.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

__all__ = [
    "COSIGNATURE",
    "ED25519",
    "Checkpoint",
    "NoteError",
    "Signature",
    "Signer",
    "Verifier",
    "check_origin",
    "check_quorum",
    "cosignature_message",
    "open_note",
    "sign_note",
]

ED25519 = 0x01
COSIGNATURE = 0x04
_DASH = "\u2014 "
_MAX_SIGNATURES = 64


class NoteError(ValueError):
    """A note, checkpoint or key that cannot be read or is not signed as required."""


@dataclass(frozen=True, slots=True)
class Signature:
    """One signature line: the key's name, its 4-byte ID and the signature bytes after it."""

    name: str
    key_id: int
    signature: bytes

    def line(self) -> str:
        """The line as the note carries it (with its newline)."""
        blob = self.key_id.to_bytes(4, "big") + self.signature
        return f"{_DASH}{self.name} {base64.b64encode(blob).decode()}\n"


def _check_name(name: str) -> str:
    if not name or any(c.isspace() or c == "+" for c in name):
        raise NoteError(f"a key name must be non-empty, without spaces or '+', got {name!r}")
    return name


def check_origin(origin: str) -> str:
    """``origin`` if it is a log origin as C2SP ``tlog-checkpoint`` recommends, else ``ValueError``.

    A schema-less URL (``example.com/log42``): non-empty, no scheme, no Unicode space, no
    ``+`` (it is also the log key's name) and no control character (it is a note's first line).

    >>> check_origin("dpgov.example.com/tlog")
    'dpgov.example.com/tlog'
    """
    problem = None
    if not origin:
        problem = "is empty"
    elif "://" in origin:
        problem = "has a scheme (drop `https://`)"
    elif any(c.isspace() for c in origin):
        problem = "holds a space or line break"
    elif "+" in origin:
        problem = "holds a `+`"
    elif any(unicodedata.category(c) in ("Cc", "Cf", "Cs") for c in origin):
        problem = "holds a control character"
    if problem is not None:
        raise ValueError(
            f"must be a schema-less URL such as `example.com/log` (C2SP tlog-checkpoint), but"
            f" {origin!r} {problem}"
        )
    return origin


def check_quorum(quorum: object, witnesses: int) -> int:
    """``quorum`` if a checkpoint can meet it under ``witnesses`` configured keys, else an error.

    No witness configured: the quorum is 0. Otherwise 1 to ``witnesses``: a quorum of 0 would
    configure witnesses and never ask for them, one above ``witnesses`` could never be met.
    ``TypeError`` for a quorum that is no integer, ``ValueError`` naming ``quorum`` otherwise.

    >>> check_quorum(2, 3)
    2
    """
    if isinstance(quorum, bool) or not isinstance(quorum, int):
        raise TypeError(f"`quorum` must be an integer, got {type(quorum).__name__}")
    if witnesses == 0 and quorum != 0:
        raise ValueError(f"`quorum` is {quorum} but no witness is configured: it must be 0")
    if witnesses and not 1 <= quorum <= witnesses:
        raise ValueError(
            f"`quorum` must be 1 to {witnesses} (the witnesses configured), got {quorum}"
        )
    return quorum


def _key_id(name: str, kind: int, public: bytes) -> int:
    digest = hashlib.sha256(name.encode() + b"\n" + bytes([kind]) + public).digest()
    return int.from_bytes(digest[:4], "big")


def _public_bytes(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


@dataclass(frozen=True, slots=True)
class Verifier:
    """A public key a note may be signed with: name, type (Ed25519 or cosignature) and key."""

    name: str
    kind: int
    public: bytes

    def __post_init__(self) -> None:
        _check_name(self.name)
        if self.kind not in (ED25519, COSIGNATURE):
            raise NoteError(f"unsupported signature type {self.kind:#04x}")
        if len(self.public) != 32:
            raise NoteError(f"an Ed25519 public key is 32 bytes, got {len(self.public)}")

    @property
    def key_id(self) -> int:
        """``SHA-256(name || 0x0A || type || public key)[:4]`` as an integer."""
        return _key_id(self.name, self.kind, self.public)

    def vkey(self) -> str:
        """The verifier key text: ``<name>+<hex key ID>+base64(type || public key)``."""
        material = base64.b64encode(bytes([self.kind]) + self.public).decode()
        return f"{self.name}+{self.key_id:08x}+{material}"

    @classmethod
    def parse(cls, vkey: str) -> Verifier:
        """Read a verifier key text, checking its key ID; raises :class:`NoteError`."""
        parts = vkey.strip().split("+", 2)  # the base64 key may itself contain "+"
        if len(parts) != 3:
            raise NoteError(f"a verifier key is <name>+<id>+<key>, got {vkey!r}")
        name, key_hex, material = parts
        try:
            raw = base64.b64decode(material, validate=True)
            key_id = int(key_hex, 16)
        except (binascii.Error, ValueError):
            raise NoteError(f"the verifier key {name!r} is not hex and base64") from None
        if len(key_hex) != 8 or not raw:
            raise NoteError(f"the verifier key {name!r} has a malformed ID or key")
        verifier = cls(name, raw[0], raw[1:])
        if verifier.key_id != key_id:
            raise NoteError(f"the verifier key {name!r} has the wrong key ID")
        return verifier

    def _key(self) -> Ed25519PublicKey:
        return Ed25519PublicKey.from_public_bytes(self.public)

    def verify(self, text: str, signature: Signature) -> bool:
        """Whether ``signature`` is this key's over the note ``text`` (type ``0x01`` only)."""
        if self.kind != ED25519 or (signature.name, signature.key_id) != (self.name, self.key_id):
            return False
        try:
            self._key().verify(signature.signature, text.encode())
        except InvalidSignature:
            return False
        return True

    def cosigned_at(self, text: str, signature: Signature) -> int | None:
        """The time of this witness's valid cosignature over checkpoint ``text``, or ``None``."""
        if self.kind != COSIGNATURE or (signature.name, signature.key_id) != (
            self.name,
            self.key_id,
        ):
            return None
        blob = signature.signature
        if len(blob) != 72:
            return None
        when = int.from_bytes(blob[:8], "big")
        try:
            self._key().verify(blob[8:], cosignature_message(text, when))
        except InvalidSignature:
            return None
        return when


class Signer:
    """An Ed25519 private key that signs notes (type ``0x01``) or cosigns (type ``0x04``)."""

    def __init__(self, name: str, seed: bytes, *, kind: int = ED25519) -> None:
        if len(seed) != 32:
            raise NoteError(f"an Ed25519 seed is 32 bytes, got {len(seed)}")
        self._key = Ed25519PrivateKey.from_private_bytes(seed)
        self.verifier = Verifier(_check_name(name), kind, _public_bytes(self._key.public_key()))

    @property
    def name(self) -> str:
        """The key's name."""
        return self.verifier.name

    def sign(self, text: str) -> Signature:
        """An Ed25519 signature over the note text (type ``0x01``)."""
        if self.verifier.kind != ED25519:
            raise NoteError("a cosigning key signs checkpoints with `cosign`")
        return Signature(self.name, self.verifier.key_id, self._key.sign(text.encode()))

    def cosign(self, text: str, when: int) -> Signature:
        """A timestamped cosignature over a checkpoint's text (``c2sp.org/tlog-cosignature``)."""
        if self.verifier.kind != COSIGNATURE:
            raise NoteError("a note-signing key signs with `sign`")
        if not 0 <= when < 2**63:
            raise NoteError(f"a cosignature time must be in [0, 2**63), got {when}")
        blob = when.to_bytes(8, "big") + self._key.sign(cosignature_message(text, when))
        return Signature(self.name, self.verifier.key_id, blob)


def cosignature_message(text: str, when: int) -> bytes:
    """What an Ed25519 cosignature signs: the header, the time line and the checkpoint text."""
    return f"cosignature/v1\ntime {when}\n{text}".encode()


def sign_note(text: str, signatures: Iterable[Signature]) -> str:
    """A signed note: ``text`` (ending in a newline), a blank line, the signature lines."""
    lines = "".join(s.line() for s in signatures)
    if not text.endswith("\n"):
        raise NoteError("a note's text must end with a newline")
    if not lines:
        raise NoteError("a signed note needs at least one signature")
    return f"{text}\n{lines}"


def open_note(note: str) -> tuple[str, list[Signature]]:
    """Split a signed note into its text and signature lines (unverified); :class:`NoteError`."""
    if any(ord(c) < 0x20 and c != "\n" for c in note):
        raise NoteError("a note must not contain control characters other than newline")
    cut = note.rfind("\n\n")
    if cut < 0 or not note.endswith("\n"):
        raise NoteError("a note is its text, a blank line and its signature lines")
    text, block = note[: cut + 1], note[cut + 2 :]
    signatures = []
    for line in block.splitlines():
        if not line.startswith(_DASH):
            raise NoteError(f"not a signature line: {line[:60]!r}")
        name, _, encoded = line[len(_DASH) :].rpartition(" ")
        try:
            blob = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            raise NoteError(f"the signature of {name!r} is not base64") from None
        if len(blob) < 5 or not name:
            raise NoteError(f"the signature line of {name!r} is too short")
        signatures.append(Signature(name, int.from_bytes(blob[:4], "big"), blob[4:]))
    if not signatures or len(signatures) > _MAX_SIGNATURES:
        raise NoteError(f"a note needs 1 to {_MAX_SIGNATURES} signatures, got {len(signatures)}")
    return text, signatures


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A tlog checkpoint: origin, tree size, root hash (the note's text, no extension lines)."""

    origin: str
    size: int
    root: bytes

    def text(self) -> str:
        """The note text: three lines, each ending in a newline."""
        return f"{self.origin}\n{self.size}\n{base64.b64encode(self.root).decode()}\n"

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        """Read a checkpoint's text (extension lines are refused: this log writes none)."""
        lines = text.split("\n")
        if len(lines) != 4 or lines[3] != "":
            raise NoteError("a checkpoint is three lines: origin, size, root hash")
        origin, size, root = lines[:3]
        if not origin or not size.isdigit() or (size != "0" and size.startswith("0")):
            raise NoteError(f"a checkpoint's origin and size are malformed: {size!r}")
        try:
            digest = base64.b64decode(root, validate=True)
        except binascii.Error:
            raise NoteError("a checkpoint's root hash is not base64") from None
        if len(digest) != 32:
            raise NoteError(f"a checkpoint's root hash is 32 bytes, got {len(digest)}")
        return cls(origin, int(size), digest)

    @classmethod
    def open(
        cls,
        note: str,
        log: Verifier,
        *,
        witnesses: Sequence[Verifier] = (),
        quorum: int = 0,
    ) -> tuple[Checkpoint, dict[str, int]]:
        """Verify a signed checkpoint: the log's signature and ``quorum`` witnesses' cosignatures.

        Returns the checkpoint and the witnesses whose cosignatures verified (name to time).
        A nonzero ``quorum`` must be 1 to ``len(witnesses)`` (:func:`check_quorum`, a
        ``ValueError`` naming it); 0 asks for no cosignature.
        Unknown signatures are ignored, as the note specification requires; a known key's bad
        signature rejects the note. Raises :class:`NoteError` naming what is missing.
        """
        if quorum:  # 0 asks for no cosignature (what cosigned is still returned)
            check_quorum(quorum, len(witnesses))
        text, signatures = open_note(note)
        point = cls.parse(text)
        if point.origin != log.name:
            raise NoteError(f"the checkpoint is of log {point.origin!r}, not {log.name!r}")
        signed = False
        cosigned: dict[str, int] = {}
        for sig in signatures:
            if (sig.name, sig.key_id) == (log.name, log.key_id):
                if not log.verify(text, sig):
                    raise NoteError("the log's signature on the checkpoint does not verify")
                signed = True
            for witness in witnesses:
                if (sig.name, sig.key_id) == (witness.name, witness.key_id):
                    when = witness.cosigned_at(text, sig)
                    if when is None:
                        raise NoteError(f"the cosignature of witness {witness.name!r} is bad")
                    cosigned[witness.name] = when
        if not signed:
            raise NoteError(f"the checkpoint carries no signature of log {log.name!r}")
        if len(cosigned) < quorum:
            raise NoteError(
                f"the checkpoint is cosigned by {len(cosigned)} of the configured witnesses,"
                f" the quorum is {quorum}"
            )
        return point, cosigned


def same_key(a: Verifier, b: Verifier) -> bool:
    """Whether two verifier keys are the same key (constant-time on the key bytes)."""
    return a.name == b.name and a.kind == b.kind and hmac.compare_digest(a.public, b.public)

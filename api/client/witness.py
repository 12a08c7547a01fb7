"""A witness of the transparency log (C2SP ``tlog-witness`` semantics, run as a command).

A witness keeps, per log, the largest checkpoint it has cosigned (size and root). Shown a new
signed checkpoint, it cosigns only if the log's signature verifies and a consistency proof
shows its kept tree a prefix of the new one; a checkpoint of the same size with another root,
or one whose proof fails, is a *fork* (a split view) and is refused, and the kept state does
not move. The cosignature is a ``c2sp.org/tlog-cosignature`` Ed25519 line clients check
against a quorum (:func:`dp_governor.api.client.verify_record`).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson

from dp_governor.mechanisms.merkle import verify_consistency
from dp_governor.mechanisms.signed_note import (
    Checkpoint,
    NoteError,
    Signer,
    Verifier,
    open_note,
    sign_note,
)

__all__ = [
    "BadProof",
    "Fork",
    "SplitView",
    "WitnessState",
    "check_extension",
    "cosign_checkpoint",
    "cosign_note",
]


class Fork(ValueError):
    """The log showed a checkpoint inconsistent with one the witness cosigned: a split view."""


class SplitView(Fork):
    """A checkpoint of the kept size with another root hash."""


class BadProof(Fork):
    """A consistency proof that does not join the kept checkpoint to the new one."""


@dataclass(frozen=True, slots=True)
class WitnessState:
    """The largest checkpoint a witness cosigned for one log (``size`` 0: none yet)."""

    origin: str
    size: int = 0
    root: bytes = b""

    def to_json(self) -> bytes:
        """The state as JSON (the witness's state file)."""
        return orjson.dumps(
            {"origin": self.origin, "size": self.size, "root": base64.b64encode(self.root).decode()}
        )

    @classmethod
    def from_json(cls, data: bytes) -> WitnessState:
        """Read a state file; raises ``ValueError`` naming what is wrong."""
        try:
            raw = orjson.loads(data)
            return cls(str(raw["origin"]), int(raw["size"]), base64.b64decode(raw["root"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"the witness state is not readable: {exc}") from None


def cosign_checkpoint(
    note: str,
    log: Verifier,
    state: WitnessState,
    proof: Callable[[int, int], Sequence[bytes]],
    signer: Signer,
    *,
    now: int,
) -> tuple[str, WitnessState]:
    """Check ``note`` against the kept state and cosign it; returns the note and the new state.

    ``proof(old, new)`` fetches the log's consistency proof. Raises :class:`Fork` for a split
    view and :class:`~dp_governor.mechanisms.signed_note.NoteError` for a note that is not
    the log's. The returned note carries every signature it had plus this witness's.
    """
    point, _ = Checkpoint.open(note, log)
    steps = list(proof(state.size, point.size)) if 0 < state.size < point.size else []
    new_state = check_extension(state, point, steps)
    return cosign_note(note, signer, now=now), new_state


def check_extension(state: WitnessState, point: Checkpoint, proof: Sequence[bytes]) -> WitnessState:
    """The state after cosigning ``point``, if ``proof`` shows it extends the kept checkpoint.

    The one check both witness modes make (``dpgov witness run`` pulls the proof from the log,
    ``dpgov witness serve`` is sent it). Raises :class:`SplitView`, :class:`BadProof`, or
    :class:`Fork` for a rollback; :class:`NoteError` for another log's checkpoint.
    """
    if state.origin != point.origin:
        raise NoteError(f"the state is of log {state.origin!r}, the note of {point.origin!r}")
    if point.size < state.size:
        raise Fork(
            f"the log shows {point.size} leaves after this witness cosigned {state.size}:"
            " it rolled back"
        )
    if point.size == state.size and point.root != state.root and state.size:
        raise SplitView(
            f"the checkpoint of {point.size} leaves has another root than the one this witness"
            " cosigned: the log forked"
        )
    if not verify_consistency(state.size, state.root, point.size, point.root, proof):
        raise BadProof(
            f"the checkpoint of {point.size} leaves is not an extension of the one of"
            f" {state.size} leaves this witness cosigned: the log forked"
        )
    return WitnessState(point.origin, point.size, point.root)


def cosign_note(note: str, signer: Signer, *, now: int) -> str:
    """``note`` with this witness's cosignature added (replacing an older one of its own)."""
    text, signatures = open_note(note)
    kept = [s for s in signatures if (s.name, s.key_id) != (signer.name, signer.verifier.key_id)]
    return sign_note(text, [*kept, signer.cosign(text, now)])

"""What a device checks of the server's record of its spend, with the log's public key alone.

:func:`verify_record` takes a :class:`~dp_governor.api.schemas.DeviceRecord` (the route
``GET /v1/devices/{id}/tlog``) and checks, in order: the checkpoint carries the log's signature
(and the cosignatures of ``quorum`` of the configured witnesses), every leaf's inclusion proof
leads to the checkpoint's root, every leaf is one of the device's charges that day (its label
computed from the label key: a version 2 leaf's from its place among the device's leaves of its
use case, whose ``spent`` must be the running sum of their epsilon; a version 1 leaf's is the
day's label), the leaves' totals per use case equal the gate's, and (when the device kept its own
count) equal what the device sent. The answer names the first disagreement in words a device
can report. Uses :mod:`dp_governor.mechanisms.merkle` and
:mod:`dp_governor.mechanisms.signed_note` only: no server code.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orjson

from dp_governor.api.schemas import DeviceRecord
from dp_governor.mechanisms.merkle import decode_hashes, leaf_hash, verify_inclusion
from dp_governor.mechanisms.signed_note import Checkpoint, NoteError, Verifier, check_quorum

__all__ = ["RecordCheck", "verify_record"]


@dataclass(frozen=True, slots=True)
class RecordCheck:
    """The outcome: ``ok``, the totals the log proves, and the first problem found.

    ``totals`` maps each use case to ``(reports, micro-epsilon)`` summed over the proven
    leaves; ``cosigned`` names the witnesses whose cosignatures verified.
    """

    ok: bool
    totals: dict[str, tuple[int, int]]
    cosigned: tuple[str, ...] = ()
    problem: str | None = None


def _label(key: bytes, message: str) -> str:
    """``HMAC-SHA256(label key, message)[:16]``, hex: ``day:<day>`` or ``charge:<day>:<uc>:<n>``."""
    return hmac.digest(key, message.encode(), "sha256")[:16].hex()


def verify_record(
    record: DeviceRecord,
    log: Verifier | str,
    *,
    witnesses: Sequence[Verifier | str] = (),
    quorum: int = 0,
    sent: Mapping[str, tuple[int, int]] | None = None,
) -> RecordCheck:
    """Check a device's record of one day (see the module's docstring).

    ``log`` and ``witnesses`` are verifier keys (objects or vkey texts) the device was
    configured with, never ones the server sent; ``sent`` is the device's own count of what it
    sent that day and was accepted, ``(reports, micro-epsilon)`` per use case. ``quorum`` is 0
    with no witness, else 1 to their number: another raises ``ValueError`` naming it.
    """
    check_quorum(quorum, len(witnesses))  # a configuration error, not the record's
    log_key = Verifier.parse(log) if isinstance(log, str) else log
    keys = [Verifier.parse(w) if isinstance(w, str) else w for w in witnesses]
    totals: dict[str, tuple[int, int]] = {}

    def answer(problem: str | None, cosigned: tuple[str, ...] = ()) -> RecordCheck:
        done = {uc: (n, e) for uc, (n, e) in sorted(totals.items())}
        return RecordCheck(problem is None, done, cosigned, problem)

    if record.checkpoint is None:
        if record.leaves or record.gate:
            return answer("the server shows charges but no signed checkpoint")
        return answer(_sent_problem(sent, {}))  # nothing shown: what the device sent is missing
    try:
        point, cosigned = Checkpoint.open(record.checkpoint, log_key, witnesses=keys, quorum=quorum)
    except NoteError as exc:
        return answer(f"the checkpoint is not acceptable: {exc}")
    names = tuple(sorted(cosigned))
    if point.size != record.size:
        return answer(f"the checkpoint signs {point.size} leaves, the record says {record.size}")
    key = bytes.fromhex(record.label_key)
    day_label = _label(key, f"day:{record.day}")
    for item in record.leaves:
        data = item.leaf.encode()
        try:
            proof = decode_hashes(item.proof)
        except ValueError:
            return answer(f"leaf {item.index}'s proof is not base64 SHA-256 hashes", names)
        if not verify_inclusion(leaf_hash(data), item.index, point.size, proof, point.root):
            return answer(f"leaf {item.index} is not in the signed tree (its proof fails)", names)
        leaf = orjson.loads(data)
        use_case = str(leaf.get("use_case"))
        count, spent = totals.get(use_case, (0, 0))
        if leaf.get("v") == 2:  # the label of the device's next charge of the use case
            label = _label(key, f"charge:{record.day}:{use_case}:{count + 1}")
        else:
            label = day_label
        if leaf.get("label") != label or leaf.get("day") != record.day:
            return answer(f"leaf {item.index} is not this device's on day {record.day}", names)
        if leaf.get("kind") != "charge":
            return answer(f"leaf {item.index} is not a charge", names)
        count, spent = count + 1, spent + int(leaf["epsilon_micro"])
        if leaf.get("v") == 2 and leaf.get("spent") != spent:
            return answer(
                f"leaf {item.index} says {use_case!r} had spent {leaf.get('spent')} micro-epsilon"
                f" that day, the device's leaves up to it make {spent}",
                names,
            )
        totals[use_case] = (count, spent)
    proven = {uc: (n, e) for uc, (n, e) in totals.items()}
    gate = {g.use_case: (g.reports, g.epsilon_micro) for g in record.gate}
    if gate != proven:
        where = sorted(set(gate) ^ set(proven) | {k for k in gate if gate[k] != proven.get(k)})
        pending = "" if record.covered else " (charges made since the checkpoint may explain it)"
        return answer(
            f"the gate's totals for {where[0]!r} are {gate.get(where[0], (0, 0))}, the log"
            f" proves {proven.get(where[0], (0, 0))} (reports, micro-epsilon){pending}",
            names,
        )
    return answer(_sent_problem(sent, proven), names)


def _sent_problem(
    sent: Mapping[str, tuple[int, int]] | None, proven: Mapping[str, tuple[int, int]]
) -> str | None:
    """The first use case where the device's own count differs from what the log proves."""
    if sent is None:
        return None
    mine = {uc: (int(n), int(e)) for uc, (n, e) in sent.items() if n}
    if mine == proven:
        return None
    where = sorted(set(mine) ^ set(proven) | {k for k in mine if mine[k] != proven.get(k)})
    return (
        f"for {where[0]!r} the device sent {mine.get(where[0], (0, 0))} but the log"
        f" records {proven.get(where[0], (0, 0))} (reports, micro-epsilon)"
    )

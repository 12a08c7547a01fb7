"""The transparency log's device vectors: a device's record of one day, valid and broken.

What ``docs/vectors/tlog.json`` holds, computed with the Python implementation from fixed keys:
a log of seven leaves (three of them the device's charges that day: one version 1 leaf under
the day's label, written before the upgrade to per-charge labels, and two version 2 leaves under
their charges' labels), its checkpoint signed by the log and cosigned by one witness, the
device's record as ``GET /v1/devices/{id}/tlog`` returns it, and cases that each break one
thing (a leaf altered, a charge dropped, a forked checkpoint, a proof in hex, a bad cosignature,
a quorum the cosignatures do not meet, another log's key, a device that sent more, a leaf
whose running total is wrong, the device's leaves out of order, another device's leaf, a
record that shows nothing though the device sent).
Each case carries the answer of :func:`dp_governor.api.client.verify_record`, word for word:
another implementation (``devices/js``) must give the same. ``bad_quorums`` are quorums no
checkpoint could meet under the witnesses configured (-1, 0 with a witness, one more than the
witnesses): a configuration error, refused with the message given before any record is read.
"""

from __future__ import annotations

import copy
from typing import Any, Final

import orjson

from dp_governor.api.client import verify_record
from dp_governor.api.schemas import DeviceRecord
from dp_governor.budget.audit.leaves import charge_label, day_label
from dp_governor.mechanisms.merkle import (
    NodeReader,
    encode_hashes,
    inclusion_proof,
    leaf_hash,
    node_hash,
    root_of,
)
from dp_governor.mechanisms.signed_note import COSIGNATURE, Checkpoint, Signer, sign_note

ORIGIN: Final = "dpgov.example/log"
DAY: Final = 20418
WHEN: Final = 1_764_115_200  # the witness's cosignature time (seconds since the epoch)


def _canonical(value: dict[str, Any]) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _tree(leaves: list[bytes]) -> tuple[bytes, NodeReader]:
    """The root of the leaves and the node reader proofs are computed with."""
    hashes = [leaf_hash(leaf) for leaf in leaves]

    def node(level: int, index: int) -> bytes:
        if level == 0:
            return hashes[index]
        return node_hash(node(level - 1, 2 * index), node(level - 1, 2 * index + 1))

    return root_of(len(hashes), node), node


def _note(signers: list[tuple[Signer, bool]], root: bytes, size: int) -> str:
    text = Checkpoint(ORIGIN, size, root).text()
    sigs = [s.cosign(text, WHEN) if cosign else s.sign(text) for s, cosign in signers]
    return sign_note(text, sigs)


def _charge(label: str, use_case: str, eps: int, spent: int | None) -> dict[str, Any]:
    """A charge leaf: version 2 with its running total, version 1 (a day label) without."""
    leaf: dict[str, Any] = {
        "kind": "charge", "label": label, "use_case": use_case, "policy_version": 1,
        "epsilon_micro": eps, "budget": use_case, "day": DAY,
    }  # fmt: skip
    if spent is not None:
        leaf["spent"] = spent
        leaf["v"] = 2
    return leaf


def _log(leaves_json: list[dict[str, Any]]) -> tuple[list[str], bytes, NodeReader]:
    """The leaves' texts (numbered ``seq`` 1, 2, ...), their root and node reader."""
    texts = [_canonical({**leaf, "seq": seq}) for seq, leaf in enumerate(leaves_json, 1)]
    root, node = _tree([t.encode() for t in texts])
    return texts, root, node


def _record(
    texts: list[str], node: NodeReader, note: str, label_key: bytes, mine: list[int]
) -> dict[str, Any]:
    """The device's record as the route returns it: leaves ``mine`` with their proofs."""
    size = len(texts)
    return {
        "day": DAY,
        "label_key": label_key.hex(),
        "label": day_label(label_key, DAY),
        "checkpoint": note,
        "size": size,
        "covered": True,
        "leaves": [
            {
                "index": i,
                "leaf": texts[i],
                "proof": encode_hashes(inclusion_proof(i, size, node)),
            }
            for i in mine
        ],
        "gate": [
            {"use_case": "emoji", "reports": 2, "epsilon_micro": 8_000_000},
            {"use_case": "quicktype", "reports": 1, "epsilon_micro": 8_000_000},
        ],
    }


def tlog() -> dict[str, Any]:
    """The vector file's content (see the module docstring)."""
    log = Signer(ORIGIN, bytes(range(32)))
    forger = Signer(ORIGIN, bytes(range(1, 33)))  # another key under the log's name
    witness = Signer("witness.example/w1", bytes([7] * 32), kind=COSIGNATURE)
    label_key = bytes(range(32, 64))
    other_key = bytes(32)

    def mine(use_case: str, n: int) -> str:
        return charge_label(label_key, DAY, use_case, n)

    def other(use_case: str, n: int) -> str:
        return charge_label(other_key, DAY, use_case, n)

    # the day the service was upgraded: the device's first emoji charge has the day's label
    leaves_json: list[dict[str, Any]] = [
        {"kind": "policy.create", "actor": "admin", "data": {"name": "emoji"}, "day": DAY},
        _charge(day_label(label_key, DAY), "emoji", 4_000_000, None),
        _charge(other("emoji", 1), "emoji", 4_000_000, 4_000_000),
        _charge(mine("quicktype", 1), "quicktype", 8_000_000, 8_000_000),
        _charge(mine("emoji", 2), "emoji", 4_000_000, 8_000_000),
        {"kind": "refusal", "day": DAY},
        _charge(other("quicktype", 1), "quicktype", 8_000_000, 8_000_000),
    ]
    texts, root, node = _log(leaves_json)
    size = len(texts)
    note = _note([(log, False), (witness, True)], root, size)
    record = _record(texts, node, note, label_key, [1, 3, 4])
    # a log whose leaf of the device's second emoji charge says a running total it never had
    wrong = copy.deepcopy(leaves_json)
    wrong[4]["spent"] = 12_000_000
    wrong_texts, wrong_root, wrong_node = _log(wrong)
    miscounted = _record(
        wrong_texts, wrong_node, _note([(log, False)], wrong_root, size), label_key, [1, 3, 4]
    )
    keys = {"log": log.verifier.vkey(), "witness": witness.verifier.vkey()}
    altered = copy.deepcopy(record)
    altered["leaves"][0]["leaf"] = texts[1].replace("4000000", "400000")
    dropped = copy.deepcopy(record)
    dropped["gate"][0]["reports"] = 3
    dropped["gate"][0]["epsilon_micro"] = 12_000_000
    forked_root, _ = _tree([t.encode() for t in texts[:6]] + [b'{"kind":"refusal"}'])
    reordered = copy.deepcopy(record)
    reordered["leaves"] = [reordered["leaves"][i] for i in (2, 0, 1)]
    others = copy.deepcopy(record)  # another device's charge shown as this device's
    others["leaves"][1] = _record(texts, node, note, label_key, [2])["leaves"][0]
    forked = copy.deepcopy(record)
    forked["checkpoint"] = _note([(log, False)], forked_root, size)
    forged = copy.deepcopy(record)
    forged["checkpoint"] = _note([(forger, False)], root, size)
    hex_proof = copy.deepcopy(record)
    hex_proof["leaves"][1]["proof"] = [p.hex() for p in inclusion_proof(3, size, node)]
    bad_cosign = copy.deepcopy(record)
    head, _, sig_lines = note.rpartition("\n\n")
    lines = sig_lines.splitlines()
    name, _, blob = lines[1].rpartition(" ")
    lines[1] = f"{name} {blob[:-8]}{'A' if blob[-8] != 'A' else 'B'}{blob[-7:]}"
    bad_cosign["checkpoint"] = head + "\n\n" + "\n".join(lines) + "\n"
    hidden = copy.deepcopy(record)  # the server shows nothing at all for the device's day
    hidden.update(checkpoint=None, leaves=[], gate=[])
    cases_in: list[tuple[str, dict[str, Any], list[str], int, dict[str, list[int]] | None]] = [
        ("valid", record, [], 0, None),
        ("valid, cosigned by the quorum", record, [keys["witness"]], 1, None),
        ("valid, what the device counted", record, [], 0,
         {"emoji": [2, 8_000_000], "quicktype": [1, 8_000_000]}),
        ("a leaf altered", altered, [], 0, None),
        ("a charge dropped from the log", dropped, [], 0, None),
        ("a forked checkpoint", forked, [], 0, None),
        ("a checkpoint signed by another key under the log's name", forged, [], 0, None),
        ("a proof in hex, not base64", hex_proof, [], 0, None),
        ("a bad cosignature", bad_cosign, [keys["witness"]], 1, None),
        ("the device sent more", record, [], 0,
         {"emoji": [3, 12_000_000], "quicktype": [1, 8_000_000]}),
        ("a leaf's running total is not the device's", miscounted, [], 0, None),
        ("the device's charges out of order", reordered, [], 0, None),
        ("another device's charge", others, [], 0, None),
        ("nothing shown, though the device sent", hidden, [keys["witness"]], 1,
         {"emoji": [2, 8_000_000]}),
    ]  # fmt: skip
    cases = []
    for name, rec, witnesses, quorum, sent in cases_in:
        check = verify_record(
            DeviceRecord.model_validate(rec),
            keys["log"],
            witnesses=witnesses,
            quorum=quorum,
            sent=None if sent is None else {k: (v[0], v[1]) for k, v in sent.items()},
        )
        cases.append(
            {
                "name": name,
                "record": rec,
                "witnesses": witnesses,
                "quorum": quorum,
                "sent": sent,
                "ok": check.ok,
                "problem": check.problem,
                "totals": {k: list(v) for k, v in check.totals.items()},
                "cosigned": list(check.cosigned),
            }
        )
    return {
        "about": "A device's record of one day in the transparency log and what a device must"
        " answer (docs/transparency.md); the `problem` texts are word for word.",
        "log_key": keys["log"],
        "witness_key": keys["witness"],
        "cases": cases,
        "bad_quorums": [
            _bad_quorum(record, keys["log"], w, q) for w, q in _bad_quorums(keys["witness"])
        ],
    }


def _bad_quorums(witness: str) -> list[tuple[list[str], int]]:
    """Witnesses and a quorum they cannot carry: none for one, one for -1, 0 and 2."""
    return [([], 1), ([witness], -1), ([witness], 0), ([witness], 2)]


def _bad_quorum(
    record: dict[str, Any], log: str, witnesses: list[str], quorum: int
) -> dict[str, Any]:
    """The refusal of a quorum that cannot be met, word for word."""
    try:
        verify_record(DeviceRecord.model_validate(record), log, witnesses=witnesses, quorum=quorum)
    except ValueError as exc:
        return {"witnesses": witnesses, "quorum": quorum, "error": str(exc)}
    raise AssertionError(f"a quorum of {quorum} under {len(witnesses)} witnesses was accepted")

"""C2SP signed notes, checkpoints and cosignatures: the specification's vectors and refusals."""

from __future__ import annotations

import pytest

from dp_governor.mechanisms.signed_note import (
    COSIGNATURE,
    Checkpoint,
    NoteError,
    Signer,
    Verifier,
    open_note,
    sign_note,
)

# c2sp.org/signed-note, "Example": this verifier key verifies this note.
SPEC_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
SPEC_NOTE = (
    "This is an example message.\n\n"
    "\u2014 example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3m"
    "FXmRKuwHjG1Yu72IneyaQM=\n"
)


def test_the_specification_example_verifies() -> None:
    verifier = Verifier.parse(SPEC_VKEY)
    assert verifier.vkey() == SPEC_VKEY
    text, signatures = open_note(SPEC_NOTE)
    assert text == "This is an example message.\n"
    assert verifier.verify(text, signatures[0])
    assert not verifier.verify("This is another message.\n", signatures[0])


def test_a_checkpoint_round_trips_with_a_log_signature_and_a_quorum() -> None:
    log = Signer("example.com/log", bytes(range(32)))
    w1 = Signer("w1.example", bytes([1] * 32), kind=COSIGNATURE)
    w2 = Signer("w2.example", bytes([2] * 32), kind=COSIGNATURE)
    point = Checkpoint("example.com/log", 7, bytes(32))
    text = point.text()
    note = sign_note(text, [log.sign(text), w1.cosign(text, 1_700_000_000)])
    got, cosigned = Checkpoint.open(
        note, log.verifier, witnesses=[w1.verifier, w2.verifier], quorum=1
    )
    assert got == point and cosigned == {"w1.example": 1_700_000_000}
    with pytest.raises(NoteError, match="quorum is 2"):
        Checkpoint.open(note, log.verifier, witnesses=[w1.verifier, w2.verifier], quorum=2)
    assert Verifier.parse(w1.verifier.vkey()) == w1.verifier


def test_forged_and_malformed_notes_are_refused() -> None:
    log = Signer("example.com/log", bytes(range(32)))
    text = Checkpoint("example.com/log", 7, bytes(32)).text()
    note = sign_note(text, [log.sign(text)])
    forged = note.replace("\n7\n", "\n8\n")
    with pytest.raises(NoteError, match="does not verify"):
        Checkpoint.open(forged, log.verifier)
    other = Signer("example.com/log", bytes([9] * 32))
    with pytest.raises(NoteError, match="no signature of log"):
        Checkpoint.open(note, other.verifier)  # same name, another key: ignored, so unsigned
    for bad, match in [
        ("no blank line\n", "blank line"),
        (text + "\nnot a signature\n", "not a signature line"),
        ("a\x01b\n\n\u2014 x AAAAAAA=\n", "control characters"),
    ]:
        with pytest.raises(NoteError, match=match):
            open_note(bad)
    for body, match in [
        ("log\n07\n" + "A" * 44 + "\n", "malformed"),
        ("log\n7\nAAAA\n", "32 bytes"),
        ("log\n7\n", "three lines"),
    ]:
        with pytest.raises(NoteError, match=match):
            Checkpoint.parse(body)
    with pytest.raises(NoteError, match="key name"):
        Signer("has space", bytes(32))
    with pytest.raises(NoteError, match="wrong key ID"):
        Verifier.parse(SPEC_VKEY.replace("530d903a", "530d903b"))


def test_a_verifier_key_whose_base64_holds_a_plus_parses() -> None:
    """Only the name and the ID are split off: base64 uses "+" too."""
    seed = 0
    while True:
        signer = Signer("example.com/w", seed.to_bytes(32, "big"))
        vkey = signer.verifier.vkey()
        if "+" in vkey.split("+", 2)[2]:
            break
        seed += 1
    assert Verifier.parse(vkey) == signer.verifier

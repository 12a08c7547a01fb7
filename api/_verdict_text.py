"""A verification in words: the entries it checked and its note, one text for every reader.

``dpgov audit verify`` (its JSON and its summary line), ``GET /v1/audit/verify`` and the
dashboard all say the same thing about a verdict:

- **the entries checked** are ``from_seq + 1`` to ``from_seq + entries``, numbered from 1 and
  inclusive (``from_seq`` is the signed checkpoint the run started after, 0 for the first
  entry; ``entries`` counts the entries the run accepted, so on an accepted run the last is
  ``head_seq``): :func:`checked_entries`, which says "no new entries since the last verified
  checkpoint" of an accepted run that found nothing after it (the command adds that ``--full``
  replays every entry: :func:`summary`);
- **the note** says what the run did not check, and how the sealed inbox rows were checked
  (opened under the shuffler key, or only counted by a command that reads no shuffler key):
  :func:`with_clause` and the clauses below, added by the service's verification
  (:func:`dp_governor.api._integrity.verify_service`).
"""

from __future__ import annotations

from dp_governor.budget.audit.log import Verification

__all__ = [
    "REPLAY_HINT",
    "SEALED_COUNTED",
    "SEALED_OPENED",
    "checked_entries",
    "entry_span",
    "summary",
    "with_clause",
]

SEALED_OPENED = "sealed inbox rows were opened under the shuffler key, which authenticates each"
SEALED_COUNTED = "sealed inbox rows were counted, not opened (no shuffler key was read)"
REPLAY_HINT = " (--full replays every entry the log holds)"


def with_clause(note: str | None, clause: str) -> str:
    """``note`` with one more clause, after a semicolon.

    >>> with_clause(None, "b"), with_clause("a", "b")
    ('b', 'a; b')
    """
    return clause if not note else f"{note}; {clause}"


def entry_span(verdict: Verification) -> tuple[int, int] | None:
    """The first and last entry the run checked, 1-based and inclusive (``None``: none).

    >>> entry_span(Verification(True, 150, 250, "h", 1, 250, "t", from_seq=100))
    (101, 250)
    """
    if verdict.entries <= 0:
        return None
    return verdict.from_seq + 1, verdict.from_seq + verdict.entries


def _nothing_new(verdict: Verification) -> bool:
    """Whether an accepted run started from a verified checkpoint found no entry after it."""
    return verdict.ok and verdict.from_seq > 0 and verdict.entries <= 0


def checked_entries(verdict: Verification) -> str:
    """What the run checked, in words: ``entries 101 to 250 (after ...) checked``.

    A run that found nothing new after the checkpoint it started from says so, rather than
    that it checked no entry: an incremental run right after another checks what was added.

    >>> checked_entries(Verification(True, 250, 250, "h", 1, 250, "t"))
    'entries 1 to 250 checked'
    >>> checked_entries(Verification(True, 150, 250, "h", 1, 250, "t", from_seq=100))
    'entries 101 to 250 (after the signed checkpoint at entry 100) checked'
    >>> checked_entries(Verification(True, 0, 100, "h", 1, 100, "t", from_seq=100))
    'no new entries since the last verified checkpoint at entry 100'
    >>> checked_entries(Verification(False, 0, 101, "h", 1, 100, "t", 101, "x", from_seq=100))
    'no entry after the signed checkpoint at entry 100 checked'
    """
    if _nothing_new(verdict):
        return f"no new entries since the last verified checkpoint at entry {verdict.from_seq:,d}"
    span = entry_span(verdict)
    after = f"the signed checkpoint at entry {verdict.from_seq:,d}"
    if span is None:
        return f"no entry after {after} checked" if verdict.from_seq else "no entry checked"
    words = f"entries {span[0]:,d} to {span[1]:,d}"
    return f"{words} (after {after}) checked" if verdict.from_seq else f"{words} checked"


def summary(verdict: Verification) -> str:
    """One line: accepted or failed, the entries checked, and the note.

    A run with nothing new names the command that replays every entry.

    >>> print(summary(Verification(True, 3, 3, "h", 1, 3, "t", note="n")))
    accepted: entries 1 to 3 checked; note: n
    >>> summary(Verification(True, 0, 3, "h", 1, 3, "t", from_seq=3)).endswith(REPLAY_HINT)
    True
    """
    verdict_word = "accepted" if verdict.ok else "FAILED"
    replay = REPLAY_HINT if _nothing_new(verdict) else ""
    note = f"; note: {verdict.note}" if verdict.note else ""
    return f"{verdict_word}: {checked_entries(verdict)}{replay}{note}"

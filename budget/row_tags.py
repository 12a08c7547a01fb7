"""Keyed tags over rows the audit chain cannot describe: the reports a device sent.

The chain records every charge decision, but never a report (its payload, or anything that
would pair a stored report with its device). A report is stored twice in its life: in the
inbox, in its charge's transaction, and in the report store, once the flush has shuffled it.
Each row carries ``tag = HMAC-SHA256(row key, its stored fields)``, over the bytes as stored,
whatever they are (plain JSON today, sealed bytes if the inbox is ever encrypted), under a key
derived from the audit key and held outside the database. Someone who can write the database
but not read the audit key cannot forge a row, edit a payload, move a report to another use
case, parameter set, day or batch, or copy a payload onto another row (the row's id is
tagged), and ``verify`` names the row; deleting or adding rows is caught by the counts
(every accepted charge is exactly one report, in the inbox or the store).

An inbox row's tag and the stored report's share nothing: the report gets a new random id
and a new tag from the flush, which stores it tagged only if its inbox row's tag was right
(a forged inbox row is never laundered into a tagged report).
"""

from __future__ import annotations

import hmac

from budget.keyed import KeyedHash

__all__ = ["RowTags"]

_LABEL = b"dp-governor/row-tags/v1"


class RowTags:
    """Tags the inbox rows and stored reports of one database (a key derived from its audit key)."""

    __slots__ = ("_keyed",)

    def __init__(self, audit_key: bytes) -> None:
        self._keyed = KeyedHash(hmac.digest(audit_key, _LABEL, "sha256"))

    def _tag(self, *parts: object) -> str:
        # Length-prefixed fields: no two different rows give the same message.
        message = b"".join(
            len(b).to_bytes(4, "big") + b
            for b in (p if isinstance(p, bytes) else str(p).encode("utf-8") for p in parts)
        )
        return self._keyed.digest(message).hex()

    def inbox(
        self, row_id: int, use_case: str, params: str, day: int, payload: str | bytes,
        device_tag: int | None,
    ) -> str:  # fmt: skip
        """The tag of an inbox row (its device pseudonym, which batches count, included)."""
        tag = "" if device_tag is None else str(int(device_tag))
        return self._tag(b"inbox", int(row_id), use_case, params, int(day), payload, tag)

    def report(
        self, row_id: str, use_case: str, params: str, day: int, payload: str | bytes, batch: int
    ) -> str:
        """The tag of a stored report (the batch it was moved in included)."""
        return self._tag(b"report", row_id, use_case, params, int(day), payload, int(batch))

    def check_inbox(
        self, row_id: int, use_case: str, params: str, day: int, payload: str | bytes,
        device_tag: int | None, tag: str | None,
    ) -> bool:  # fmt: skip
        """Whether an inbox row carries its own tag (``None``: untagged, never valid)."""
        if tag is None:
            return False
        expected = self.inbox(row_id, use_case, params, day, payload, device_tag)
        return hmac.compare_digest(expected, str(tag))

    def check_report(
        self, row_id: str, use_case: str, params: str, day: int, payload: str | bytes,
        batch: int, tag: str | None,
    ) -> bool:  # fmt: skip
        """Whether a stored report carries its own tag (``None``: untagged, never valid)."""
        if tag is None:
            return False
        expected = self.report(row_id, use_case, params, day, payload, batch)
        return hmac.compare_digest(expected, str(tag))

"""Keyed tags over rows the audit chain cannot describe: the reports a device sent.

The chain records every charge decision, but never a report (its payload, or anything that would
pair a stored report with its device). A report is stored twice in its life: in the inbox, in
its charge's transaction, and in the report store, once the flush has shuffled it. Each stored
report, and each inbox row queued before the inbox was sealed, carries ``tag = HMAC-SHA256(row
key, its stored fields)`` over the bytes as stored, under a key derived from the audit key and
held outside the database. (A sealed inbox row needs none: its seal, AES-GCM under a key held
outside the database and bound to the row, authenticates it.) Someone who can write the database
but not read the audit key cannot forge a row, edit a payload, move a report to another use
case, parameter set, day or batch, or copy a payload onto another row (the row's id is tagged),
and ``verify`` names the row; deleting or adding rows is caught by the counts (every accepted
charge is exactly one report, in the inbox or the store).

An inbox row and the stored report share nothing: the report gets a new random id and a new tag
from the flush, which stores it tagged only if its inbox row was authentic (its seal opened, or
its tag was right): a forged inbox row is never laundered into a tagged report.
"""

from __future__ import annotations

import hmac

from dp_governor.budget.keyed import KeyedHash

__all__ = ["RowTags"]

_LABEL = b"dp-governor/row-tags/v1"


class RowTags:
    """Tags the inbox rows and stored reports of one database (a key derived from its audit key)."""

    __slots__ = ("_keyed",)

    def __init__(self, audit_key: bytes) -> None:
        self._keyed = KeyedHash(hmac.digest(audit_key, _LABEL, "sha256"))

    def _tag(self, header: str, payload: str | bytes) -> str:
        # The header's fields hold no NUL (ids, slugs, hex, numbers): NUL-separated, with the
        # payload last and whole, no two different rows give the same message.
        body = payload if isinstance(payload, bytes) else payload.encode("utf-8")
        return self._keyed.digest(header.encode() + body).hex()

    def inbox(
        self, row_id: int, use_case: str, params: str, day: int, payload: str | bytes,
        device_tag: int | None,
    ) -> str:  # fmt: skip
        """The tag of an inbox row (its device pseudonym, which batches count, included)."""
        tag = "" if device_tag is None else int(device_tag)
        return self._tag(
            f"inbox\0{int(row_id)}\0{use_case}\0{params}\0{int(day)}\0{tag}\0", payload
        )

    def report(
        self, row_id: str, use_case: str, params: str, day: int, payload: str | bytes, batch: int
    ) -> str:
        """The tag of a stored report (the batch it was moved in included)."""
        return self._tag(
            f"report\0{row_id}\0{use_case}\0{params}\0{int(day)}\0{int(batch)}\0", payload
        )

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

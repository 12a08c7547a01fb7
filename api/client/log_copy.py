"""A public transparency log's copy: its signed checkpoint and leaves, from the service or a file.

Read through the public routes only (``/v1/tlog/checkpoint``, ``/v1/tlog/leaves``), so an
outside verifier needs no database and no credentials; :func:`check_tree` recomputes the RFC
9162 root of the leaves and checks it is the one the checkpoint signs (and, if configured,
that a quorum of witnesses cosigned it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from dp_governor.mechanisms.merkle import Frontier, leaf_hash
from dp_governor.mechanisms.signed_note import Checkpoint, NoteError, Verifier

__all__ = ["LogCopy", "LogCopyError", "check_tree"]

_PAGE = 1_000  # the leaves route's largest answer


class LogCopyError(ValueError):
    """A log that could not be fetched or read, with what went wrong."""


@dataclass(frozen=True, slots=True)
class LogCopy:
    """A log as fetched: its verifier key as it names it, the signed checkpoint, the leaves."""

    vkey: str
    note: str
    size: int
    leaves: list[bytes]

    def to_json(self) -> bytes:
        """The copy as JSON (what ``--save`` writes and :meth:`load` reads back)."""
        return orjson.dumps(
            {
                "vkey": self.vkey,
                "note": self.note,
                "size": self.size,
                "leaves": [leaf.decode() for leaf in self.leaves],
            },
            option=orjson.OPT_INDENT_2,
        )

    @classmethod
    def load(cls, source: str) -> LogCopy:
        """The log at a service's base URL (``http://`` or ``https://``) or in a saved copy."""
        if source.startswith(("http://", "https://")):
            return cls.fetch(source)
        try:
            data = orjson.loads(Path(source).read_bytes())
            return cls(
                str(data["vkey"]),
                str(data["note"]),
                int(data["size"]),
                [str(leaf).encode() for leaf in data["leaves"]],
            )
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise LogCopyError(f"{source}: not a saved log copy ({exc})") from None

    @classmethod
    def fetch(cls, base: str) -> LogCopy:
        """Read the newest checkpoint and every leaf it covers through the public routes."""
        import httpx

        try:
            with httpx.Client(base_url=base.rstrip("/"), timeout=60) as http:
                answer = http.get("/v1/tlog/checkpoint")
                answer.raise_for_status()
                head = answer.json()
                if head["note"] is None:
                    raise LogCopyError(f"{base}: the log has signed no checkpoint yet")
                size = int(head["size"])
                leaves: list[bytes] = []
                for start in range(0, size, _PAGE):
                    got = http.get(
                        "/v1/tlog/leaves", params={"start": start, "end": min(size, start + _PAGE)}
                    )
                    got.raise_for_status()
                    leaves.extend(str(leaf).encode() for leaf in got.json())
        except httpx.HTTPError as exc:
            raise LogCopyError(f"{base}: {exc}") from None
        return cls(str(head["vkey"]), str(head["note"]), size, leaves)


def check_tree(
    copy: LogCopy, log: Verifier, witnesses: Sequence[Verifier] = (), quorum: int = 0
) -> tuple[int, str | None]:
    """The checkpoint's size, and ``None`` if the leaves' root is the one it signs, else why not.

    The checkpoint may cover fewer leaves than the copy holds (one a witness cosigned
    earlier): then its first ``size`` leaves are the ones checked.
    """
    try:
        point, _ = Checkpoint.open(copy.note, log, witnesses=witnesses, quorum=quorum)
    except NoteError as exc:
        return 0, f"the checkpoint is refused: {exc}"
    if len(copy.leaves) < point.size:
        held = len(copy.leaves)
        return point.size, f"the checkpoint covers {point.size} leaves, the copy holds {held}"
    frontier = Frontier()
    for leaf in copy.leaves[: point.size]:
        frontier.append(leaf_hash(leaf))
    if frontier.root() != point.root:
        return point.size, (
            f"the root of the {point.size} leaves is not the one the checkpoint signs:"
            " a leaf was altered, added or dropped"
        )
    return point.size, None

"""Every verdict of ``verify``, kept so that the next verification starts where the last stopped.

A verification that accepts the log records the last signed checkpoint it replayed past, the
state replayed up to that checkpoint (:meth:`dp_governor.budget.audit.verify.StateReplay.snapshot`)
and where the transparency log's check stopped (its size, right edge and node count). The next
incremental verification checks that checkpoint and its entry again and replays only what
follows; the digests of the sketches it checked spare the next one recomputing those that
stayed the same. Each row carries ``HMAC-SHA256`` under a key derived from the audit key over
all its columns (the state by its SHA-256): whoever can write the database but not read the
key cannot forge a starting point or a digest (an edited row fails the verification; a deleted
one only makes the next run start earlier and recompute every sketch). Only the newest accepted
verdict keeps its state (a few hundred KiB at most: digests per use case and day); recording one
clears the earlier ones', which no run reads again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, select

from dp_governor.budget.audit.log import Checkpoint, timestamp
from dp_governor.budget.storage.db import writer
from dp_governor.budget.storage.tables import AuditVerification

__all__ = ["Resume", "VerdictForged", "Verdicts"]

_TABLE = AuditVerification.__table__  # type: ignore[attr-defined]
_LABEL = b"dp-governor/audit-verdict/v1"


@dataclass(frozen=True, slots=True)
class Resume:
    """Where an accepted verification leaves the next one: a checkpoint and the state there.

    ``tlog`` is ``(leaves, right edge as hex, nodes)`` of the transparency log's check;
    ``sketches`` the digest of each sketch the verification recomputed or found unchanged, by
    use case, parameters and day (``dp_governor.api._integrity``: those need no recomputing).
    """

    checkpoint: Checkpoint
    state: str
    tlog: tuple[int, tuple[str, ...], int]
    sketches: Mapping[str, str] = field(default_factory=dict)


class VerdictForged(ValueError):
    """A recorded verdict's tag is not the audit key's: the row was written or edited outside."""


class Verdicts:
    """Records verdicts and finds the last accepted one (``audit_verifications``)."""

    def __init__(self, engine: Engine, audit_key: bytes) -> None:
        self.engine = engine
        self._mac = hmac.new(hmac.digest(audit_key, _LABEL, "sha256"), digestmod="sha256")

    def _tag(self, row: dict[str, Any]) -> str:
        mac = self._mac.copy()
        fields = {k: row[k] for k in sorted(row) if k not in ("id", "tag", "state")}
        mac.update(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode())
        return mac.hexdigest()

    def record(
        self,
        *,
        now: datetime,
        full: bool,
        from_seq: int,
        problem: str | None,
        resume: Resume | None,
    ) -> None:
        """Store one verdict (``problem`` ``None``: accepted, resuming at ``resume``)."""
        state = None
        if resume is not None and problem is None:
            leaves, edge, nodes = resume.tlog
            state = json.dumps(
                {
                    "replay": resume.state,
                    "tlog": [leaves, list(edge), nodes],
                    "sketches": dict(resume.sketches),
                },
                separators=(",", ":"),
            )
        point = resume.checkpoint if resume is not None and problem is None else None
        row: dict[str, Any] = {
            "at": timestamp(now),
            "full": full,
            "ok": problem is None,
            "from_seq": from_seq,
            "seq": None if point is None else point.seq,
            "hash": None if point is None else point.hash,
            "signed_at": None if point is None else point.at,
            "signature": None if point is None else point.signature,
            "problem": problem,
            "state": state,
            "state_sha256": None if state is None else hashlib.sha256(state.encode()).hexdigest(),
        }
        row["tag"] = self._tag(row)
        with writer(self.engine).begin() as conn:
            made = conn.execute(_TABLE.insert().values(**row)).inserted_primary_key
            if state is not None and made is not None:
                t = _TABLE.c
                conn.execute(
                    _TABLE.update()
                    .where((t.id < made[0]) & t.state.is_not(None))
                    .values(state=None)
                )

    def last(self) -> tuple[Resume, str] | None:
        """The last accepted verdict that names a checkpoint, and its time (``None``: none).

        Raises :class:`VerdictForged` when that row's tag is not the audit key's.
        """
        t = _TABLE.c
        with self.engine.connect() as conn:
            found = conn.execute(
                select(_TABLE)
                .where(t.ok.is_(True) & t.seq.is_not(None) & t.state.is_not(None))
                .order_by(t.id.desc())
                .limit(1)
            ).first()
        if found is None:
            return None
        row = found._asdict()
        row["full"], row["ok"] = bool(row["full"]), bool(row["ok"])
        state = str(row["state"])
        if not hmac.compare_digest(self._tag(row), str(row["tag"])) or not hmac.compare_digest(
            hashlib.sha256(state.encode()).hexdigest(), str(row["state_sha256"])
        ):
            raise VerdictForged(
                f"audit_verifications: the verdict {row['id']} is not the audit key's (written"
                " or edited outside the service)"
            )
        data = json.loads(state)
        leaves, edge, nodes = data["tlog"]
        point = Checkpoint(
            int(row["seq"]), str(row["hash"]), str(row["signed_at"]), str(row["signature"])
        )
        sketches = {str(k): str(v) for k, v in data.get("sketches", {}).items()}
        resume = Resume(
            point, str(data["replay"]), (int(leaves), tuple(edge), int(nodes)), sketches
        )
        return resume, str(row["at"])

"""Versioned policy storage: every change is a new immutable version; old versions stay readable."""

from __future__ import annotations

import builtins
import hashlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, Select, func, select, text
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col

from policies.errors import PolicyConflict, UnknownUseCase
from policies.model import FILTER_FIELDS, Policy, PolicyBase, PolicyCreate, PolicyUpdate

__all__ = ["GROUP_FIELDS", "PolicyStore", "advisory_key", "lock_names"]

# Use cases sharing a budget group share one account: these fields must agree across them.
GROUP_FIELDS = (
    "max_reports_per_day",
    "retention_days",
    "window_epsilon_cap",
    "lifetime_epsilon_cap",
    *FILTER_FIELDS,
)

_TABLE = Policy.__table__  # type: ignore[attr-defined]


def _latest_versions() -> Select[Any]:
    latest = (
        select(_TABLE.c.name, func.max(_TABLE.c.version).label("version"))
        .group_by(_TABLE.c.name)
        .subquery()
    )
    return select(_TABLE).join(
        latest, (_TABLE.c.name == latest.c.name) & (_TABLE.c.version == latest.c.version)
    )


OnChange = Callable[[Connection, Policy | None, Policy], None]


def advisory_key(name: str) -> int:
    """A signed 64-bit key for PostgreSQL's advisory locks, from the first 8 bytes of SHA-256.

    >>> advisory_key("policy-group:safari-domains") == advisory_key("policy-group:safari-domains")
    True
    """
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def lock_names(conn: Connection, names: builtins.list[str]) -> None:
    """Hold PostgreSQL advisory locks on ``names`` until the transaction ends (sorted: no deadlock).

    SQLite needs none: its write transactions (``BEGIN IMMEDIATE``) already run one at a time.
    A lock taken first in a READ COMMITTED transaction makes the statements after it see what
    the previous holder committed.
    """
    if conn.dialect.name != "postgresql":
        return
    for key in sorted({advisory_key(n) for n in names}):
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


class PolicyStore:
    """Reads and writes policy versions through an engine (one transaction per call).

    ``on_change(conn, old, new)`` runs inside each write's transaction (the ledger's audit
    entry: the old version, or ``None`` for a new use case, and the new one).
    """

    def __init__(self, engine: Engine, *, on_change: OnChange | None = None) -> None:
        self.engine = engine
        self._on_change = on_change
        # the ledger's write option (budget.storage.db.writer): BEGIN IMMEDIATE on SQLite
        self._writer = engine.execution_options(dpgov_write=True)

    # -- reads ---------------------------------------------------------------------------------

    @staticmethod
    def current_in(conn: Connection, name: str) -> Policy:
        """The current active version of ``name`` inside an open transaction."""
        row = conn.execute(
            select(_TABLE).where(_TABLE.c.name == name).order_by(_TABLE.c.version.desc()).limit(1)
        ).first()
        if row is None or not row.active:
            raise UnknownUseCase(name)
        return Policy.model_validate(row._asdict())

    @staticmethod
    def all_versions_in(conn: Connection) -> builtins.list[Policy]:
        """Every version of every use case (retired ones included), by name and version.

        The one read of the whole table: the ledger's policy book is built from it
        (``budget.book``), and every other reader of policy versions goes through that book.
        """
        rows = conn.execute(select(_TABLE).order_by(_TABLE.c.name, _TABLE.c.version)).all()
        return [Policy.model_validate(r._asdict()) for r in rows]

    @staticmethod
    def group_members_in(conn: Connection, group: str) -> builtins.list[Policy]:
        """Current active policies that draw from budget group ``group``."""
        rows = conn.execute(_latest_versions().where(_TABLE.c.budget_group == group)).all()
        return [Policy.model_validate(r._asdict()) for r in rows if r.active]

    def get(self, name: str, version: int | None = None) -> Policy:
        """The current version of ``name``, or a given (possibly old or deleted) version."""
        with Session(self.engine) as session:
            if version is None:
                return self.current_in(session.connection(), name)
            found = session.get(Policy, (name, version))
            if found is None:
                raise UnknownUseCase(f"{name}@{version}")
            return found

    def list(self) -> builtins.list[Policy]:
        """All current active policies, by name."""
        with self.engine.connect() as conn:
            return self.list_in(conn)

    @staticmethod
    def list_in(conn: Connection) -> builtins.list[Policy]:
        """All current active policies, by name, inside an open connection."""
        rows = conn.execute(_latest_versions().order_by(_TABLE.c.name)).all()
        return [Policy.model_validate(r._asdict()) for r in rows if r.active]

    def versions(self, name: str) -> builtins.list[Policy]:
        """Every version of ``name``, oldest first (deleted ones included)."""
        with Session(self.engine) as session:
            found = builtins.list(
                session.exec(
                    select(Policy).where(col(Policy.name) == name).order_by(col(Policy.version))  # type: ignore[call-overload]
                ).scalars()
            )
        if not found:
            raise UnknownUseCase(name)
        return found

    def is_empty(self) -> bool:
        """Whether no policy was ever stored."""
        with Session(self.engine) as session:
            return (
                session.connection().execute(select(func.count()).select_from(_TABLE)).scalar_one()
                == 0
            )

    # -- writes --------------------------------------------------------------------------------

    def ensure_defaults(self) -> builtins.list[Policy]:
        """Load Apple's default policies into an empty store (first start); else do nothing."""
        from policies.defaults import default_policies

        if not self.is_empty():
            return []
        return [self.create(p, actor="system") for p in default_policies()]

    def create(self, policy: PolicyCreate, *, actor: str = "admin") -> Policy:
        """Store version 1 of a new use case (or revive a deleted one as its next version)."""
        return self._write(policy, actor=actor, must_exist=False)

    def update(self, name: str, change: PolicyUpdate, *, actor: str = "admin") -> Policy:
        """Store a new version of ``name`` with ``change`` applied."""
        current = self.get(name)
        return self._write(change.apply_to(current), actor=actor, must_exist=True)

    def apply(self, policy: PolicyCreate, *, actor: str = "admin") -> Policy:
        """Create or replace: a new version unless the stored one is identical."""
        try:
            current = self.get(policy.name)
        except UnknownUseCase:
            return self.create(policy, actor=actor)
        if _same(current, policy):
            return current
        return self._write(policy, actor=actor, must_exist=True)

    def delete(self, name: str, *, actor: str = "admin") -> Policy:
        """Retire a use case: a new, inactive version. Its charges and history stay."""
        current = self.get(name)
        data = PolicyCreate.model_validate(current.model_dump(include=set(PolicyBase.model_fields)))
        return self._write(data, actor=actor, must_exist=True, active=False)

    def _write(
        self, policy: PolicyCreate, *, actor: str, must_exist: bool, active: bool = True
    ) -> Policy:
        with self._writer.begin() as conn:
            # One writer at a time per use case and per budget group: the group check below
            # reads the other members, so two writes to one group must not both pass it.
            names = [f"policy:{policy.name}"]
            if policy.budget_group:
                names.append(f"policy-group:{policy.budget_group}")
            lock_names(conn, names)
            latest = conn.execute(
                select(_TABLE.c.version, _TABLE.c.active)
                .where(_TABLE.c.name == policy.name)
                .order_by(_TABLE.c.version.desc())
                .limit(1)
            ).first()
            exists = latest is not None and latest.active
            if must_exist and not exists:
                raise UnknownUseCase(policy.name)
            if not must_exist and exists:
                raise PolicyConflict("name", f"use case {policy.name!r} already exists")
            if active and policy.budget_group:
                self.check_group(conn, policy)
            version = 1 if latest is None else latest.version + 1
            row = Policy(
                **policy.model_dump(),
                version=version,
                active=active,
                created_at=datetime.now(UTC),
                actor=actor,
            )
            try:
                conn.execute(_TABLE.insert().values(**row.model_dump()))
            except IntegrityError:
                raise PolicyConflict(
                    "version", f"a concurrent change to {policy.name!r} won; retry"
                ) from None
            if self._on_change is not None:
                old = None
                if latest is not None:
                    found = conn.execute(
                        select(_TABLE).where(
                            (_TABLE.c.name == policy.name) & (_TABLE.c.version == latest.version)
                        )
                    ).one()
                    old = Policy.model_validate(found._asdict())
                self._on_change(conn, old, row)
        return row

    def check_group(self, conn: Connection, policy: PolicyCreate) -> None:
        """Refuse ``policy`` if it disagrees with another member of its budget group.

        Raises :class:`PolicyConflict` naming the first shared field that differs.
        """
        if policy.budget_group is None:
            return
        for other in self.group_members_in(conn, policy.budget_group):
            if other.name == policy.name:
                continue
            for field in GROUP_FIELDS:
                if getattr(other, field) != getattr(policy, field):
                    raise PolicyConflict(
                        field,
                        f"must equal {getattr(other, field)!r} as in {other.name!r}: use cases of"
                        f" budget group {policy.budget_group!r} share one budget",
                    )


def _same(current: Policy, policy: PolicyCreate) -> bool:
    fields = set(PolicyBase.model_fields)
    return current.model_dump(include=fields) == policy.model_dump(include=fields)

"""Versioned policy storage: every change is a new immutable version; old versions stay readable."""

from __future__ import annotations

import builtins
import hashlib
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

from pydantic import ValidationError
from sqlalchemy import Connection, Engine, Select, func, select, text
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col

from dp_governor.policies.errors import PolicyConflict, UnknownUseCase, error_message
from dp_governor.policies.model import (
    GroupTerms,
    Policy,
    PolicyBase,
    PolicyCreate,
    PolicyUpdate,
)

__all__ = [
    "BOOK_LOCK_KEY",
    "GROUP_FIELDS",
    "Change",
    "PolicyStore",
    "Review",
    "advisory_key",
    "check_groups",
    "check_names",
    "lock_book",
    "lock_names",
]

# Use cases sharing a budget group share one account: these fields must agree across them.
GROUP_FIELDS = tuple(GroupTerms.model_fields)

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
BOOK_LOCK_KEY = int.from_bytes(
    hashlib.sha256(b"dpgov:policy-book").digest()[:8], "big", signed=True
)


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
    entry: the old version, or ``None`` for a new use case, and the new one); ``review(conn,
    stored, new, allow_loosen)`` before anything is written (the ledger's loosening check).
    """

    def __init__(
        self, engine: Engine, *, on_change: OnChange | None = None, review: Review | None = None
    ) -> None:
        self.engine = engine
        self._on_change = on_change
        self._review = review
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
        (``dp_governor.budget.rule.book``), and every other reader of policy versions goes through
        that book.
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
        from dp_governor.policies.defaults import default_policies

        if not self.is_empty():
            return []
        return self.write_all(default_policies(), actor="system")

    def create(
        self, policy: PolicyCreate, *, actor: str = "admin", allow_loosen: bool = False
    ) -> Policy:
        """Store version 1 of a new use case (or revive a deleted one as its next version)."""
        (row,) = self._write(lambda _: [Change(policy, "create")], actor, allow_loosen)
        return row

    def update(
        self, name: str, change: PolicyUpdate, *, actor: str = "admin", allow_loosen: bool = False
    ) -> Policy:
        """Store a new version of ``name`` with ``change`` applied to the version in force.

        The version it applies to is read under the write's lock, so a concurrent change is
        never written over with stale values.
        """

        def plan(latest: dict[str, Policy]) -> builtins.list[Change]:
            current = _active(latest, name)
            return [Change(change.apply_to(current), "update")]

        (row,) = self._write(plan, actor, allow_loosen)
        return row

    def apply(
        self, policy: PolicyCreate, *, actor: str = "admin", allow_loosen: bool = False
    ) -> Policy:
        """Create or replace: a new version unless the stored one is identical."""
        (row,) = self.write_all([policy], actor=actor, allow_loosen=allow_loosen) or [
            self.get(policy.name)
        ]
        return row

    def write_all(
        self,
        policies: Sequence[PolicyCreate],
        *,
        actor: str = "admin",
        allow_loosen: bool = False,
    ) -> builtins.list[Policy]:
        """Create or replace every policy of ``policies`` in one transaction; the rows written.

        Policies identical to their stored version are left alone. The whole set is checked
        as one change (a budget group's members may change their shared terms together), and
        nothing is written unless every check passes.
        """
        changes = [Change(p, "apply") for p in policies]
        return self._write(lambda _: changes, actor, allow_loosen)

    def update_group(
        self,
        group: str,
        terms: GroupTerms,
        *,
        actor: str = "admin",
        allow_loosen: bool = False,
    ) -> builtins.list[Policy]:
        """Give every active member of budget group ``group`` the shared ``terms``, at once.

        One new version per member whose terms change, in one transaction, each built from the
        member's version in force under the write's lock: the members of a group share its
        caps, filters and retention, so they change together. A member whose policy would no
        longer validate refuses the whole change (:class:`PolicyConflict` naming the field).
        """
        shared = terms.model_dump()

        def plan(latest: dict[str, Policy]) -> builtins.list[Change]:
            members = [p for p in latest.values() if p.active and p.budget_group == group]
            if not members:
                raise UnknownUseCase(f"budget group {group!r}")
            changes = []
            for member in members:
                data = member.model_dump(include=set(PolicyBase.model_fields))
                try:
                    policy = PolicyCreate.model_validate({**data, **shared})
                except ValidationError as exc:
                    error = exc.errors()[0]
                    field = ".".join(str(x) for x in error["loc"]) or _named(error["msg"])
                    raise PolicyConflict(
                        field, f"cannot hold for member {member.name!r}: {error_message(error)}"
                    ) from None
                changes.append(Change(policy, "group"))
            return changes

        return self._write(plan, actor, allow_loosen)

    def delete(self, name: str, *, actor: str = "admin") -> Policy:
        """Retire a use case: a new, inactive version. Its charges and history stay."""

        def plan(latest: dict[str, Policy]) -> builtins.list[Change]:
            current = _active(latest, name)
            data = current.model_dump(include=set(PolicyBase.model_fields))
            return [Change(PolicyCreate.model_validate(data), "retire")]

        (row,) = self._write(plan, actor, allow_loosen=False)
        return row

    def _write(self, plan: Plan, actor: str, allow_loosen: bool) -> builtins.list[Policy]:
        """Check the changes ``plan`` makes as one against every stored version, then store them.

        One policy writer at a time (PostgreSQL: the book's advisory lock, which the gate's
        charge transaction holds shared, so no charge decides on a book that changes before it
        commits; SQLite: its write lock); ``plan`` gets the latest version of every use case
        read under it. The checks, in order: each change's existence rule, the names of budgets
        (:func:`check_names`), every touched group's shared terms (:func:`check_groups`), then
        the review hook (the ledger's: loosening). Each written version is audited in the same
        transaction.
        """
        with self._writer.begin() as conn:
            lock_book(conn)
            stored = self.all_versions_in(conn)
            latest = {p.name: p for p in stored}  # sorted by name, version: the last wins
            changes = plan(latest)
            names = [c.policy.name for c in changes]
            if len(set(names)) != len(names):
                raise PolicyConflict("name", "each use case may appear once in one change")
            now = datetime.now(UTC)
            rows: builtins.list[tuple[Policy | None, Policy]] = []
            for change in changes:
                policy, old = change.policy, latest.get(change.policy.name)
                exists = old is not None and old.active
                if change.kind in ("update", "group", "retire") and not exists:
                    raise UnknownUseCase(policy.name)
                if change.kind == "create" and exists:
                    raise PolicyConflict("name", f"use case {policy.name!r} already exists")
                if change.kind in ("apply", "group") and exists:
                    assert old is not None
                    if _same(old, policy):
                        continue
                row = Policy(
                    **policy.model_dump(),
                    version=1 if old is None else old.version + 1,
                    active=change.kind != "retire",
                    created_at=now,
                    actor=actor,
                )
                rows.append((old, row))
            if not rows:
                return []
            new = [row for _, row in rows]
            check_names(stored, [row for old, row in rows if _renames(old, row)])
            check_groups([*stored, *new], new)
            if self._review is not None:
                self._review(conn, stored, new, allow_loosen)
            for old, row in rows:
                try:
                    conn.execute(_TABLE.insert().values(**row.model_dump()))
                except IntegrityError:
                    raise PolicyConflict(
                        "version", f"a concurrent change to {row.name!r} won; retry"
                    ) from None
                if self._on_change is not None:
                    self._on_change(conn, old, row)
        return new

    def proposed(self, conn: Connection, policies: Sequence[PolicyCreate]) -> builtins.list[Policy]:
        """``policies`` as the next versions of their use cases, checked as one write would be.

        The same checks as a write (:func:`check_names`, :func:`check_groups`); raises
        :class:`PolicyConflict` naming the field at fault. Nothing is written: the rows are for
        a what-if or a review.
        """
        stored = self.all_versions_in(conn)
        latest = {p.name: p for p in stored}
        now = datetime.now(UTC)
        rows = []
        for policy in policies:
            old = latest.get(policy.name)
            version = 1 if old is None else old.version + 1
            rows.append(Policy(**policy.model_dump(), version=version, active=True, created_at=now))
        check_names(stored, rows)
        check_groups([*stored, *rows], rows)
        return rows


class Change(NamedTuple):
    """One use case's part of a policy write: its new terms and what kind of write it is.

    ``create`` needs no active version; ``update``, ``group`` and ``retire`` need one;
    ``apply`` creates or replaces. ``apply`` and ``group`` leave an identical policy alone.
    """

    policy: PolicyCreate
    kind: Literal["create", "update", "apply", "group", "retire"]


Plan = Callable[[dict[str, Policy]], builtins.list[Change]]
"""``plan(latest)``: a write's changes, from every use case's latest version read under its lock."""
Review = Callable[[Connection, builtins.list[Policy], builtins.list[Policy], bool], None]
"""``review(conn, stored, new, allow_loosen)``: runs in a write's transaction before it writes."""


def lock_book(conn: Connection) -> None:
    """Hold the policy book's PostgreSQL advisory lock, exclusively, until the transaction ends.

    Every write of a policy or of the device-wide budget takes it; the gate's charge
    transaction takes it shared before it reads the book
    (``dp_governor.budget.gate.charge.charge_batch``), so a charge decides and commits on one book.
    SQLite needs none: its write transactions already run one at a time.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": BOOK_LOCK_KEY})


def check_names(stored: Sequence[Policy], new: Sequence[Policy]) -> None:
    """Refuse a new version whose budget would take the name of another budget.

    A use case draws from its group's budget or from its own, named like the use case; a
    charge records the budget's name. So a group's name is never a use case's (not even a
    retired one's, nor its own: leave ``budget_group`` empty for the use case's own budget),
    and a use case's name is never a group's that any version ever named: otherwise a use
    case would join another's budget unchecked, under terms its members never agreed on.
    """
    names = {p.name for p in [*stored, *new]}
    groups: dict[str, str] = {}
    for p in [*stored, *new]:
        if p.budget_group is not None:
            groups.setdefault(p.budget_group, p.name)
    for p in new:
        if p.budget_group is not None and p.budget_group in names:
            raise PolicyConflict(
                "budget_group",
                f"must not name a use case, got {p.budget_group!r} (the use case"
                f" {p.budget_group!r} has a budget of that name; leave `budget_group` empty to"
                " draw from the use case's own budget)",
            )
        if p.name in groups:
            raise PolicyConflict(
                "name",
                f"{p.name!r} is the name of a budget group (of {groups[p.name]!r}): a use case"
                " may not take a budget's name",
                policy=p.name,
            )


def check_groups(versions: Sequence[Policy], new: Sequence[Policy]) -> None:
    """Refuse a write after which the active members of a touched group disagree.

    ``versions`` are every version after the write; the groups checked are those the new
    versions draw from. Members share one budget, so they share ``GROUP_FIELDS``.
    """
    latest: dict[str, Policy] = {}
    for p in sorted(versions, key=lambda p: (p.name, p.version)):
        latest[p.name] = p
    for group in sorted({p.budget_group for p in new if p.budget_group and p.active}):
        members = [p for p in latest.values() if p.active and p.budget_group == group]
        members.sort(key=lambda p: (p not in new, p.name))  # a new version is the one at fault
        first = members[-1]
        for other in members:
            for field in GROUP_FIELDS:
                if getattr(other, field) != getattr(first, field):
                    raise PolicyConflict(
                        field,
                        f"of {other.name!r} must equal {getattr(first, field)!r} as in"
                        f" {first.name!r}: use cases of budget group {group!r} share one budget"
                        " (change a group's shared terms for every member at once: PUT"
                        " /v1/budget-groups/{name}, or every member in one policy file)",
                        policy=other.name,
                    )


def _renames(old: Policy | None, new: Policy) -> bool:
    """Whether ``new`` gives its use case a budget name it did not have in force.

    Only such a version is checked against the names of budgets (a ledger of an earlier
    release may hold a collision; its use cases stay editable and retirable as they are).
    """
    return new.active and (old is None or not old.active or old.budget_group != new.budget_group)


def _active(latest: dict[str, Policy], name: str) -> Policy:
    """The version in force of ``name`` (:class:`UnknownUseCase`: none, or retired)."""
    found = latest.get(name)
    if found is None or not found.active:
        raise UnknownUseCase(name)
    return found


def _named(message: str) -> str:
    """The first backquoted field a validation message names (``policy``: none).

    >>> _named("Value error, `window_epsilon_cap` must be at least `epsilon_per_report`")
    'window_epsilon_cap'
    """
    found = re.search(r"`([a-z_]+)`", message)
    return found.group(1) if found else "policy"


def _same(current: Policy, policy: PolicyCreate) -> bool:
    fields = set(PolicyBase.model_fields)
    return current.model_dump(include=fields) == policy.model_dump(include=fields)

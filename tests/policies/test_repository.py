"""Versioned policy storage on SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Engine

from dp_governor.budget import PolicyConflict, UnknownUseCase
from dp_governor.policies import PolicyCreate, PolicyStore, PolicyUpdate, default_policies


@pytest.fixture
def store(engine: Engine) -> PolicyStore:
    return PolicyStore(engine)


def test_defaults_load_once_on_an_empty_store(store: PolicyStore) -> None:
    assert len(store.ensure_defaults()) == 7
    assert store.ensure_defaults() == []
    assert [p.name for p in store.list()] == sorted(p.name for p in default_policies())


def test_every_change_is_a_new_immutable_version(store: PolicyStore) -> None:
    store.ensure_defaults()
    v2 = store.update("emoji", PolicyUpdate(max_reports_per_day=2), actor="alice")
    assert (v2.version, v2.max_reports_per_day, v2.actor) == (2, 2, "alice")
    assert store.get("emoji").version == 2
    assert store.get("emoji", 1).max_reports_per_day == 1
    deleted = store.delete("emoji")
    assert deleted.version == 3 and not deleted.active
    with pytest.raises(UnknownUseCase):
        store.get("emoji")
    assert [v.version for v in store.versions("emoji")] == [1, 2, 3]
    assert "emoji" not in [p.name for p in store.list()]
    revived = store.create(default_policies()[1])
    assert revived.name == "emoji" and revived.version == 4


def test_create_refuses_duplicates_and_update_unknown(store: PolicyStore) -> None:
    store.ensure_defaults()
    with pytest.raises(PolicyConflict, match="already exists"):
        store.create(default_policies()[0])
    with pytest.raises(UnknownUseCase):
        store.update("nope", PolicyUpdate(k=4))
    with pytest.raises(UnknownUseCase):
        store.versions("nope")


def test_apply_is_idempotent(store: PolicyStore) -> None:
    emoji = default_policies()[1]
    assert store.apply(emoji).version == 1
    assert store.apply(emoji).version == 1
    changed = PolicyCreate.model_validate({**emoji.model_dump(), "max_reports_per_day": 5})
    assert store.apply(changed).version == 2


def test_budget_group_members_must_share_caps(store: PolicyStore) -> None:
    store.ensure_defaults()
    with pytest.raises(PolicyConflict, match="`max_reports_per_day`") as info:
        store.update("safari-crash-domains", PolicyUpdate(max_reports_per_day=3))
    assert info.value.field == "max_reports_per_day"
    # leaving the group is fine
    moved = store.update(
        "safari-crash-domains", PolicyUpdate(budget_group=None, max_reports_per_day=3)
    )
    assert moved.budget_group is None


def _member(name: str, group: str, cap: int) -> PolicyCreate:
    return PolicyCreate.model_validate(
        {
            "name": name,
            "mechanism": "cms",
            "k": 16,
            "m": 64,
            "epsilon_per_report": 1.0,
            "max_reports_per_day": cap,
            "budget_group": group,
        }
    )


def test_concurrent_writes_to_one_budget_group_cannot_disagree(engine: Engine) -> None:
    """30 pairs of use cases created at once in a new group each, with caps 1/day and 100/day.

    Exactly one of each pair may be stored: the group check of the second must see the first.
    Pairs run five at a time (ten connections), each pair's two writes released together.
    """
    store = PolicyStore(engine)
    outcomes: dict[str, str] = {}

    def write(name: str, group: str, cap: int, start: threading.Barrier) -> None:
        policy = _member(name, group, cap)
        start.wait(timeout=60)
        try:
            store.create(policy)
            outcomes[name] = "created"
        except PolicyConflict as exc:
            outcomes[name] = exc.field

    pairs = range(30)
    for first in range(0, len(pairs), 5):
        threads = []
        for i in pairs[first : first + 5]:
            start = threading.Barrier(2)
            for side, cap in (("low", 1), ("high", 100)):
                args = (f"{side}-{i}", f"group-{i}", cap, start)
                threads.append(threading.Thread(target=write, args=args))
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    members = store.list()
    for i in pairs:
        caps = {p.max_reports_per_day for p in members if p.budget_group == f"group-{i}"}
        assert len(caps) == 1, f"group-{i} has members with caps {sorted(caps)}"
        pair = sorted([outcomes[f"low-{i}"], outcomes[f"high-{i}"]])
        assert pair == ["created", "max_reports_per_day"], pair

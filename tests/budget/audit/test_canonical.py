"""The audit bodies formatted around encoded parts are exactly ``orjson``'s canonical JSON."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
from hypothesis import given
from hypothesis import strategies as st

from dp_governor.budget.audit.log import canonical_body, timestamp
from dp_governor.budget.gate.charge import charge_entry
from dp_governor.budget.rule.book import Terms
from dp_governor.budget.rule.decide import Decision

SORTED = orjson.OPT_SORT_KEYS
names = st.text(min_size=1, max_size=40)  # quotes, backslashes, controls, astral planes too
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@given(
    st.integers(1, 2**62),
    st.datetimes(timezones=st.just(UTC)),
    names,
    names,
    st.dictionaries(st.text(max_size=12), json_values, max_size=6),
)
def test_canonical_body_is_sorted_compact_json(
    seq: int, at: datetime, actor: str, action: str, data: dict[str, object]
) -> None:
    stamp = timestamp(at)
    expected = orjson.dumps(
        {"seq": seq, "at": stamp, "actor": actor, "action": action, "data": data}, option=SORTED
    ).decode()
    assert canonical_body(seq, stamp, actor, action, data) == expected
    encoded = orjson.dumps(data, option=SORTED).decode()
    assert canonical_body(seq, stamp, actor, action, encoded) == expected


@given(
    st.booleans(),
    st.sampled_from(["accepted", "daily_cap", "window_cap", "lifetime_cap"]),
    names,
    names,
    st.integers(1, 10**6),
    st.integers(1, 10**9),
    st.integers(0, 10**6),
    st.none() | st.integers(1, 2**62),
    st.none() | st.text("0123456789abcdef", min_size=32, max_size=32),
    st.none() | st.tuples(st.integers(1, 10**4), st.integers(1, 10**12)),
)
def test_charge_entry_data_is_the_dict_encoded(
    accepted: bool,
    reason: str,
    use_case: str,
    budget: str,
    version: int,
    eps_micro: int,
    day: int,
    charge_id: int | None,
    idempotency: str | None,
    tally: tuple[int, int] | None,
) -> None:
    terms = Terms(use_case, version, budget, eps_micro / 1e6, eps_micro, 2, 90, None, None)
    decision = Decision(
        accepted,
        reason,  # type: ignore[arg-type]  # a Reason, drawn by Hypothesis as str
        use_case,
        budget,
        version,
        eps_micro / 1e6,
        day,
        charge_id,
    )
    entry = charge_entry("0f" * 16, decision, terms, idempotency, tally)
    expected = {
        "use_case": use_case,
        "budget": budget,
        "policy_version": version,
        "epsilon_micro": eps_micro,
        "day": day,
        "accepted": accepted,
        "reason": reason,
        "charge_id": charge_id,
        "idempotency": idempotency,
        "n": None if tally is None else tally[0],
        "spent": None if tally is None else tally[1],
    }
    assert entry.actor == "device:" + "0f" * 16
    assert entry.action == "charge"
    assert entry.data == orjson.dumps(expected, option=SORTED).decode()

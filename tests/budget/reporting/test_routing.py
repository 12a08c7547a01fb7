"""The route check counts exactly the device keys that route to another shard, in any split."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dp_governor.budget.reporting.routing import RouteCheck, ShardMisrouted, shard_of

_HEX = st.text("0123456789abcdef", min_size=32, max_size=32)
_KEYS = st.lists(st.one_of(_HEX, _HEX, _HEX, st.text(min_size=1, max_size=12)), max_size=40)


def _is_hex(key: str) -> bool:
    try:
        int(key[:8], 16)
    except ValueError:
        return False
    return True


@given(_KEYS, st.integers(1, 5), st.data())
def test_the_check_counts_what_a_model_counts(
    keys: list[str], shards: int, data: st.DataObject
) -> None:
    """Against the rule applied key by key; reading the keys in two ranges and merging agrees."""
    position = data.draw(st.integers(0, shards - 1))
    whole, first, second = (RouteCheck(position, shards) for _ in range(3))
    cut = data.draw(st.integers(0, len(keys)))
    for i, key in enumerate(keys):
        whole.see(key)
        (first if i < cut else second).see(key)
    first.merge(second)
    routed = [shard_of(k, shards) for k in keys if _is_hex(k)]
    elsewhere = [s for s in routed if s != position]
    assert (whole.misrouted, whole.unroutable) == (len(elsewhere), len(keys) - len(routed))
    assert whole.example == (elsewhere[0] if elsewhere else None)
    assert first == whole
    if elsewhere or len(routed) < len(keys):
        with pytest.raises(ShardMisrouted) as refused:
            whole.refuse()
        assert refused.value.shard == position
        assert not any(k in str(refused.value) for k in keys if len(k) == 32)  # no key named
    else:
        whole.refuse()


def test_checks_of_different_shards_do_not_merge() -> None:
    with pytest.raises(ValueError, match="different shards"):
        RouteCheck(0, 2).merge(RouteCheck(1, 2))

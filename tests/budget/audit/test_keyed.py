"""The prepared-state HMAC is RFC 2104's HMAC-SHA256, for every key length."""

from __future__ import annotations

import hmac

from hypothesis import given
from hypothesis import strategies as st

from dp_governor.budget.keyed import KeyedHash


@given(st.binary(min_size=0, max_size=200), st.lists(st.binary(max_size=300), max_size=5))
def test_matches_the_standard_library(key: bytes, messages: list[bytes]) -> None:
    keyed = KeyedHash(key)
    for message in messages:  # one key, many messages: the prepared states are not consumed
        assert keyed.digest(message) == hmac.digest(key, message, "sha256")

"""Sealed inbox rows: one length per parameter set, opened only in their own row, by their key."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from dp_governor.pipeline.seal import InboxSeal, SealError, key_id
from dp_governor.policies import PolicyCreate, mechanism_for

KEY = b"seal-test-key-seal-test-key-seal-test-key"
OTHER = b"another-key-another-key-another-key-another"
MECHANISMS: dict[str, dict[str, Any]] = {
    "cms": {"mechanism": "cms", "k": 65_536, "m": 1024, "epsilon_per_report": 4.0},
    "hcms": {"mechanism": "hcms", "k": 65_536, "m": 1024, "epsilon_per_report": 4.0},
    "sfp": {
        "mechanism": "sfp",
        "k": 2048,
        "m": 1024,
        "epsilon_per_report": 4.0,
        "epsilon_word": 2.0,
        "epsilon_fragment": 2.0,
        "k_fragment": 2048,
        "m_fragment": 1024,
    },
}


def _payloads(kind: str, n: int) -> tuple[str, list[str]]:
    policy = PolicyCreate.model_validate(
        {"name": kind, "max_reports_per_day": 2, "retention_days": 30, **MECHANISMS[kind]}
    )
    mech = mechanism_for(policy)
    values = [f"w{i}" for i in range(n)]
    bodies = mech.privatize(values, rng=np.random.default_rng(7)).to_dicts()
    return mech.fingerprint.params, [
        orjson.dumps(b, option=orjson.OPT_SORT_KEYS).decode() for b in bodies
    ]


@pytest.mark.parametrize("kind", sorted(MECHANISMS))
def test_every_sealed_report_of_a_parameter_set_has_one_length(kind: str) -> None:
    """Reports whose integers differ in width (j = 7 or 65,535, a bit of -1) seal alike."""
    params, payloads = _payloads(kind, 400)
    assert len({len(p) for p in payloads}) > 1  # the clear reports do differ
    seal = InboxSeal([KEY])
    tags = [i if i % 2 else None for i in range(len(payloads))]
    rows = seal.seal_rows(
        [(kind, params, 20_000, p.encode(), tag) for p, tag in zip(payloads, tags, strict=True)]
    )
    assert len({len(sealed) for *_, sealed in rows}) == 1
    for (row_id, use_case, p, day, sealed), payload, tag in zip(rows, payloads, tags, strict=True):
        assert 0 <= row_id < 1 << 63
        assert payload.encode() not in sealed
        assert seal.open(row_id, use_case, p, day, sealed) == (payload, tag)


def test_a_sealed_report_opens_only_in_its_own_row() -> None:
    seal = InboxSeal([KEY])
    ((row_id, use_case, params, day, sealed),) = seal.seal_rows(
        [("emoji", "p" * 64, 20_000, b'{"j":1}', None)]
    )
    assert seal.open(row_id, use_case, params, day, sealed) == ('{"j":1}', None)
    for moved in [
        (row_id + 1, use_case, params, day),
        (row_id, "other", params, day),
        (row_id, use_case, "q" * 64, day),
        (row_id, use_case, params, day + 1),
    ]:
        with pytest.raises(SealError, match="altered, or moved from another row"):
            seal.open(*moved, sealed)
    flipped = bytearray(sealed)
    flipped[-1] ^= 1
    with pytest.raises(SealError, match="altered"):
        seal.open(row_id, use_case, params, day, bytes(flipped))


def test_rows_open_under_the_key_they_name_and_a_rotation_keeps_the_old_one() -> None:
    old = InboxSeal([KEY])
    ((row_id, use_case, params, day, sealed),) = old.seal_rows(
        [("emoji", "p" * 64, 20_000, b'{"j":1}', 5)]
    )
    assert sealed[1:5] == key_id(KEY)
    with pytest.raises(SealError, match=f"shuffler key {key_id(KEY).hex()}.*DPGOV_SHUFFLER_KEY"):
        InboxSeal([OTHER]).open(row_id, use_case, params, day, sealed)
    rotated = InboxSeal([OTHER, KEY])
    assert rotated.open(row_id, use_case, params, day, sealed) == ('{"j":1}', 5)
    ((_, _, _, _, new),) = rotated.seal_rows([("emoji", "p" * 64, 20_000, b'{"j":1}', 5)])
    assert new[1:5] == key_id(OTHER)  # new rows under the first key


def test_without_a_key_nothing_is_sealed_or_opened() -> None:
    empty = InboxSeal([])
    assert not empty.can_seal
    with pytest.raises(SealError, match="DPGOV_SHUFFLER_KEY_FILE"):
        empty.seal_rows([("emoji", "p" * 64, 20_000, b'{"j":1}', None)])
    ((row_id, *_, sealed),) = InboxSeal([KEY]).seal_rows(
        [("emoji", "p" * 64, 20_000, b'{"j":1}', None)]
    )
    with pytest.raises(SealError, match="does not hold"):
        empty.open(row_id, "emoji", "p" * 64, 20_000, sealed)

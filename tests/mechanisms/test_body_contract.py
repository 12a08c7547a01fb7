"""The report body is described once: the parser and the published JSON schema agree.

Each mechanism's body-schema function gives both the OpenAPI document's shape (no parameters,
``BODY_SHAPE``) and the exact schema of one parameter set (``body_schema``). ``parse_report`` is
the code that enforces it. On real reports and on random bodies near the boundaries, both ways:
every body the parser accepts satisfies both schemas, and every body the exact schema admits the
parser accepts, but for the two rules a JSON schema cannot state (a CMS row's padding bits are
zero; an integer is not written ``1.0``), which the parser alone checks.
"""

from __future__ import annotations

import base64
from typing import Any

import jsonschema_rs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_governor.mechanisms import CMS, HCMS, SFP, HashFamily, InvalidReport, Mechanism

MECHANISMS: list[Mechanism] = [
    CMS(epsilon=4.0, k=5, m=12, hash_family=HashFamily(1)),
    HCMS(epsilon=4.0, k=5, m=16, hash_family=HashFamily(1)),
    SFP(epsilon_word=2.0, epsilon_fragment=6.0, k=3, m=10, k_fragment=4, m_fragment=16),
]
IDS = ["cms", "hcms", "sfp"]


def _accepts(mech: Mechanism, body: Any) -> bool:
    try:
        mech.parse_report(body)
    except InvalidReport:
        return False
    return True


def _cms_row(k: int, m: int) -> st.SearchStrategy[Any]:
    n_bytes = (m + 7) // 8
    bits = st.one_of(
        st.binary(min_size=n_bytes, max_size=n_bytes).map(lambda b: base64.b64encode(b).decode()),
        st.binary(min_size=0, max_size=n_bytes + 2).map(lambda b: base64.b64encode(b).decode()),
        st.text(max_size=8),
        st.integers(),
    )
    j = st.one_of(st.integers(-2, k + 2), st.booleans(), st.floats(), st.text(max_size=2))
    return _object({"j": j, "bits": bits})


def _object(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Objects with each field present or missing, and sometimes one field too many."""
    present = st.fixed_dictionaries({}, optional=fields)
    full = st.fixed_dictionaries(fields)
    extra = full.map(lambda d: d | {"extra": 1})
    return st.one_of(full, full, present, extra, st.none(), st.lists(st.integers(), max_size=2))


def _bodies(mech: Mechanism) -> st.SearchStrategy[Any]:
    if isinstance(mech, CMS):
        return _cms_row(mech.k, mech.m)
    if isinstance(mech, HCMS):
        return _object(
            {
                "j": st.integers(-2, mech.k + 2),
                "l": st.integers(-2, mech.m + 2),
                "bit": st.one_of(st.integers(-2, 2), st.booleans(), st.floats(-1, 1)),
            }
        )
    assert isinstance(mech, SFP)
    return _object(
        {
            "word": _cms_row(mech.k, mech.m),
            "fragment": _cms_row(mech.k_fragment, mech.m_fragment),
            "position": st.integers(-2, 12),
        }
    )


@pytest.mark.parametrize("mech", MECHANISMS, ids=IDS)
def test_real_reports_satisfy_both_schemas(mech: Mechanism) -> None:
    exact = jsonschema_rs.validator_for(mech.body_schema())
    published = jsonschema_rs.validator_for(mech.report_schema())
    shape = jsonschema_rs.validator_for(type(mech).BODY_SHAPE)
    reports = mech.privatize(["a", "b", "c"] * 20, rng=np.random.default_rng(5))
    for body in reports.to_dicts():
        assert _accepts(mech, body)
        assert exact.is_valid(body) and shape.is_valid(body)
        # the published schema requires the family, as the server does by default
        assert published.is_valid(body | {"family": mech.fingerprint.family_id})
        assert not published.is_valid(body)
        assert not published.is_valid(body | {"family": "f1-0000000000000000"})


def _schema_cannot_say(mech: Mechanism, body: Any) -> bool:
    """What a JSON schema cannot state: zero padding bits, and an integer written as ``1.0``.

    JSON Schema counts ``1.0`` as an integer; the parser, like JSON's own grammar, does not.
    """

    def floats(value: Any) -> bool:
        if isinstance(value, dict):
            return any(floats(v) for v in value.values())
        return isinstance(value, float)

    def padded(row: Any, m: int) -> bool:
        if not isinstance(row, dict) or not isinstance(row.get("bits"), str):
            return False
        try:
            raw = base64.b64decode(row["bits"], validate=True)
        except ValueError:
            return False
        return bool(raw) and m % 8 != 0 and bool(raw[-1] & ((1 << (8 - m % 8)) - 1))

    rows: list[tuple[Any, int]] = []
    if isinstance(mech, CMS):
        rows = [(body, mech.m)]
    elif isinstance(mech, SFP) and isinstance(body, dict):
        rows = [(body.get("word"), mech.m), (body.get("fragment"), mech.m_fragment)]
    return floats(body) or any(padded(row, m) for row, m in rows)


@pytest.mark.parametrize("mech", MECHANISMS, ids=IDS)
def test_the_parser_and_the_schema_agree_on_any_body(mech: Mechanism) -> None:
    """Accepted iff the exact schema holds, but for what a schema cannot say."""
    exact = jsonschema_rs.validator_for(mech.body_schema())
    shape = jsonschema_rs.validator_for(type(mech).BODY_SHAPE)

    @settings(max_examples=300, deadline=None)
    @given(body=_bodies(mech))
    def check(body: Any) -> None:
        accepted = _accepts(mech, body)
        if accepted:
            assert exact.is_valid(body) and shape.is_valid(body), body
        elif exact.is_valid(body):
            assert _schema_cannot_say(mech, body), body

    check()


def test_padding_bits_are_the_parsers_alone() -> None:
    """``m = 12``: the last byte's low four bits are padding, zero in every valid row."""
    cms = MECHANISMS[0]
    body = {"j": 0, "bits": base64.b64encode(bytes([0xFF, 0xF1])).decode()}
    assert jsonschema_rs.validator_for(cms.body_schema()).is_valid(body)
    with pytest.raises(InvalidReport, match="padding"):
        cms.parse_report(body)


@pytest.mark.parametrize("mech", MECHANISMS, ids=IDS)
def test_the_shape_is_the_exact_schema_without_its_bounds(mech: Mechanism) -> None:
    """One description: dropping the parameter bounds from the exact schema gives the shape."""

    def unbounded(schema: Any) -> Any:
        if isinstance(schema, dict):
            return {
                key: unbounded(value)
                for key, value in schema.items()
                # the exact pattern is the shape's base64 with the padding its byte count has
                if key not in {"maximum", "minLength", "maxLength", "description", "pattern"}
            }
        return schema

    assert unbounded(mech.body_schema()) == unbounded(type(mech).BODY_SHAPE)

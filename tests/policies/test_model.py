"""Policy validation, Apple's defaults, and policy files."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import UnionType
from typing import Any, get_args, get_origin

import pytest
import tomli_w
import yaml
from pydantic import ValidationError

from dp_governor.mechanisms import CMS, HCMS, SFP
from dp_governor.policies import (
    PolicyBase,
    PolicyCreate,
    PolicyFileError,
    PolicyUpdate,
    default_policies,
    dump_policies,
    load_policies,
    mechanism_for,
)
from dp_governor.policies._files import load_device_budget
from dp_governor.policies.device import DeviceBudgetCreate
from dp_governor.policies.model import MAX_SKETCH_BYTES, sketch_bytes, to_micro

DUPLICATE = (
    "  - {name: a, mechanism: cms, k: 4, m: 8, epsilon_per_report: 1.0, max_reports_per_day: 1}\n"
)
BASE: dict[str, Any] = {
    "name": "emoji",
    "mechanism": "cms",
    "k": 65536,
    "m": 1024,
    "epsilon_per_report": 4.0,
    "max_reports_per_day": 1,
}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"epsilon_per_report": float("nan")}, "epsilon_per_report"),
        ({"epsilon_per_report": float("inf")}, "epsilon_per_report"),
        ({"epsilon_per_report": -float("inf")}, "epsilon_per_report"),
        ({"epsilon_per_report": 1e309}, "epsilon_per_report"),
        ({"epsilon_per_report": 0}, "epsilon_per_report"),
        ({"epsilon_per_report": -1}, "epsilon_per_report"),
        ({"epsilon_per_report": "4"}, "epsilon_per_report"),
        ({"epsilon_per_report": True}, "epsilon_per_report"),
        ({"epsilon_per_report": 20.5}, "epsilon_per_report"),
        ({"epsilon_per_report": 0.1234567}, "epsilon_per_report"),
        ({"k": 0}, "k"),
        ({"k": "4"}, "k"),
        ({"k": 4.0}, "k"),
        ({"max_reports_per_day": 0}, "max_reports_per_day"),
        ({"retention_days": 0}, "retention_days"),
        ({"group_size": 0}, "group_size"),
        ({"delta": 0}, "delta"),
        ({"delta": 1}, "delta"),
        ({"name": "Emoji"}, "name"),
        ({"name": "-x"}, "name"),
        ({"budget_group": "Safari Domains"}, "budget_group"),
        ({"hash_seed": "XYZ"}, "hash_seed"),
        ({"mechanism": "olh"}, "mechanism"),
        ({"surprise": 1}, "surprise"),
        ({"mechanism": "hcms", "m": 1000}, "`m` must be a power of 2"),
        ({"m": 1 << 20}, "`m` must be at most 65536"),
        ({"window_epsilon_cap": 1.0}, "`window_epsilon_cap` must be at least"),
        ({"lifetime_epsilon_cap": 3.0}, "`lifetime_epsilon_cap` must be at least"),
        ({"k_fragment": 16}, "`k_fragment` is only for mechanism sfp"),
        ({"window_filter_epsilon": 8.0}, "`window_filter_epsilon` and `window_filter_delta`"),
        ({"lifetime_filter_delta": 1e-9}, "`lifetime_filter_epsilon` and `lifetime_filter_delta`"),
        ({"window_filter_epsilon": 8.0, "window_filter_delta": 0.0}, "window_filter_delta"),
        ({"lifetime_filter_epsilon": 8.0, "lifetime_filter_delta": 1.0}, "lifetime_filter_delta"),
        ({"window_filter_epsilon": 0.0, "window_filter_delta": 1e-9}, "window_filter_epsilon"),
        ({"lifetime_filter_epsilon": -1.0, "lifetime_filter_delta": 1e-9}, "lifetime_filter_eps"),
        ({"window_filter_epsilon": 8.0000001, "window_filter_delta": 1e-9}, "window_filter_eps"),
        (
            {"lifetime_filter_epsilon": 3.0, "lifetime_filter_delta": 1e-9},
            "`lifetime_filter_epsilon` must be at least `epsilon_per_report` x `group_size`",
        ),
        (
            {"window_filter_epsilon": 6.0, "window_filter_delta": 1e-9, "group_size": 2},
            "`window_filter_epsilon` must be at least `epsilon_per_report` x `group_size`",
        ),
        ({"mechanism": "sfp"}, "`k_fragment` is required"),
    ],
)
def test_bad_policies_name_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        PolicyCreate.model_validate({**BASE, **change})
    text = str(info.value)
    assert field in text


def test_sfp_split_must_add_up() -> None:
    sfp = {
        **BASE,
        "mechanism": "sfp",
        "k_fragment": 2048,
        "m_fragment": 1024,
        "epsilon_per_report": 8.0,
        "epsilon_word": 2.0,
        "epsilon_fragment": 6.0,
    }
    assert PolicyCreate.model_validate(sfp).epsilon_fragment == 6.0
    with pytest.raises(ValidationError, match="must equal `epsilon_per_report`"):
        PolicyCreate.model_validate({**sfp, "epsilon_fragment": 5.0})
    # exact in micro-epsilon: 0.1 + 0.2 == 0.3 here, unlike floats
    ok = {**sfp, "epsilon_per_report": 0.3, "epsilon_word": 0.1, "epsilon_fragment": 0.2}
    assert PolicyCreate.model_validate(ok).epsilon_per_report == 0.3


@pytest.mark.parametrize(
    ("change", "size", "fields"),
    [
        # the policy: 2^44 cells, 128 TiB at 8 bytes a cell
        ({"mechanism": "hcms", "k": 1 << 20, "m": 1 << 24}, 1 << 47, "`k` x `m`"),
        ({"k": (1 << 14) + 1, "m": 1 << 13}, 8 * ((1 << 14) + 1) * (1 << 13), "`k` x `m`"),
        (
            {
                "mechanism": "sfp",
                "k": 2048,
                "m": 1024,
                "k_fragment": 1 << 15,
                "m_fragment": 1024,
                "epsilon_per_report": 8.0,
                "epsilon_word": 2.0,
                "epsilon_fragment": 6.0,
            },
            8 * (2048 * 1024 + 5 * (1 << 15) * 1024),
            "`k` x `m` + 5 x `k_fragment` x `m_fragment`",
        ),
    ],
)
def test_sketches_over_the_memory_bound_are_refused(
    change: dict[str, Any], size: int, fields: str
) -> None:
    with pytest.raises(ValidationError) as info:
        PolicyCreate.model_validate({**BASE, **change})
    text = str(info.value)
    assert fields in text and f"needs {size:,} bytes" in text and f"{MAX_SKETCH_BYTES:,}" in text
    # an update that grows a valid policy past the bound is refused the same way
    with pytest.raises(ValidationError, match="over the limit"):
        PolicyUpdate(k=1 << 20).apply_to(PolicyCreate.model_validate(BASE))


def test_the_memory_bound_is_inclusive() -> None:
    at = PolicyCreate.model_validate({**BASE, "mechanism": "hcms", "k": 1 << 13, "m": 1 << 14})
    assert sketch_bytes(at) == MAX_SKETCH_BYTES == 1 << 30
    assert all(sketch_bytes(p) <= MAX_SKETCH_BYTES // 2 for p in default_policies())


def test_micro_epsilon_is_exact() -> None:
    assert to_micro(0.1) * 3 == to_micro(0.3)
    assert to_micro(2) == 2_000_000
    with pytest.raises(ValueError, match=r"multiple of 0\.000001"):
        to_micro(2.0000001)


def test_apples_defaults() -> None:
    by_name = {p.name: p for p in default_policies()}
    expected = {
        "quicktype": ("sfp", 8.0, 2),
        "emoji": ("cms", 4.0, 1),
        "lookup-hints": ("cms", 4.0, 2),
        "safari-energy-domains": ("hcms", 4.0, 2),
        "safari-crash-domains": ("hcms", 4.0, 2),
        "safari-autoplay": ("cms", 8.0, 2),
        "health-types": ("cms", 2.0, 1),
    }
    assert {
        n: (p.mechanism, p.epsilon_per_report, p.max_reports_per_day) for n, p in by_name.items()
    } == expected
    assert all(p.retention_days == 90 and p.group_size == 1 for p in by_name.values())
    q = by_name["quicktype"]
    assert (q.epsilon_word, q.epsilon_fragment, q.k, q.m, q.k_fragment, q.m_fragment) == (
        2.0,
        6.0,
        2048,
        1024,
        2048,
        1024,
    )
    assert (by_name["emoji"].k, by_name["emoji"].m) == (65536, 1024)
    assert (by_name["health-types"].k, by_name["health-types"].m) == (65536, 256)
    safari = by_name["safari-energy-domains"]
    assert (safari.k, safari.m, safari.budget_group) == (1024, 32768, "safari-domains")
    assert by_name["safari-crash-domains"].budget_group == "safari-domains"


def test_mechanism_for_builds_the_prescribed_mechanism() -> None:
    by_name = {p.name: p for p in default_policies()}
    assert isinstance(mechanism_for(by_name["emoji"]), CMS)
    assert isinstance(mechanism_for(by_name["safari-crash-domains"]), HCMS)
    sfp = mechanism_for(by_name["quicktype"])
    assert isinstance(sfp, SFP) and sfp.epsilon == 8.0
    # the two Safari use cases hash differently (their own seeds)
    energy = mechanism_for(by_name["safari-energy-domains"])
    crash = mechanism_for(by_name["safari-crash-domains"])
    assert energy.hash_family != crash.hash_family


def test_update_merges_and_revalidates() -> None:
    base = PolicyCreate.model_validate(BASE)
    assert PolicyUpdate(max_reports_per_day=3).apply_to(base).max_reports_per_day == 3
    with pytest.raises(ValidationError, match="power of 2"):
        PolicyUpdate(mechanism="hcms", m=1000).apply_to(base)
    with pytest.raises(ValidationError):
        PolicyUpdate.model_validate({"name": "renamed"})


@pytest.mark.parametrize("fmt", ["yaml", "toml"])
def test_files_round_trip(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"policies.{fmt}"
    path.write_text(dump_policies(default_policies(), fmt), encoding="utf-8")
    loaded = load_policies(path)
    assert [p.model_dump() for p in loaded] == [p.model_dump() for p in default_policies()]


@pytest.mark.parametrize("fmt", ["yaml", "toml"])
def test_filter_targets_round_trip_through_files(tmp_path: Path, fmt: str) -> None:
    policy = PolicyCreate.model_validate(
        {
            **BASE,
            "epsilon_per_report": 0.05,
            "window_filter_epsilon": 4.0,
            "window_filter_delta": 1e-9,
            "lifetime_filter_epsilon": 40.0,
            "lifetime_filter_delta": 1e-6,
        }
    )
    path = tmp_path / f"policies.{fmt}"
    path.write_text(dump_policies([policy], fmt), encoding="utf-8")
    assert load_policies(path) == [policy]
    # a file must state every field: one without the filter targets is incomplete
    text = path.read_text(encoding="utf-8")
    path.write_text(
        "\n".join(x for x in text.splitlines() if "window_filter_delta" not in x), "utf-8"
    )
    with pytest.raises(PolicyFileError, match="window_filter_delta`: missing"):
        load_policies(path)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("p.yaml", "policies: [", "p.yaml:1:12: not valid YAML: expected the node content"),
        ("p.toml", "policies = [", "p.toml:1:13: not valid TOML: Invalid value"),
        ("p.toml", "[x]\na = 1\na = 2\n", "p.toml:3:6: not valid TOML: Cannot overwrite a value"),
        ("p.yaml", "a: \x07", "p.yaml:1:4: not valid YAML: unacceptable character #x0007"),
        ("p.yaml", "rules: []", "exactly one key, `policies`, with a list (and may hold"),
        ("p.yaml", "policies: null", "; `policies` is null"),
        ("p.json", "{}", "p.json: a policy file's name must end in"),
        ("p.yaml", "policies:\n  - name: x\n    mechanism: cms", "policies[0] `k`"),
        (
            "p.yaml",
            "policies:\n" + DUPLICATE + DUPLICATE,
            "appears twice",
        ),
    ],
)
def test_bad_files(tmp_path: Path, name: str, content: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(PolicyFileError) as refused:
        load_policies(path)
    said = str(refused.value)
    assert said.startswith(str(path)) and message in said and "\n" not in said, said


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError, match="cannot read"):
        load_policies(tmp_path / "absent.yaml")


def _float_fields(model: type[Any]) -> list[str]:
    """The fields of a model that take a float (alone or beside ``None``)."""
    return [
        name
        for name, f in model.model_fields.items()
        if f.annotation is float
        or (get_origin(f.annotation) is UnionType and float in get_args(f.annotation))
    ]


@pytest.mark.parametrize("fmt", ["yaml", "toml"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_every_float_field_of_a_file_refuses_nan_and_inf_in_the_projects_words(
    tmp_path: Path, fmt: str, value: float
) -> None:
    """Every float field of a policy or ``device_budget`` refuses NaN and infinities in a file.

    In the HTTP routes' words, ``must be a finite number``, naming the field.
    """
    fields = _float_fields(PolicyBase)
    assert {"epsilon_per_report", "window_filter_delta"} <= set(fields)
    loads = yaml.safe_load if fmt == "yaml" else tomllib.loads
    policies = [p for p in default_policies() if p.mechanism == "sfp"]
    base = loads(dump_policies(policies[:1], fmt))["policies"][0]
    dump = yaml.safe_dump if fmt == "yaml" else tomli_w.dumps
    path = tmp_path / f"p.{fmt}"
    for field in fields:
        item = {**base, field: value}
        item["unset"] = [x for x in item.get("unset", []) if x != field]
        if fmt == "yaml":
            item.pop("unset")
        path.write_text(dump({"policies": [item]}), encoding="utf-8")
        with pytest.raises(PolicyFileError) as refused:
            load_policies(path)
        wanted = f"policies[0] `{field}`: must be a finite number, got {value!r}"
        assert wanted in str(refused.value), (field, str(refused.value))
    for field in [*_float_fields(DeviceBudgetCreate), "quotas.emoji"]:
        name, _, key = field.partition(".")
        budget = {name: {key: value} if key else value}
        data = {"policies": [base], "device_budget": budget}
        path.write_text(dump(data), encoding="utf-8")
        with pytest.raises(PolicyFileError) as refused:
            load_device_budget(path)
        wanted = f"device_budget `{field}`: must be a finite number, got {value!r}"
        assert wanted in str(refused.value), (field, str(refused.value))


# One bad value per field of a policy and of a device-wide budget: out of its set, type or range.
# Every field is listed (checked below), so a field added to either model needs one here.
BAD_POLICY_VALUES: dict[str, Any] = {
    "name": "Emoji",
    "description": 12,
    "mechanism": "nope",
    "k": 0,
    "m": 1,
    "k_fragment": 0,
    "m_fragment": 1 << 17,
    "epsilon_per_report": 0.0,
    "epsilon_word": 20.5,
    "epsilon_fragment": -1.0,
    "max_reports_per_day": 1001,
    "retention_days": "90",
    "group_size": 0,
    "publish_threshold": -1.0,
    "min_batch_devices": 0,
    "window_epsilon_cap": 0.0,
    "lifetime_epsilon_cap": 2e9,
    "window_filter_epsilon": -4.0,
    "window_filter_delta": 1.0,
    "lifetime_filter_epsilon": 0.0,
    "lifetime_filter_delta": 0.0,
    "delta": 1.5,
    "budget_group": "Safari Domains",
    "hash_seed": "XYZ",
}
BAD_DEVICE_VALUES: dict[str, Any] = {
    "epsilon_per_day": 0.0,
    "window_days": 0,
    "window_epsilon": -1.0,
    "lifetime_epsilon": 2e9,
    "window_filter_epsilon": 0.0,
    "window_filter_delta": 1.0,
    "lifetime_filter_epsilon": -2.0,
    "lifetime_filter_delta": 0.0,
    "quotas": {"emoji": 1.5},
}


def test_every_field_has_a_bad_value() -> None:
    assert set(BAD_POLICY_VALUES) == set(PolicyBase.model_fields)
    assert set(BAD_DEVICE_VALUES) == set(DeviceBudgetCreate.model_fields)


@pytest.mark.parametrize("fmt", ["yaml", "toml"])
def test_a_files_bad_value_is_named_with_its_field_for_every_field(
    tmp_path: Path, fmt: str
) -> None:
    """Each field's bad value: the message names the field and the value (and what is allowed)."""
    loads = yaml.safe_load if fmt == "yaml" else tomllib.loads
    dump = yaml.safe_dump if fmt == "yaml" else tomli_w.dumps
    sfp = [p for p in default_policies() if p.mechanism == "sfp"]  # every field given
    base = loads(dump_policies(sfp[:1], fmt))["policies"][0]
    path = tmp_path / f"p.{fmt}"
    for field, value in BAD_POLICY_VALUES.items():
        item = {**base, field: value}
        item["unset"] = [x for x in item.get("unset", []) if x != field]
        if not item["unset"]:
            item.pop("unset")
        path.write_text(dump({"policies": [item]}), encoding="utf-8")
        with pytest.raises(PolicyFileError) as refused:
            load_policies(path)
        message = str(refused.value)
        assert f"policies[0] `{field}`: " in message and repr(value) in message, message
    for field, value in BAD_DEVICE_VALUES.items():
        path.write_text(dump({"policies": [base], "device_budget": {field: value}}), "utf-8")
        with pytest.raises(PolicyFileError) as refused:
            load_device_budget(path)
        message = str(refused.value)
        shown = repr(value["emoji"]) if field == "quotas" else repr(value)
        assert f"device_budget `{field}`: " in message and shown in message, message


def test_an_unknown_mechanism_is_named_beside_the_missing_fields(tmp_path: Path) -> None:
    """The reported file: a bad ``mechanism`` and fields left out, every problem at once."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"policies": [{**BASE, "mechanism": "nope"}]}), "utf-8")
    with pytest.raises(PolicyFileError) as refused:
        load_policies(path)
    message = str(refused.value)
    assert "policies[0] `mechanism`: must be one of 'cms', 'hcms' or 'sfp', got 'nope'" in message
    assert "policies[0] `retention_days`: missing" in message
    assert "`policy`" not in message  # no cross-field rule judged on defaults

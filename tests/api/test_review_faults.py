"""Faults a new user's review found, each fixed as a rule and tested beyond the case reported.

Float parameters refuse ``nan`` and ``inf`` as not finite (every one the API declares), a 401
that names a parameter carries it as ``field`` and the client exposes it, a client's day
parameter takes a date or ``YYYY-MM-DD`` and names itself otherwise, a witness quorum no
checkpoint could meet is refused naming ``quorum``, a removed setting warns, and a policy's bad
value is named beside its field (every field).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, SecretStr
from typer.testing import CliRunner

from dp_governor.api.app import create_app
from dp_governor.api.cli import app as cli
from dp_governor.api.client import Client, Unauthorized, verify_record
from dp_governor.api.client._calls import iso_day
from dp_governor.api.schemas import DeviceRecord, GroupTerms
from dp_governor.api.settings import Settings
from dp_governor.budget import FixedClock
from dp_governor.mechanisms.signed_note import check_quorum
from dp_governor.policies import PolicyUpdate
from tests.live import ADMIN_TOKEN, serve
from tests.policies.test_model import BAD_POLICY_VALUES

NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
NOT_FINITE = ("nan", "NaN", "inf", "-inf", "Infinity", "-Infinity")
VECTORS = Path(__file__).resolve().parents[2] / "docs" / "vectors" / "tlog.json"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'service.sqlite'}",
        secret_file=tmp_path / "secret",
        audit_key_file=tmp_path / "audit.key",
        shuffler_key_file=tmp_path / "shuffler.key",
        admin_token=SecretStr(ADMIN_TOKEN),
        scheduler=False,
    )
    with TestClient(create_app(settings, clock=FixedClock(NOW))) as c:
        yield c


def _is_number(schema: dict[str, Any]) -> bool:
    kinds = [schema, *schema.get("anyOf", [])]
    return any(k.get("type") == "number" for k in kinds)


def _float_parameters(openapi: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Every float query parameter the API declares: ``(method, path, name)``."""
    found = []
    for path, operations in openapi["paths"].items():
        for method, operation in operations.items():
            for param in operation.get("parameters", []):
                if param["in"] == "query" and _is_number(param["schema"]):
                    found.append((method, path, param["name"]))
    return found


def test_every_float_parameter_refuses_nan_and_inf_as_not_finite(client: TestClient) -> None:
    found = _float_parameters(client.app.openapi())  # type: ignore[attr-defined]
    names = {(path, name) for _, path, name in found}
    known = {("/v1/audit/effective-epsilon", "delta"), ("/v1/admin/jobs/{job}:run", "wait")}
    assert known <= names
    for method, path, name in found:
        url = path.replace("{job}", "checkpoint").replace("{name}", "emoji")
        for value in NOT_FINITE:
            answer = client.request(method.upper(), url, params={name: value}, headers=ADMIN)
            assert answer.status_code == 422, (path, name, value, answer.text)
            [error] = answer.json()["detail"]
            assert error["field"] == f"query.{name}", error  # as every query error names it
            assert error["msg"] == f"must be a finite number, got {value!r}", error
    too_large = client.get("/v1/audit/effective-epsilon", params={"delta": 2}, headers=ADMIN)
    assert too_large.status_code == 422 and "less than 1" in too_large.text  # bounds unchanged


def _number_fields(model: type[BaseModel]) -> list[str]:
    """The fields of ``model`` whose JSON schema is (or may be) a number."""
    props = model.model_json_schema()["properties"]
    return sorted(name for name, schema in props.items() if _is_number(schema))


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_every_float_body_field_refuses_nan_and_inf_as_not_finite(
    client: TestClient, value: str
) -> None:
    """Policy changes and budget-group terms: JSON's NaN literal, as Python's parser reads it."""
    targets = [
        ("/v1/use-cases/emoji/what-if", _number_fields(PolicyUpdate)),
        ("/v1/budget-groups/shared/what-if", _number_fields(GroupTerms)),
        ("/v1/budget-groups/shared", _number_fields(GroupTerms)),
    ]
    assert len(targets[0][1]) >= 8 and "delta" in targets[0][1]
    for path, fields in targets:
        method = "PUT" if path.endswith("shared") else "POST"
        for field in fields:
            body = f'{{"{field}": {value}}}'
            headers = {**ADMIN, "content-type": "application/json"}
            answer = client.request(method, path, content=body, headers=headers)
            assert answer.status_code == 422, (path, field, answer.text)
            errors = answer.json()["detail"]
            wanted = {"field": field, "msg": f"must be a finite number, got {float(value)!r}"}
            assert any(wanted.items() <= e.items() for e in errors), (path, field, errors)


def test_every_policy_fields_bad_value_is_named_in_the_422(client: TestClient) -> None:
    """``PUT /v1/use-cases/emoji``: each field's bad value named beside the field, in the body."""
    base = {"mechanism": "cms", "k": 4, "m": 64, "epsilon_per_report": 1.0}
    base["max_reports_per_day"] = 1
    for field, value in BAD_POLICY_VALUES.items():
        if field == "name":  # the path's use case: refused as the path's (a 422 naming `name`)
            continue
        body = {**base, field: value}
        answer = client.put("/v1/use-cases/emoji", json=body, headers=ADMIN)
        assert answer.status_code == 422, (field, answer.text)
        [error] = answer.json()["detail"]
        assert error["field"] == field and repr(value) in error["msg"], (field, error)
    answer = client.put("/v1/use-cases/emoji", json={**base, "mechanism": "nope"}, headers=ADMIN)
    wanted = "must be one of 'cms', 'hcms' or 'sfp', got 'nope'"
    assert answer.json()["detail"] == [
        {"loc": ["mechanism"], "field": "mechanism", "msg": wanted, "type": "literal_error"}
    ]


def test_a_401_naming_delta_carries_the_field_and_the_client_exposes_it(tmp_path: Path) -> None:
    with serve(tmp_path) as served:
        with Client(served.base) as anonymous:
            with pytest.raises(Unauthorized) as refused:
                anonymous.effective_epsilon(delta=1e-6)
            assert refused.value.field == "delta" and refused.value.status == 401
        for path, field in (
            ("/v1/devices/device-1/tlog?day=2026-11-22", "X-Device-Id"),
            ("/v1/admin/jobs/checkpoint:run", "Authorization"),
        ):  # every 401 that names a header carries it too
            method = "POST" if "jobs" in path else "GET"
            answer = httpx.request(method, served.base + path, timeout=60)
            assert answer.status_code == 401 and answer.json()["field"] == field, answer.text
        with Client(served.base) as device:
            record = device.tlog_record("device-1", "2026-11-22")  # a string, as a date
            assert record == device.tlog_record("device-1", date(2026, 11, 22))
            for wrong, kind in (("22/11/2026", ValueError), (20261122, TypeError)):
                with pytest.raises(kind, match="`day`"):
                    device.tlog_record("device-1", wrong)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="`day` must be a date, not a datetime"):
                device.tlog_record("device-1", NOW)


def _parses(text: str) -> bool:
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return True


@given(st.text(max_size=12) | st.dates().map(date.isoformat) | st.just("2026-W01-1"))
def test_a_day_parameter_is_an_iso_day_or_an_error_naming_it(text: str) -> None:
    try:
        wire = iso_day(text, "day")
    except ValueError as exc:
        assert "`day`" in str(exc)
        assert not _parses(text) or date.fromisoformat(text).isoformat() != text
    else:
        assert wire == text == date.fromisoformat(text).isoformat()


@given(st.integers(-3, 8), st.integers(0, 5))
def test_a_quorum_is_0_without_witnesses_else_1_to_their_number(quorum: int, n: int) -> None:
    vectors = json.loads(VECTORS.read_text())
    record = DeviceRecord.model_validate(vectors["cases"][0]["record"])
    witnesses = [vectors["witness_key"]] * n
    meetable = quorum == 0 if n == 0 else 1 <= quorum <= n
    if meetable:
        assert check_quorum(quorum, n) == quorum
        if n <= 1:  # the vectors' one witness cosigned: met, or nothing asked
            assert verify_record(record, vectors["log_key"], witnesses=witnesses, quorum=quorum).ok
        return
    with pytest.raises(ValueError, match="`quorum`"):
        check_quorum(quorum, n)
    with pytest.raises(ValueError, match="`quorum`"):
        verify_record(record, vectors["log_key"], witnesses=witnesses, quorum=quorum)


def test_the_recompute_refuses_a_quorum_it_could_never_meet(tmp_path: Path) -> None:
    vectors = json.loads(VECTORS.read_text())
    for quorum, witnesses in (("-1", []), ("1", []), ("2", [vectors["witness_key"]])):
        args = ["audit", "recompute", "--log", str(tmp_path / "none.json"), "--quorum", quorum]
        for w in witnesses:
            args += ["--witness", w]
        done = CliRunner().invoke(cli, args)
        assert done.exit_code == 2, done.output
        assert "`quorum`" in done.output and "Traceback" not in done.output


def _float_options() -> list[tuple[list[str], str]]:
    """Every option of every ``dpgov`` command declared a float: the command path, the flag."""
    found: list[tuple[list[str], str]] = []

    def walk(command: Any, path: list[str]) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])
        for param in getattr(command, "params", []):
            annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
            if param.param_type_name == "option" and annotation is float:
                found.append((path, param.opts[0]))

    walk(typer.main.get_command(cli), [])
    return found


def test_every_float_option_of_the_cli_refuses_nan_and_inf() -> None:
    found = _float_options()
    assert {" ".join(p) for p, _ in found} >= {"audit report", "simulate"}
    for path, flag in found:
        for value in ("nan", "inf", "-inf"):
            done = CliRunner().invoke(cli, [*path, flag, value])
            assert done.exit_code == 2, (path, flag, done.output)
            assert f"must be a finite number, got {value!r}" in done.output, done.output


def test_a_removed_setting_warns_and_the_command_runs(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("DPGOV_")}
    env["DPGOV_VERIFY_CACHE_SECONDS"] = "60"
    env["DPGOV_DATABASE_URL"] = f"sqlite:///{tmp_path / 'x.sqlite'}"
    env["DPGOV_SECRETS_DIR"] = str(tmp_path / "keys")
    done = subprocess.run(
        [sys.executable, "-m", "dp_governor.api.cli", "db", "init"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "Warning: DPGOV_VERIFY_CACHE_SECONDS is no longer used and has no effect" in done.stderr
    assert "verify_cache_seconds" not in Settings.model_fields

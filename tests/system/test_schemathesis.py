"""schemathesis against the app's own OpenAPI schema, over real HTTP: no 5xx, answers conform.

Every operation gets positive and negative data ("mode = all"): 100 examples each with admin
and device credentials, 30 more with device credentials only, and a stateful run that chains
operations through the links schemathesis infers. Cross-field rules a JSON schema cannot state
(an SFP policy's second epsilon, a budget group's shared caps) answer 422 to data the schema
allows, hence 422 among the statuses accepted for positive data; a batch over the item limit
answers 413, hence 413 among those for negative data. A relay batch answers 200 with each
item's own status, so a batch whose items break the item schema (a too-long idempotency key)
is a 200 holding those items' 422s: 200 is among the batch's statuses for negative data.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

schemathesis = pytest.importorskip("schemathesis")

import uvicorn  # noqa: E402
from schemathesis.config import SchemathesisConfig  # noqa: E402

from dp_governor.api.app import create_app  # noqa: E402
from dp_governor.api.server import bind_port  # noqa: E402
from dp_governor.api.settings import Settings  # noqa: E402

TOKEN = "schemathesis-admin-token-schemathesis"
DEVICE = {"X-Device-Id": "st-device"}
CONFIG = """
[generation]
mode = "all"
max-examples = {examples}

[checks.negative_data_rejection]
expected-statuses = [400, 401, 403, 404, 405, 409, 413, 422, 429]

[checks.positive_data_acceptance]
expected-statuses = ["2xx", 401, 403, 404, 409, 422, 429]

{auth}
[[operations]]
include-path = "/v1/use-cases/{{name}}/reports:batch"
checks.negative_data_rejection.expected-statuses = [200, 400, 401, 403, 404, 409, 413, 422, 429]
"""


def _serve(tmp: Path) -> str:
    settings = Settings(
        database_url=f"sqlite:///{tmp / 'st.sqlite'}",
        secret_file=tmp / "secret",
        audit_key_file=tmp / "audit.key",
        admin_token=SecretStr(TOKEN),
        scheduler=False,
        device_rate_per_minute=1_000_000,
        admin_failures_per_minute=1_000_000,
        report_cache_seconds=0,
    )
    sock = bind_port("127.0.0.1", 0)  # bound here and handed over: no race for the port
    port = int(sock.getsockname()[1])
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 300  # generous: a busy machine starts slowly
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "the server did not start"
    base = f"http://127.0.0.1:{port}"
    _wait_for_figures(base, deadline)
    return base


def _wait_for_figures(base: str, deadline: float) -> None:
    """Until the first audit figures are stored: before, their routes answer 503 (by design).

    The refresher computes them in the job worker, a process the server starts on demand; the
    fuzzing checks that no route answers 5xx, which a route asked before then would.
    """
    import httpx

    url = f"{base}/v1/audit/use-cases/emoji/distribution"
    while (status := httpx.get(url, headers=DEVICE, timeout=60).status_code) == 503:
        assert time.monotonic() < deadline, "the audit figures were never computed"
        time.sleep(0.1)
    assert status == 200, status


def _tmp(name: str) -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix=f"dpgov-st-{name}-"))


BASE = _serve(_tmp("server"))


def _schema(examples: int, *, admin: bool) -> Any:
    """The schema to test; ``admin``: the ``adminToken`` scheme is given the token.

    The token goes through schemathesis' auth settings rather than as a fixed header, so
    that negative cases which leave the scheme's header out really send no token.
    """
    auth = f'[auth.openapi.adminToken]\nbearer = "{TOKEN}"\n' if admin else ""
    config = SchemathesisConfig.from_str(CONFIG.format(examples=examples, auth=auth))
    return schemathesis.openapi.from_url(f"{BASE}/openapi.json", config=config)


admin_schema = _schema(100, admin=True)
device_schema = _schema(30, admin=False)


@admin_schema.parametrize()  # type: ignore[untyped-decorator]
def test_every_operation_with_admin_and_device_credentials(case: Any) -> None:
    case.call_and_validate(headers=DEVICE)


@device_schema.parametrize()  # type: ignore[untyped-decorator]
def test_every_operation_with_device_credentials_only(case: Any) -> None:
    case.call_and_validate(headers=DEVICE)


Workflow = _schema(30, admin=True).as_state_machine()


class TestStateful(Workflow.TestCase):  # type: ignore[name-defined,misc]
    """Chains of operations (create a policy, read it, submit, read budgets...)."""

    def get_call_kwargs(self, case: Any) -> dict[str, Any]:
        return {"headers": DEVICE}

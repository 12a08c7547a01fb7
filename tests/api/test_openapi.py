"""The OpenAPI reference: examples and descriptions everywhere, the admin lock, offline /docs.

The examples are checked against the document's own schemas (``jsonschema_rs``, with the
components resolved), so an example cannot drift from the schema the routes answer with.
``/docs`` is fetched over real HTTP: every asset it names is local and answers 200.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from dp_governor.api.app import create_app
from dp_governor.api.settings import Settings
from tests.live import serve

jsonschema_rs = pytest.importorskip("jsonschema_rs")  # comes with schemathesis (the test extra)

ERRORS = ("401", "403", "404", "409", "413", "422", "429")


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return create_app(Settings(admin_token=SecretStr("x" * 32))).openapi()


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m, p, op) for p, item in doc["paths"].items() for m, op in item.items()]


def _validator(doc: dict[str, Any], schema: dict[str, Any]) -> Any:
    """A validator of ``schema`` that resolves ``#/components/...`` in ``doc``."""
    root = {**schema, "components": doc["components"]}
    return jsonschema_rs.Draft202012Validator(root)


def test_every_operation_has_request_and_response_examples(document: dict[str, Any]) -> None:
    missing = []
    for method, path, op in _operations(document):
        for param in op.get("parameters", []):
            if "example" not in param and "examples" not in param["schema"]:
                missing.append(f"{method} {path}: parameter {param['name']}")
        if "requestBody" in op:
            media = op["requestBody"]["content"]["application/json"]
            schema = media["schema"]
            if "$ref" in schema:
                schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
            if not (media.get("examples") or media.get("example") or schema.get("examples")):
                missing.append(f"{method} {path}: request body")
        ok = [s for s in op["responses"] if s.startswith("2")]
        assert ok, (method, path)
        for status in ok:
            content = op["responses"][status].get("content", {})
            if not any("example" in media for media in content.values()):
                missing.append(f"{method} {path}: response {status}")
    assert not missing, missing


def test_every_error_status_has_an_example(document: dict[str, Any]) -> None:
    for method, path, op in _operations(document):
        statuses = set(op["responses"])
        # every operation may answer these (401/403 only where credentials are read, but a
        # rate limit or body limit answers before that); 422 wherever there is input
        assert statuses >= {"401", "403", "404", "409", "413", "429"}, (method, path)
        if op.get("parameters") or op.get("requestBody"):
            assert "422" in statuses, (method, path)
        for status in ERRORS:
            if status in statuses:
                media = op["responses"][status]["content"]["application/json"]
                assert "example" in media, (method, path, status)


def test_the_examples_conform_to_their_schemas(document: dict[str, Any]) -> None:
    checked = 0
    for _method, _path, op in _operations(document):
        for response in op["responses"].values():
            media = response.get("content", {}).get("application/json")
            if media is None or "example" not in media:
                continue
            _validator(document, media["schema"]).validate(media["example"])
            checked += 1
        body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
        for example in body.get("examples", {}).values():
            _validator(document, body["schema"]).validate(example["value"])
    assert checked >= 18 * 7  # every JSON operation's success and error responses


def test_every_schema_property_has_a_description(document: dict[str, Any]) -> None:
    missing = [
        f"{name}.{prop}"
        for name, schema in document["components"]["schemas"].items()
        for prop, value in schema.get("properties", {}).items()
        if not value.get("description")
    ]
    assert not missing, missing


def test_every_parameter_has_a_description(document: dict[str, Any]) -> None:
    missing = [
        f"{method} {path}: {param['in']} {param['name']}"
        for method, path, op in _operations(document)
        for param in op.get("parameters", [])
        if not param.get("description")
    ]
    assert not missing, missing


def test_errors_are_declared_as_json_only(document: dict[str, Any]) -> None:
    # /metrics answers text, but its errors come from the one JSON error mapping
    for method, path, op in _operations(document):
        for status in ERRORS:
            if status in op["responses"]:
                assert set(op["responses"][status]["content"]) == {"application/json"}, (
                    method,
                    path,
                    status,
                )
    metrics = document["paths"]["/metrics"]["get"]["responses"]
    assert set(metrics["200"]["content"]) == {"text/plain"}


def test_the_report_body_is_one_of_the_mechanisms_bodies(document: dict[str, Any]) -> None:
    from dp_governor.mechanisms import from_published
    from dp_governor.mechanisms.sfp import POSITIONS
    from dp_governor.policies import Policy, default_policies, publish

    body = document["paths"]["/v1/use-cases/{name}/reports"]["post"]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    names = [ref["$ref"].rsplit("/", 1)[1] for ref in schema["oneOf"]]
    assert names == ["CmsReportBody", "HcmsReportBody", "SfpReportBody"]  # the registry's order
    sfp = document["components"]["schemas"]["SfpReportBody"]
    assert sfp["properties"]["position"]["enum"] == list(POSITIONS)
    validator = _validator(document, schema)
    for created in default_policies():  # a body each mechanism builds is exactly one of them
        policy = publish(Policy.model_validate(created.model_dump() | {"version": 1}))
        mechanism = from_published(policy.randomizer.model_dump())
        report: dict[str, Any] = {
            **mechanism.privatize_one("hello").to_dict(),
            "family": policy.randomizer.family_id,
        }
        validator.validate(report)
        assert not validator.is_valid({**report, "unknown": 1})


def test_the_admin_token_is_a_bearer_scheme_on_admin_operations_only(
    document: dict[str, Any],
) -> None:
    assert document["components"]["securitySchemes"]["adminToken"] == {
        "type": "http",
        "scheme": "bearer",
        "description": document["components"]["securitySchemes"]["adminToken"]["description"],
    }
    security = {(m, p): op.get("security") for m, p, op in _operations(document)}
    admin = {k for k, v in security.items() if v == [{"adminToken": []}]}
    optional = {k for k, v in security.items() if v == [{}, {"adminToken": []}]}
    public = {k for k, v in security.items() if v is None}
    assert ("post", "/v1/admin/jobs/{job}:run") in admin
    assert ("put", "/v1/use-cases/{name}") in admin
    assert ("get", "/v1/use-cases/{name}/estimates") in admin
    assert optional == {
        ("get", "/v1/devices/{device_id}/budget"),
        ("get", "/v1/audit/devices/{device_id}"),
        ("get", "/v1/devices/{device_id}/tlog"),
        ("get", "/v1/audit/effective-epsilon"),  # public; at another delta, admin
    }
    assert ("post", "/v1/use-cases/{name}/reports") in public
    assert admin | optional | public == set(security)


def test_docs_load_only_local_assets(tmp_path: Path) -> None:
    with serve(tmp_path) as served, httpx.Client(base_url=served.base, timeout=60) as client:
        for page in ("/docs", "/redoc"):
            html = client.get(page)
            assert html.status_code == 200, page
            urls = re.findall(r"""(?:src|href|url)\s*[=:]\s*['"]([^'"]+)['"]""", html.text)
            assert urls, page
            for url in urls:
                assert url.startswith("/"), (page, url)  # nothing from another host
                assert client.get(url).status_code == 200, url
            assert "cdn" not in html.text.lower() and "fonts.googleapis" not in html.text
        bundle = client.get("/docs-assets/swagger-ui-bundle.js")
        assert len(bundle.content) > 500_000 and "javascript" in bundle.headers["content-type"]
        assert client.get("/openapi.json").json()["components"]["securitySchemes"]

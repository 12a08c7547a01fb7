"""A small Python client for devices, relays and operators (httpx)."""

from __future__ import annotations

from typing import Any

import httpx

__all__ = ["Client", "SubmitResult"]


class SubmitResult:
    """A submission's HTTP status and JSON body (202 receipt, 429 refusal, 4xx error)."""

    __slots__ = ("body", "retry_after", "status")

    def __init__(self, status: int, body: Any, retry_after: str | None) -> None:
        self.status = status
        self.body = body
        self.retry_after = retry_after

    @property
    def accepted(self) -> bool:
        """Whether the report was charged and stored."""
        return self.status == 202


class Client:
    """Talks to a dp-governor service; use as a context manager."""

    def __init__(
        self, base_url: str, *, admin_token: str | None = None, timeout: float = 30
    ) -> None:
        headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def submit(
        self,
        use_case: str,
        device_id: str,
        report: dict[str, Any],
        *,
        idempotency_key: str | None = None,
    ) -> SubmitResult:
        """Submit one report body (``report.to_dict()``) as ``device_id``."""
        headers = {"X-Device-Id": device_id}
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        r = self._http.post(f"/v1/use-cases/{use_case}/reports", json=report, headers=headers)
        return SubmitResult(r.status_code, r.json(), r.headers.get("Retry-After"))

    def submit_batch(self, use_case: str, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Relay many devices' reports (items: ``device_id``, ``report``, ``idempotency_key``)."""
        r = self._http.post(f"/v1/use-cases/{use_case}/reports:batch", json={"items": items})
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    def budget(self, device_id: str, *, as_device: bool = True) -> dict[str, Any]:
        """A device's budget (as the device itself, or with the admin token)."""
        headers = {"X-Device-Id": device_id} if as_device else {}
        r = self._http.get(f"/v1/devices/{device_id}/budget", headers=headers)
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    def use_case(self, name: str) -> dict[str, Any]:
        """A use case's current policy."""
        r = self._http.get(f"/v1/use-cases/{name}")
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    def run_job(self, name: str) -> dict[str, Any]:
        """Run a scheduled job now (admin)."""
        r = self._http.post(f"/v1/admin/jobs/{name}:run")
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    def estimates(self, use_case: str, candidates: list[str], **days: str) -> dict[str, Any]:
        """Published estimates for candidates (admin); ``from``/``to`` as ISO dates."""
        params: dict[str, Any] = {"candidates": candidates}
        params.update({k.rstrip("_"): v for k, v in days.items()})
        r = self._http.post(f"/v1/use-cases/{use_case}/estimates:query", json=params)
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

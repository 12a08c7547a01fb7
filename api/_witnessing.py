"""The log pushes its newest checkpoint to the configured witnesses and keeps their cosignatures.

The ``checkpoint`` job's last step (C2SP ``tlog-witness``, the log's side): for each witness
that has not cosigned the newest checkpoint, submit ``old <size>`` (the largest size it
cosigned here), the consistency proof from there and the signed note; on 409 the witness says
the size it holds, and the submission is made once more with the proof from that size. A
returned cosignature is kept (``tlog_cosignatures``) only if it verifies under the witness key
the deployment configured. A witness that is down or refuses is logged and counted
(``dpgov_witness_failures_total``) and does not stop the job: the next run tries again.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from dp_governor.api.metrics import Metrics
from dp_governor.budget.audit.tlog import SignedCheckpoint, TransparencyLog
from dp_governor.mechanisms.signed_note import Checkpoint, NoteError, Verifier

__all__ = ["WitnessEndpoint", "push_checkpoint"]

log = logging.getLogger("dpgov.jobs")
_TIMEOUT = 10.0


class WitnessRefused(RuntimeError):
    """A witness answered with no valid cosignature."""


@dataclass(frozen=True, slots=True)
class WitnessEndpoint:
    """A witness the log submits to: its base URL and the verifier key of its cosignatures."""

    url: str
    key: Verifier

    @classmethod
    def parse(cls, entry: str) -> WitnessEndpoint:
        """Read a ``"<base URL> <vkey>"`` entry of the ``witnesses`` setting (validated there)."""
        url, vkey = entry.split()
        return cls(url.rstrip("/"), Verifier.parse(vkey))


def push_checkpoint(
    tlog: TransparencyLog,
    witnesses: Sequence[WitnessEndpoint],
    *,
    metrics: Metrics | None = None,
    transport: httpx.BaseTransport | None = None,
) -> dict[str, str]:
    """Get the newest checkpoint cosigned by each witness; each witness's outcome by name.

    ``cosigned`` (a new cosignature kept), ``held`` (kept already), or ``failed: <why>``.
    """
    point = tlog.latest()
    if point is None or not witnesses:
        return {}
    outcomes = {}
    with httpx.Client(timeout=_TIMEOUT, transport=transport) as http:
        for witness in witnesses:
            name = witness.key.name
            try:
                outcomes[name] = _submit(tlog, point, witness, http)
            except (httpx.HTTPError, WitnessRefused, ValueError) as exc:
                log.warning("job checkpoint: witness %s at %s: %s", name, witness.url, exc)
                if metrics is not None:
                    metrics.witness_failures.labels(name).inc()
                outcomes[name] = f"failed: {exc}"
    return outcomes


def _submit(
    tlog: TransparencyLog, point: SignedCheckpoint, witness: WitnessEndpoint, http: httpx.Client
) -> str:
    """Submit ``point`` to one witness and keep its cosignature (see the module's doc)."""
    if witness.key.name in _cosigners(point.note, tlog.verifier, witness.key):
        return "held"
    old = min(tlog.cosigned_size(witness.key.name), point.size)
    answer = _post(tlog, point, old, witness, http)
    if answer.status_code == 409 and answer.headers.get("content-type", "").startswith(
        "text/x.tlog.size"
    ):
        held = int(answer.text.strip())
        if held > point.size:
            raise WitnessRefused(
                f"it holds a checkpoint of {held} leaves, more than this log's {point.size}"
            )
        answer = _post(tlog, point, held, witness, http)
    if answer.status_code != 200:
        raise WitnessRefused(f"HTTP {answer.status_code}: {answer.text.strip()[:200]}")
    for line in answer.text.splitlines():
        if line and witness.key.name in _cosigners(
            point.note + line + "\n", tlog.verifier, witness.key
        ):
            tlog.add_cosignature(point.size, witness.key.name, line)
            log.info("job checkpoint: witness %s cosigned size %d", witness.key.name, point.size)
            return "cosigned"
    raise WitnessRefused("its answer holds no valid cosignature of its configured key")


def _post(
    tlog: TransparencyLog,
    point: SignedCheckpoint,
    old: int,
    witness: WitnessEndpoint,
    http: httpx.Client,
) -> httpx.Response:
    proof = tlog.consistency(old, point.size) if old else []
    lines = "".join(base64.b64encode(h).decode() + "\n" for h in proof)
    body = f"old {old}\n{lines}\n{point.note}".encode()
    return http.post(f"{witness.url}/add-checkpoint", content=body)


def _cosigners(note: str, log_key: Verifier, witness: Verifier) -> dict[str, int]:
    """The witnesses among ``[witness]`` whose cosignature on ``note`` verifies."""
    try:
        return Checkpoint.open(note, log_key, witnesses=[witness])[1]
    except NoteError:
        return {}

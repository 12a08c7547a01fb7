"""``dpgov demo``: the whole loop over real HTTP, on a temporary database or the served one.

A service starts on 127.0.0.1 (by default a SQLite file in a temporary folder; with
``settings``, the database and keys those name, such as the one ``dpgov serve`` uses, so its
dashboard shows the demo's data), with Apple's default policies and a settable clock that
starts ``days - 1`` days ago and ends today. A simulated fleet privatizes Zipf-distributed
emoji (CMS) and made-up words (SFP) with the real mechanisms and submits them through the relay
endpoint day after day, charged like real devices; one device in a hundred also sends a second
emoji report each day, which the daily cap refuses. The jobs shuffle, store and fold the
reports; then the estimates, the discovered words and each use case's spend are printed.

Into a served database, the demo shares the jobs with the server that runs them: it asks for
a job with a wait, so the server's own run (which holds the job's lease) goes first. A fleet
is named after what decides its reports (seed, devices, days and first day): its device ids
and every report's idempotency key carry that name, so running the same command again the
same UTC day after an interruption replays what was already charged and sends the rest,
and the database ends with the whole fleet once, never half of it twice.
"""

from __future__ import annotations

import hashlib
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import uvicorn
from pydantic import SecretStr

from dp_governor.api._keys import service_keys
from dp_governor.api.app import create_app
from dp_governor.api.client import Client, RelayItem
from dp_governor.api.database import init_service_db
from dp_governor.api.demo.simulation import emoji_vocabulary, made_up_words, zipf_indices
from dp_governor.api.server import bind_port
from dp_governor.api.settings import Settings
from dp_governor.budget import FixedClock, create_db_engine
from dp_governor.mechanisms import CMS, SFP

__all__ = ["DemoResult", "demo_reports", "fleet_name", "run_demo"]

ADMIN_TOKEN = "demo-admin-token-demo-admin-token"
DEMO_USE_CASES = ("emoji", "quicktype")  # what the demo's fleet reports to
BATCH = 2_000
JOB_WAIT_SECONDS = 600.0  # the longest the server waits for a job another process runs


@dataclass
class DemoResult:
    """What the demo measured, for printing and tests.

    ``fleet``: the fleet's name (:func:`fleet_name`); ``replayed``: reports an earlier run of
    the same fleet (interrupted or not) had sent, answered from their first decision and not
    charged again; ``others``: emoji reports in the estimates' days that are not this fleet's
    (an earlier demo or real devices), which the estimates include and the true counts do not;
    ``word_threshold``: the estimated count a word needed to be published.
    """

    devices: int
    days: int
    submitted: int
    accepted: int
    refused: int
    emoji_top: list[dict[str, Any]]
    emoji_truth: dict[str, int]
    words: list[dict[str, Any]]
    word_truth: dict[str, int]
    spend: list[dict[str, Any]]
    spend_device: str
    seconds: float
    effective_epsilon: dict[str, Any]
    audit: dict[str, Any]
    fleet: str = ""
    replayed: int = 0
    others: int = 0
    word_threshold: float = 0.0


def _over_cap(devices: int) -> int:
    """Devices that send a second emoji report each day (refused by its daily cap of one)."""
    return devices // 100


def fleet_name(seed: int, devices: int, days: int, first: date) -> str:
    """The name of the fleet these parameters make: the same name, the same reports.

    >>> fleet_name(7, 2000, 3, date(2026, 11, 24))
    'b7c94229'
    """
    text = f"dpgov-demo/{seed}/{devices}/{days}/{first.isoformat()}"
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


def demo_reports(devices: int, days: int) -> int:
    """How many reports the demo submits: two per device and day, and the refused extras."""
    return (2 * devices + _over_cap(devices)) * days


def run_demo(
    devices: int = 20_000,
    days: int = 3,
    *,
    seed: int = 7,
    progress: Callable[[int, int], None] | None = None,
    workdir: Path | None = None,
    settings: Settings | None = None,
    port: int | None = None,
) -> DemoResult:
    """Run the demo and return its results (the CLI prints them).

    ``settings``: the database and keys to write to (a served database); the demo's own
    server on them has its own admin token. Default: a temporary database. ``progress`` is
    called with the reports submitted so far and :func:`demo_reports`, after each batch.
    ``port``: the loopback port of the demo's own server (default: a free one);
    :class:`~dp_governor.api.server.PortInUse` if it is taken.
    """
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    with (
        closing(bind_port("127.0.0.1", port or 0)) as sock,  # taken: refused before anything
        tempfile.TemporaryDirectory(dir=workdir) as tmp,
    ):
        own = {"admin_token": SecretStr(ADMIN_TOKEN), "scheduler": False}
        limits = {"max_body_bytes": 64 << 20, "max_batch_items": BATCH}
        own_database = settings is None
        if settings is None:
            settings = Settings(
                database_url=f"sqlite:///{Path(tmp) / 'demo.sqlite'}",
                secret_file=Path(tmp) / "secret",
                audit_key_file=Path(tmp) / "audit.key",
                shuffler_key_file=Path(tmp) / "shuffler.key",
                **own,  # type: ignore[arg-type]
                **limits,  # type: ignore[arg-type]
            )
        else:
            settings = settings.model_copy(update={**own, **limits})
            _check_database(settings)
        # days - 1 days ago to today, at this time of day: the served dashboard's last days
        clock = FixedClock(datetime.now(UTC).replace(microsecond=0) - timedelta(days=days - 1))
        port = int(sock.getsockname()[1])
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(settings, clock=clock),
                host="127.0.0.1",
                port=port,
                log_config=None,  # the caller's logging stays as it is
                log_level="warning",
            )
        )
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        base = f"http://127.0.0.1:{port}"
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the demo server did not start")
            time.sleep(0.05)
        try:
            if own_database:
                _fit_minimums(base, devices)
            fleet = fleet_name(seed, devices, days, clock.now().date())
            return _simulate(base, clock, fleet, devices, days, rng, progress, start)
        finally:
            server.should_exit = True
            thread.join(timeout=30)


def _run_job(client: Client, name: str) -> None:
    """Run a job on the demo's server, after any run of it the served server has under way."""
    client.run_job(name, wait=JOB_WAIT_SECONDS)


def _fit_minimums(base: str, devices: int) -> None:
    """On the demo's own database: lower its use cases' batch minimum to its fleet, if above.

    Apple's defaults hold a batch until enough distinct devices are pending for its central
    figure to mean something (5,000 for Emoji, 200,000 for QuickType): more than a small demo
    fleet. The demo's temporary database takes them down to the fleet's size (a loosening, made
    openly as a new policy version), so its batches publish and their central figures show
    what so few devices give. A served database (``--database-url``) keeps its policies.
    """
    from dp_governor.policies.defaults import DEFAULT_POLICIES

    for policy in DEFAULT_POLICIES:
        if policy["name"] not in DEMO_USE_CASES:
            continue
        minimum = policy.get("min_batch_devices", 1)
        if isinstance(minimum, int) and minimum > devices:
            response = httpx.put(
                f"{base}/v1/use-cases/{policy['name']}",
                params={"allow_loosen": "true"},
                json={**policy, "min_batch_devices": devices},
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                timeout=60,
            )
            response.raise_for_status()


def _check_database(settings: Settings) -> None:
    """Open the database and its keys as the server will; RuntimeError in one line if not."""
    try:
        engine = create_db_engine(settings.database_url)
    except Exception as exc:
        raise RuntimeError(f"cannot use the database: {exc}") from None
    try:
        init_service_db(engine)
        service_keys(settings, engine, generate=True, record=True)
    except Exception as exc:
        cause = getattr(exc, "orig", None) or exc
        raise RuntimeError(f"cannot use the database: {str(cause).splitlines()[0]}") from None
    finally:
        engine.dispose()


def _simulate(
    base: str,
    clock: FixedClock,
    fleet: str,
    devices: int,
    days: int,
    rng: np.random.Generator,
    progress: Callable[[int, int], None] | None,
    start: float,
) -> DemoResult:
    emoji = emoji_vocabulary()
    words = made_up_words(2_000, rng=rng)
    submitted = accepted = 0
    extra = _over_cap(devices)
    emoji_truth = np.zeros(len(emoji), dtype=np.int64)
    word_truth = np.zeros(len(words), dtype=np.int64)
    replayed = 0
    with Client(base, admin_token=ADMIN_TOKEN, timeout=600) as client:
        cms = client.randomizer("emoji")
        sfp = client.randomizer("quicktype")
        assert isinstance(cms, CMS) and isinstance(sfp, SFP)
        ids = [f"demo-{fleet}-{i:06d}" for i in range(devices)]
        emoji_accepted = 0
        for day in range(days):
            e_index = zipf_indices(len(emoji), devices, 1.1, rng=rng)
            w_index = zipf_indices(len(words), devices, 1.1, rng=rng)
            emoji_truth += np.bincount(e_index, minlength=len(emoji))  # what was accepted
            word_truth += np.bincount(w_index, minlength=len(words))
            again = list(range(devices - extra, devices))  # their second emoji of the day
            e_index = np.concatenate([e_index, e_index[again]])
            batches = (
                ("emoji", cms.privatize_indices(emoji, e_index, rng=rng).to_dicts()),
                (
                    "quicktype",
                    sfp.privatize(np.asarray(words, dtype=object)[w_index], rng=rng).to_dicts(),
                ),
            )
            senders = {"emoji": ids + [ids[i] for i in again], "quicktype": ids}
            for use_case, reports in batches:
                sender = senders[use_case]
                for s in range(0, len(sender), BATCH):
                    items = [
                        RelayItem(sender[i], reports[i], f"demo-{fleet}-{day}-{use_case}-{i}")
                        for i in range(s, min(len(sender), s + BATCH))
                    ]
                    result = client.relay(use_case, items)
                    submitted += len(items)
                    accepted += result.accepted
                    if use_case == "emoji":
                        emoji_accepted += result.accepted
                    replayed += sum(1 for r in result.results if r.replayed)
                    if progress:
                        progress(submitted, demo_reports(devices, days))
            _run_job(client, "aggregate")
            clock.advance(days=1)
        clock.advance(days=-1)
        first = (clock.now() - timedelta(days=days - 1)).date()
        answer = client.estimates("emoji", emoji, start=first)
        estimates = [e.model_dump() for e in answer.estimates[:10]]
        http = httpx.get(
            base + "/v1/use-cases/quicktype/discoveries",
            params={"from": first.isoformat()},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=600,
        )
        http.raise_for_status()
        found = http.json()["words"][:10]
        word_threshold = float(http.json()["threshold"])
        spend = []
        for row in client.budget(ids[0], as_device=True).use_cases:
            if row.epsilon_lifetime > 0:
                spend.append(row.model_dump())
        _run_job(client, "checkpoint")
        _run_job(client, "dashboard")  # the figures the dashboard and the report show
        _run_job(client, "verify")  # the chain's status on the dashboard
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        report = httpx.get(base + "/v1/audit/effective-epsilon", timeout=600)
        report.raise_for_status()
        audit = httpx.get(base + "/v1/audit/verify", headers=admin, timeout=600)
        audit.raise_for_status()
    return DemoResult(
        devices=devices,
        days=days,
        submitted=submitted,
        accepted=accepted,
        refused=submitted - accepted,
        emoji_top=estimates,
        emoji_truth={emoji[i]: int(emoji_truth[i]) for i in range(len(emoji))},
        words=found,
        word_truth={words[i]: int(word_truth[i]) for i in range(len(words))},
        spend=spend,
        spend_device=ids[0],
        seconds=time.perf_counter() - start,
        effective_epsilon=report.json(),
        audit=audit.json(),
        fleet=fleet,
        replayed=replayed,
        others=max(0, answer.n - emoji_accepted),
        word_threshold=word_threshold,
    )

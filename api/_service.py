"""The service's parts, opened from its settings and checked keys in one place.

The app's lifespan and its job worker (:mod:`dp_governor.api._job_process`) open the same
engine, ledger and ingestor from the same settings: one constructor, so the two never drift.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from dp_governor.api._keys import ServiceKeys
from dp_governor.budget import Ledger, create_db_engine
from dp_governor.pipeline.ingest import Ingestor
from dp_governor.pipeline.seal import InboxSeal

if TYPE_CHECKING:
    from dp_governor.api.settings import Settings

__all__ = ["Service", "open_service_parts", "service_engine"]


@dataclass(frozen=True, slots=True)
class Service:
    """What jobs and routes work on: the settings, the ledger and the ingestor over it."""

    settings: Settings
    ledger: Ledger
    ingestor: Ingestor


def service_engine(settings: Settings) -> Engine:
    """The database engine the settings name, with the jobs' pause and lock wait."""
    return create_db_engine(
        settings.database_url,
        job_pause=settings.job_pause,
        job_lock_seconds=settings.job_lock_seconds,
    )


def open_service_parts(settings: Settings, keys: ServiceKeys, engine: Engine) -> Service:
    """The ledger and the ingestor over ``engine``, under the service's checked keys."""
    secret = keys.device_key_secret
    ledger = Ledger(engine, secret, audit_key=keys.audit_key, tlog_origin=settings.tlog_origin)
    ingestor = Ingestor(
        ledger,
        secret,
        seal=InboxSeal(keys.shuffler_keys),
        require_family=settings.require_report_family,
    )
    return Service(settings, ledger, ingestor)

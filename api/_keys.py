"""The keys a process uses on one database: read, generated where none is recorded, checked.

Each key's fingerprint is recorded in the database the first time; every later start and
command compares its keys with them and refuses, naming the setting, a key that is not the
database's (:class:`~dp_governor.api.settings.KeyRefused`).
"""

from __future__ import annotations

import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr
from sqlalchemy import Engine, inspect, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from dp_governor.api._device_secret import DeviceAdoption, holds_devices
from dp_governor.api.settings import KeyRefused, Settings
from dp_governor.budget.audit.log import AuditLog
from dp_governor.budget.storage.db import (
    META_TABLE,
    key_fingerprint,
    record_fingerprints,
    stored_fingerprints,
    writer,
)

__all__ = ["NOT_INITIALISED", "ServiceKeys", "service_keys"]

_NOT_RECORDED = (
    "this database records no fingerprints of its keys yet: run `dpgov db upgrade` once with"
    " the server's settings, which checks the keys and records them (docs/operations.md)"
)
NOT_INITIALISED = (
    "this database was not initialised by dp-governor: point DPGOV_DATABASE_URL (or"
    " --database-url) at the service's database, or run `dpgov db init` to create one"
)


@dataclass(frozen=True, slots=True)
class ServiceKeys:
    """The keys a process uses on one database, checked against its recorded fingerprints.

    ``shuffler_keys`` (the sealing key first, then keys retired by a rotation) is empty for a
    read-only command, which opens no inbox row, and for a writing command on a database that
    records no shuffler key yet.
    """

    device_key_secret: bytes
    audit_key: bytes
    sources: tuple[str, str]  # where each came from: a setting's name or a file (and if new)
    shuffler_keys: tuple[bytes, ...] = ()
    shuffler_source: str = ""


@dataclass(frozen=True, slots=True)
class _Key:
    label: str
    value_setting: str
    file_setting: str
    meta_name: str

    def settings(self) -> str:
        return f"{self.value_setting} or {self.file_setting}"


_DEVICE = _Key(
    "device-key secret",
    "DPGOV_DEVICE_KEY_SECRET",
    "DPGOV_SECRET_FILE",
    "fingerprint.device_key_secret",
)
_AUDIT = _Key("audit key", "DPGOV_AUDIT_KEY", "DPGOV_AUDIT_KEY_FILE", "fingerprint.audit_key")
_SHUFFLER = _Key(
    "shuffler key", "DPGOV_SHUFFLER_KEY", "DPGOV_SHUFFLER_KEY_FILE", "fingerprint.shuffler_key"
)


def service_keys(
    settings: Settings,
    engine: Engine,
    *,
    generate: bool = False,
    record: bool = False,
    adopt: DeviceAdoption | None = None,
) -> ServiceKeys:
    """The device-key secret, audit key and shuffler key for ``engine``'s database, checked.

    Each key comes from its setting's value, else from its file. A key whose fingerprint the
    database records must match it. ``record`` (the server's start and writing commands)
    records the fingerprint of a key the database has none of yet (an audit key only if it
    tags the first audit entry, a device-key secret on a ledger that holds devices only as
    ``adopt`` allows: :class:`dp_governor.api._device_secret.DeviceAdoption`, ``dpgov db upgrade``'s
    ``--known-device``); ``generate`` (the server's start, ``dpgov db init``) writes a
    new key file, but only for a database with no audit history and no fingerprint. The
    shuffler key is read only with ``record`` (a read opens no inbox row), and generated for a
    database that records none even if it has history: it seals the reports queued from then
    on and nothing before. A shuffler key other than the recorded one is taken as a rotation
    when the recorded one is among the keys given after it (:func:`_record_shuffler`). Raises
    :class:`KeyRefused` listing every problem, naming the settings to provide; nothing is
    generated or recorded unless every key passes.
    """
    stored = stored_fingerprints(engine)
    if stored is None and not record:
        if inspect(engine).has_table("audit_log"):  # a ledger older than the fingerprints
            raise KeyRefused(_NOT_RECORDED)
        raise KeyRefused(NOT_INITIALISED)
    stored = stored or {}
    first_entry = _first_audit_entry(engine)
    specs = (
        (_DEVICE, settings.device_key_secret, settings.secret_path()),
        (_AUDIT, settings.audit_key, settings.audit_key_path()),
    )
    found: list[tuple[bytes | None, str]] = []
    problems: list[str] = []
    for spec, configured, path in specs:
        key, source = _read(spec, configured, path)
        found.append((key, source))
        recorded = stored.get(spec.meta_name)
        if key is None:
            if recorded is not None or first_entry is not None or not generate:
                problems.append(
                    f"no {spec.label} was given and {path} does not exist: set"
                    f" {spec.settings()} to the one this database was initialised with"
                )
        elif recorded is not None:
            if not hmac.compare_digest(key_fingerprint(key), recorded):
                problems.append(
                    f"the {spec.label} from {source} is not the one this database was"
                    f" initialised with: set {spec.settings()} to the server's"
                )
        elif not record:
            problems.append(_NOT_RECORDED)
        elif spec is _DEVICE and holds_devices(engine):
            problem = (adopt or DeviceAdoption()).problem(engine, key, source)
            if problem is not None:
                problems.append(problem)
        elif spec is _AUDIT and first_entry is not None:
            entry_hash, tag = first_entry
            if not hmac.compare_digest(AuditLog(engine, key).tag(entry_hash), tag):
                problems.append(
                    f"the {spec.label} from {source} did not tag this database's first audit"
                    f" entry: set {spec.settings()} to the key the server used"
                )
    shuffler: list[bytes] = []
    shuffler_source = ""
    if record:
        shuffler, shuffler_source = _read_many(settings)
        recorded = stored.get(_SHUFFLER.meta_name)
        if not shuffler and recorded is not None:
            problems.append(
                f"no {_SHUFFLER.label} was given and {settings.shuffler_key_path()} does not"
                f" exist: set {_SHUFFLER.settings()} to the one this database records"
            )
        elif shuffler and recorded is not None and not _known(recorded, shuffler):
            problems.append(
                f"the {_SHUFFLER.label} from {shuffler_source} is not the one this database"
                f" records, nor is any key after it (a rotation keeps the previous key after the"
                f" new one): set {_SHUFFLER.settings()} to the server's"
            )
    if problems:
        raise KeyRefused("; ".join(dict.fromkeys(problems)))
    if record and not shuffler and generate:
        path = settings.shuffler_key_path()
        try:
            shuffler, shuffler_source = [_generate(path)], f"{path} (generated)"
        except OSError as exc:
            raise KeyRefused(
                f"cannot write a new {_SHUFFLER.label} to {path} ({exc.strerror}): set"
                f" {_SHUFFLER.settings()}"
            ) from None
    keys: list[bytes] = []
    sources: list[str] = []
    for (_, _, path), (key, source) in zip(specs, found, strict=True):
        if key is None:
            key, source = _generate(path), f"{path} (generated)"
        keys.append(key)
        sources.append(source)
    device, audit = keys
    if record:
        mine = {
            _DEVICE.meta_name: key_fingerprint(device),
            _AUDIT.meta_name: key_fingerprint(audit),
        }
        now_stored = record_fingerprints(engine, mine)
        for i, spec in enumerate((_DEVICE, _AUDIT)):  # a concurrent start may have won
            if now_stored.get(spec.meta_name) != mine[spec.meta_name]:
                raise KeyRefused(
                    f"the {spec.label} from {sources[i]} is not the one this database was"
                    f" initialised with: set {spec.settings()} to the server's"
                )
        if shuffler:
            _record_shuffler(engine, shuffler, shuffler_source)
    return ServiceKeys(device, audit, (sources[0], sources[1]), tuple(shuffler), shuffler_source)


def _read_many(settings: Settings) -> tuple[list[bytes], str]:
    """The shuffler keys (sealing key first) from the setting, else from the file, and whence."""
    if settings.shuffler_key is not None:
        text, source = settings.shuffler_key.get_secret_value(), _SHUFFLER.value_setting
    else:
        path = settings.shuffler_key_path()
        source = str(path)
        try:
            text = path.read_text(encoding="ascii")
        except FileNotFoundError:
            return [], source
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not ASCII text"
            raise KeyRefused(
                f"cannot read the {_SHUFFLER.label} from {path} ({reason}): fix it or set"
                f" {_SHUFFLER.settings()}"
            ) from None
    keys = text.split()
    if not keys or any(len(key) < 32 for key in keys):
        raise KeyRefused(
            f"the {_SHUFFLER.label} from {source} must be one key of at least 32 characters a"
            f" line: set {_SHUFFLER.settings()}"
        )
    return [key.encode() for key in keys], source


def _known(recorded: str, keys: list[bytes]) -> bool:
    """Whether the recorded fingerprint is one of ``keys``' (the sealing key, or a retired one)."""
    return any(hmac.compare_digest(key_fingerprint(key), recorded) for key in keys)


def _record_shuffler(engine: Engine, keys: list[bytes], source: str) -> None:
    """Record the sealing key's fingerprint, replacing a retired key's (a rotation).

    Checked again in the writing transaction: a concurrent start that recorded another key
    refuses this one.
    """
    mine = key_fingerprint(keys[0])
    insert = pg_insert if engine.dialect.name == "postgresql" else sqlite_insert
    with writer(engine).begin() as conn:
        conn.execute(
            insert(META_TABLE).values(name=_SHUFFLER.meta_name, value=mine).on_conflict_do_nothing()
        )
        recorded = conn.execute(
            select(META_TABLE.c.value).where(META_TABLE.c.name == _SHUFFLER.meta_name)
        ).scalar_one()
        if recorded == mine:
            return
        if not _known(str(recorded), keys[1:]):
            raise KeyRefused(
                f"the {_SHUFFLER.label} from {source} is not the one this database records:"
                f" set {_SHUFFLER.settings()} to the server's"
            )
        conn.execute(
            update(META_TABLE).where(META_TABLE.c.name == _SHUFFLER.meta_name).values(value=mine)
        )


def _first_audit_entry(engine: Engine) -> tuple[str, str] | None:
    """``(hash, tag)`` of the oldest audit entry, or ``None`` for a database with no history."""
    with engine.connect() as conn:
        row = conn.execute(text("SELECT hash, tag FROM audit_log ORDER BY seq LIMIT 1")).first()
    return None if row is None else (str(row[0]), str(row[1]))


def _read(spec: _Key, configured: SecretStr | None, path: Path) -> tuple[bytes | None, str]:
    """The key from its setting, else from its file; ``None`` if neither holds one."""
    if configured is not None:
        return configured.get_secret_value().encode(), spec.value_setting
    try:
        value = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None, str(path)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not ASCII text"
        raise KeyRefused(
            f"cannot read the {spec.label} from {path} ({reason}): fix it or set {spec.settings()}"
        ) from None
    if len(value) < 32:
        raise KeyRefused(
            f"the {spec.label} in {path} is shorter than 32 characters: set {spec.settings()}"
        )
    return value.encode(), str(path)


def _generate(path: Path) -> bytes:
    """A new 256-bit key at ``path`` (mode 0600, its folder 0700), or theirs if it exists.

    Written to a private temporary file and then linked into place, so that no process ever
    reads a half-written key and two processes starting at once end up with one key.
    """
    value = secrets.token_hex(32)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{secrets.token_hex(8)}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(value + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(partial, path)
        except FileExistsError:  # another process created it first: use theirs
            return path.read_text(encoding="ascii").strip().encode()
    finally:
        partial.unlink()
    return value.encode()

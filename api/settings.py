"""Service settings from the environment (prefix ``DPGOV_``), and the three keys they name.

The device-key secret, the audit key and the shuffler key come from a setting's value, else
from a file in the secrets directory (``DPGOV_SECRETS_DIR``, by default
``$XDG_CONFIG_HOME/dp-governor``, that is ``~/.config/dp-governor``), never from the folder a
command happens to run in. The first two key files are generated only when a new database is
initialised; the shuffler key's also at the first start of a database that has none (it seals
only the reports queued from then on). The database records each key's fingerprint, and every
process that opens it checks the keys it was given against them (:func:`service_keys`).
"""

from __future__ import annotations

import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from sqlalchemy import Engine, inspect, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from dp_governor.api.device_secret import DeviceAdoption, holds_devices
from dp_governor.api.unknown_settings import PREFIX, check_environment
from dp_governor.budget.audit.log import AuditLog
from dp_governor.budget.storage.db import (
    META_TABLE,
    key_fingerprint,
    record_fingerprints,
    stored_fingerprints,
    writer,
)

__all__ = [
    "AUDIT_KEY_FILE",
    "NOT_INITIALISED",
    "SECRET_FILE",
    "SHUFFLER_KEY_FILE",
    "KeyRefused",
    "ServiceKeys",
    "Settings",
    "default_secrets_dir",
    "service_keys",
    "setting_names",
]

SECRET_FILE = "dpgov.secret"
AUDIT_KEY_FILE = "dpgov-audit.key"
SHUFFLER_KEY_FILE = "dpgov-shuffler.key"
_NOT_RECORDED = (
    "this database records no fingerprints of its keys yet: run `dpgov db upgrade` once with"
    " the server's settings, which checks the keys and records them (docs/operations.md)"
)
NOT_INITIALISED = (
    "this database was not initialised by dp-governor: point DPGOV_DATABASE_URL (or"
    " --database-url) at the service's database, or run `dpgov db init` to create one"
)


class Settings(BaseSettings):
    """Everything the service reads at start; nothing connects until the app's lifespan."""

    model_config = SettingsConfigDict(
        env_prefix="DPGOV_", extra="forbid", hide_input_in_errors=True
    )

    environment: Literal["development", "production"] = Field(
        default="development",
        description="`production` refuses to start without `device_key_secret` and `admin_token`.",
    )
    database_url: str = Field(
        default="sqlite:///dpgov.sqlite", description="sqlite:///path or postgresql+psycopg://..."
    )
    admin_token: SecretStr | None = Field(
        default=None,
        description="Bearer token for admin routes, at least 32 characters; unset: admin routes"
        " refuse every request.",
    )
    device_key_secret: SecretStr | None = Field(
        default=None,
        description="HMAC key for device pseudonyms; if unset, read from `secret_file`.",
    )
    secret_file: Path | None = Field(
        default=None,
        description=f"The device-key secret's file (default: secrets_dir/{SECRET_FILE}).",
    )
    audit_key: SecretStr | None = Field(
        default=None,
        description="HMAC key that tags audit entries and signs checkpoints; kept outside the"
        " database; if unset, read from `audit_key_file`.",
    )
    audit_key_file: Path | None = Field(
        default=None, description=f"The audit key's file (default: secrets_dir/{AUDIT_KEY_FILE})."
    )
    shuffler_key: SecretStr | None = Field(
        default=None,
        description="Key that seals the reports waiting in the inbox, so that a copy of the"
        " database cannot read them; kept outside the database. Several keys separated by"
        " spaces or lines: the first seals, the others only open reports sealed before a"
        " rotation. If unset, read from `shuffler_key_file`.",
    )
    shuffler_key_file: Path | None = Field(
        default=None,
        description="The shuffler key's file, one key a line (default:"
        f" secrets_dir/{SHUFFLER_KEY_FILE}).",
    )
    secrets_dir: Path | None = Field(
        default=None,
        description="Where key files live and are generated (default: $XDG_CONFIG_HOME/dp-governor,"
        " else ~/.config/dp-governor).",
    )
    checkpoint_seconds: int = Field(default=300, ge=1, description="Audit checkpoint interval.")
    checkpoint_file: Path | None = Field(
        default=None,
        description="A file outside the database (another disk, host or bucket mount) that"
        " every signed checkpoint is appended to; `verify` checks the log against it, which"
        " catches a log truncated back to an earlier checkpoint. Created 0600. Unreadable, or"
        " missing once the database holds a checkpoint: `verify` fails naming it. Unset:"
        " checkpoints live only in the database.",
    )
    verify_cache_seconds: float = Field(
        default=300.0, ge=0, description="How long the dashboard shows one chain verification."
    )
    report_cache_seconds: float = Field(
        default=30.0,
        ge=0,
        description="How long an effective-epsilon report, the dashboard and a use case's"
        " public distribution are served again.",
    )
    host: str = Field(default="127.0.0.1", description="Address `dpgov serve` listens on.")
    port: int = Field(default=8000, ge=1, le=65535, description="Port `dpgov serve` listens on.")
    max_body_bytes: int = Field(
        default=1 << 20, ge=1024, le=1 << 30, description="Largest request body; larger is 413."
    )
    max_batch_items: int = Field(
        default=10_000, ge=1, le=1_000_000, description="Most items in one relay batch."
    )
    device_rate_per_minute: int = Field(
        default=120, ge=1, description="Requests a device may make a minute before 429."
    )
    require_report_family: bool = Field(
        default=True,
        description="Refuse (422) reports without the `family` field; `false` accepts them, for"
        " fleets built before the field. A wrong one is always refused, naming what differs"
        " (docs/api.md).",
    )
    admin_failures_per_minute: int = Field(
        default=20,
        ge=1,
        description="Wrong admin tokens a client address may send a minute before 429, counted"
        " by each worker on its own (N workers admit up to N times as many).",
    )
    scheduler: bool = Field(default=True, description="Run the scheduled jobs in this process.")
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="Server log lines: `text`, or `json` (one object per line: one per request"
        " with its route template, status and duration, one per job run; never a device id or"
        " a client address).",
    )
    flush_seconds: int = Field(
        default=60, ge=1, description="Interval of the `flush-inbox` job (inbox to report store)."
    )
    aggregate_seconds: int = Field(
        default=300, ge=1, description="Interval of the `aggregate` job (reports into sketches)."
    )
    shuffle_batch: int = Field(
        default=500,
        ge=1,
        description="Most reports one transaction of `flush-inbox` moves (a use case's batch"
        " moves in several and is published by the last).",
    )
    job_pause: float = Field(
        default=2.0,
        ge=0,
        le=100,
        description="SQLite: how long a job (flush, aggregate, purge) pauses after each of its"
        " short write transactions, as a multiple of the transaction's time, so that reports"
        " arriving meanwhile get the database's one write lock (2: free two thirds of the time,"
        " the job takes about three times as long; 0: no pause, for a database nothing else"
        " writes to while jobs run). No effect on PostgreSQL.",
    )
    job_lock_seconds: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="How long a job's transaction waits for a lock before the job stops as"
        " busy (its next run resumes): SQLite's busy timeout for job writes, PostgreSQL's"
        " `lock_timeout` and `idle_in_transaction_session_timeout` for each job transaction,"
        " so a job process stopped inside a transaction loses its session after as long.",
    )
    flush_min_batch: int = Field(
        default=100,
        ge=1,
        description="A use case's reports stay in the inbox until this many are pending: a"
        " smaller flush would store them in arrival order.",
    )
    job_lease_seconds: float = Field(
        default=60.0,
        ge=1,
        le=3600,
        description="TTL of a job's lease, renewed while the job runs: a crashed process"
        " blocks its job for at most this long.",
    )

    # HTTP server limits (docs/operations.md, "Timeouts and limits"): `dpgov serve` passes them
    # to uvicorn, and the rate-limit tables are bounded by them.
    keep_alive_seconds: int = Field(
        default=5, ge=1, le=3600, description="Close an idle keep-alive connection after this."
    )
    header_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="Drop a connection whose request line and headers have not all arrived"
        " this long after it opened (or after its previous response).",
    )
    body_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Drop a connection whose request body has not all arrived this long after"
        " its headers.",
    )
    max_header_bytes: int = Field(
        default=16 * 1024,
        ge=1024,
        le=1 << 20,
        description="Largest request line plus headers; larger requests are refused.",
    )
    limit_concurrency: int = Field(
        default=1000,
        ge=1,
        description="Open connections plus running requests per worker before uvicorn answers"
        " 503; keep it below the process's open-file limit, and cap client connections at a"
        " proxy in front (docs/operations.md#behind-a-reverse-proxy).",
    )
    rate_limit_keys: int = Field(
        default=100_000,
        ge=1,
        le=10_000_000,
        description="Devices (and admin clients) each rate limiter remembers; least recently"
        " seen are forgotten first.",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The usual sources, after refusing a ``DPGOV_`` variable that names no setting.

        The environment source alone would ignore it (``extra="forbid"`` covers only
        arguments), and a typo would silently leave the default in force.
        """
        check_environment(os.environ, setting_names())
        return init_settings, env_settings, dotenv_settings, file_secret_settings

    @field_validator("admin_token")
    @classmethod
    def _admin_token_is_long(cls, value: SecretStr | None) -> SecretStr | None:
        """An empty or short token (``DPGOV_ADMIN_TOKEN=``) would make admin guessable.

        And one no request can carry would lock every admin out while passing the length
        check: a header value loses its whitespace at either end (a whitespace-only token is
        empty), and control or non-ASCII characters do not survive it unchanged.
        """
        if value is None:
            return None
        token = value.get_secret_value()
        if len(token) < 32:
            raise ValueError(
                "must be at least 32 characters (e.g. the output of"
                " `python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`), or unset"
                " to refuse every admin route"
            )
        if not all(" " <= c <= "~" for c in token) or token != token.strip():
            raise ValueError(
                "must be printable ASCII with no whitespace at either end (a request's"
                " `Authorization` header could never carry it), e.g. the output of"
                " `python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`"
            )
        return value

    @model_validator(mode="after")
    def _production_needs_secrets(self) -> Settings:
        if self.environment == "production":
            if self.device_key_secret is None:
                raise ValueError("`device_key_secret` must be set in production")
            if self.admin_token is None:
                raise ValueError("`admin_token` must be set in production")
        if self.audit_key is not None and len(self.audit_key.get_secret_value()) < 32:
            raise ValueError("`audit_key` must be at least 32 characters")
        if self.shuffler_key is not None:
            keys = self.shuffler_key.get_secret_value().split()
            if not keys or any(len(key) < 32 for key in keys):
                raise ValueError("`shuffler_key` must be keys of at least 32 characters each")
        if (
            self.device_key_secret is not None
            and len(self.device_key_secret.get_secret_value()) < 32
        ):
            raise ValueError("`device_key_secret` must be at least 32 characters")
        return self

    def secret_path(self) -> Path:
        """Where the device-key secret's file is read from (and generated, on a new database)."""
        return self.secret_file or self.secrets_location() / SECRET_FILE

    def audit_key_path(self) -> Path:
        """Where the audit key's file is read from (and generated, on a new database)."""
        return self.audit_key_file or self.secrets_location() / AUDIT_KEY_FILE

    def shuffler_key_path(self) -> Path:
        """Where the shuffler key's file is read from (and generated, when none is recorded)."""
        return self.shuffler_key_file or self.secrets_location() / SHUFFLER_KEY_FILE

    def secrets_location(self) -> Path:
        """``secrets_dir``, or the default of :func:`default_secrets_dir`."""
        return self.secrets_dir if self.secrets_dir is not None else default_secrets_dir()


def setting_names() -> list[str]:
    """Every setting's variable: ``DPGOV_`` and the upper-case field name."""
    return [PREFIX + name.upper() for name in Settings.model_fields]


def default_secrets_dir() -> Path:
    """``$XDG_CONFIG_HOME/dp-governor`` (an absolute path, per the XDG spec), else ``~/.config``'s.

    The same for every command its user runs, wherever it runs.
    """
    base = os.environ.get("XDG_CONFIG_HOME", "")
    if base and Path(base).is_absolute():
        return Path(base) / "dp-governor"
    try:
        return Path.home() / ".config" / "dp-governor"
    except RuntimeError:
        raise KeyRefused(
            "there is no home folder for the default secrets directory: set DPGOV_SECRETS_DIR"
        ) from None


class KeyRefused(ValueError):
    """A key that is missing, unreadable or not the database's; the message names the setting."""


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
    ``adopt`` allows: :class:`dp_governor.api.device_secret.DeviceAdoption`, ``dpgov db upgrade``'s
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

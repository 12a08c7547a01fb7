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

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args, get_origin

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from dp_governor.api._unknown_settings import PREFIX, check_environment, check_no_null_lists
from dp_governor.policies.errors import error_message

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails
    from pydantic_settings import SettingsError

__all__ = [
    "AUDIT_KEY_FILE",
    "JOB_NAMES",
    "SECRET_FILE",
    "SHUFFLER_KEY_FILE",
    "JobName",
    "KeyRefused",
    "Settings",
    "default_secrets_dir",
    "setting_named",
    "setting_names",
    "setting_problem",
    "unparsed_setting",
]

# The jobs a scheduler can run, in the order ``api.jobs.JOBS`` declares them (a test checks).
JobName = Literal["flush-inbox", "aggregate", "purge", "checkpoint", "dashboard", "verify"]
JOB_NAMES: tuple[JobName, ...] = get_args(JobName)

SECRET_FILE = "dpgov.secret"
AUDIT_KEY_FILE = "dpgov-audit.key"
SHUFFLER_KEY_FILE = "dpgov-shuffler.key"


class Settings(BaseSettings):
    """Everything the service reads at start; nothing connects until the app's lifespan."""

    model_config = SettingsConfigDict(
        env_prefix="DPGOV_", extra="forbid", hide_input_in_errors=True
    )

    environment: Literal["development", "production"] = Field(
        default="development",
        description="`production` refuses to start without `device_key_secret`, `admin_token`"
        " and `database_url`.",
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
    checkpoint_seconds: int = Field(
        default=5,
        ge=1,
        description="Interval of the `checkpoint` job, which signs the audit log's head and the"
        " transparency log's checkpoint; a run with nothing new signs nothing, and a run's cost"
        " does not grow with the checkpoints stored (docs/performance.md). With 2, entries"
        " waited at most 1.6-4.7 s (PostgreSQL) and 2.3-6.7 s (SQLite) for a signed checkpoint"
        " under the relay's load on a busy 2-core machine.",
    )
    checkpoint_file: Path | None = Field(
        default=None,
        description="A file outside the database (another disk, host or bucket mount) that"
        " every signed checkpoint is appended to; `verify` checks the log against it, which"
        " catches a log truncated back to an earlier checkpoint. Created 0600. Unreadable, or"
        " missing once the database holds a checkpoint: `verify` fails naming it. Unset:"
        " checkpoints live only in the database.",
    )
    witnesses: list[str] = Field(
        default_factory=list,
        description="The witnesses the `checkpoint` job submits each new transparency-log"
        " checkpoint to (C2SP tlog-witness `add-checkpoint`), a JSON list of"
        ' `"<base URL> <witness vkey>"`, e.g.'
        ' `["https://w1.example witness.example/w1+1a2b3c4d+BA..."]`;'
        " their cosignatures are served with the checkpoint (docs/transparency.md). A witness"
        " that does not answer is logged, counted and tried again at the next run.",
    )
    tlog_origin: str = Field(
        default="dp-governor.invalid/tlog",
        description="The transparency log's origin, the first line of its checkpoints and its"
        " key's name (so its vkey), which witnesses tell logs apart by: a schema-less URL such as"
        " `dpgov.example.com/tlog` (C2SP tlog-checkpoint: no scheme, no spaces, no `+`). Fixed"
        " once the log has signed a checkpoint: a start under another origin is refused"
        " (docs/transparency.md#the-logs-origin).",
    )
    dashboard_seconds: int = Field(
        default=60,
        ge=1,
        description="Interval of the `dashboard` job, which computes the figures the dashboard"
        " and the public audit routes show (no request computes them).",
    )
    verify_seconds: int = Field(
        default=300,
        ge=1,
        description="Interval of the `verify` job, whose verification the dashboard and the"
        " metrics show.",
    )
    figures_wait_seconds: float = Field(
        default=2.0,
        ge=0,
        le=600,
        description="How long a public request waits for the audit figures when those stored"
        " predate the policies in force (or none exist yet); they are computed in the"
        " background, and the request answers 503 with `Retry-After` when they take longer.",
    )
    report_cache_seconds: float = Field(
        default=30.0,
        ge=0,
        description="How long an effective-epsilon report at a delta other than the policies'"
        " (admin only) is served again.",
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
        " fleets built before the field, and publishes the report schema with it optional. A"
        " wrong one is always refused, naming what differs (docs/api.md).",
    )
    admin_failures_per_minute: int = Field(
        default=20,
        ge=1,
        description="Wrong admin tokens a client address may send a minute before 429, counted"
        " by each worker on its own (N workers admit up to N times as many).",
    )
    scheduler: bool = Field(default=True, description="Run the scheduled jobs in this process.")
    scheduled_jobs: list[JobName] = Field(
        default_factory=lambda: list(JOB_NAMES),
        min_length=1,
        description="Which jobs this process's scheduler runs (with `DPGOV_SCHEDULER` on), a JSON"
        ' list, e.g. `["flush-inbox", "aggregate", "checkpoint"]` on the servers that take'
        ' reports and `["dashboard", "verify", "purge"]` on a host of their own, so the'
        " population passes take no core from the gate"
        " (docs/operations.md#production-on-postgresql). Every job runs under its lease"
        " whichever process schedules it.",
    )
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
    job_cpu: Literal["idle", "nice"] = Field(
        default="nice",
        description="The CPU priority of the service's job worker, the process that runs the"
        " population jobs (`dashboard`, `verify`, `purge`) and the figures' refresher: `nice`,"
        " the niceness `DPGOV_JOB_NICE` (it still takes a share of a busy core, so a lock it"
        " holds is released); `idle`, Linux's idle scheduling class (it runs only on a core"
        " nothing else wants, so on a saturated machine a write lock it holds can wait with it;"
        " other systems fall back to `DPGOV_JOB_NICE`). `dpgov jobs run` lowers its own"
        " priority as much for those jobs.",
    )
    job_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="How much nicer (Unix niceness, above the server's) the job worker runs,"
        " with either `DPGOV_JOB_CPU`: under `idle` it matters only where the idle class is"
        " not available. 0: the server's niceness (still out of its interpreter lock).",
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
        lists = [
            f"{PREFIX}{name.upper()}"
            for name, field in cls.model_fields.items()
            if get_origin(field.annotation) is list
        ]
        check_no_null_lists(os.environ, lists)
        return init_settings, env_settings, dotenv_settings, file_secret_settings

    @field_validator("scheduled_jobs")
    @classmethod
    def _each_job_once(cls, value: list[JobName]) -> list[JobName]:
        """A job named twice is a typo in a list an operator wrote, not two schedules."""
        twice = sorted({name for name in value if value.count(name) > 1})
        if twice:
            raise ValueError(f"each job at most once; named twice: {', '.join(twice)}")
        return value

    @field_validator("witnesses")
    @classmethod
    def _witnesses_are_url_and_key(cls, value: list[str]) -> list[str]:
        """Each entry is an http(s) URL and a cosignature verifier key, so a typo fails at start."""
        from dp_governor.mechanisms.signed_note import COSIGNATURE, NoteError, Verifier

        for entry in value:
            parts = entry.split()
            if len(parts) != 2 or not parts[0].startswith(("http://", "https://")):
                raise ValueError(f'each entry is "<http(s) URL> <witness vkey>", got {entry!r}')
            try:
                key = Verifier.parse(parts[1])
            except NoteError as exc:
                raise ValueError(f"{entry!r}: {exc}") from None
            if key.kind != COSIGNATURE:
                raise ValueError(f"{entry!r}: the key is not a witness (cosignature) key")
        return value

    @field_validator("tlog_origin")
    @classmethod
    def _origin_is_c2sp(cls, value: str) -> str:
        """A C2SP origin (also the key name): refused at start rather than at the first signing."""
        from dp_governor.mechanisms.signed_note import check_origin

        return check_origin(value)

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
        if self.environment == "production":  # every missing one named at once
            missing = [
                name
                for name, unset in (
                    ("device_key_secret", self.device_key_secret is None),
                    ("admin_token", self.admin_token is None),
                    # the default, a SQLite file in the current folder, is for trying it out
                    ("database_url", "database_url" not in self.model_fields_set),
                )
                if unset
            ]
            if missing:
                also = ", ".join(f"DPGOV_{name.upper()}" for name in missing[1:])
                raise ValueError(
                    f"`{missing[0]}` must be set in production"
                    + (f"; so must {also}" if also else "")
                )
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


def setting_named(loc: tuple[int | str, ...], given: Mapping[str, object]) -> str:
    """``invalid setting X``, X the setting at ``loc`` as the user set it.

    Its option if given here, else its variable; a check of several settings has no ``loc``.

    >>> setting_named(("job_nice",), {}), setting_named(("database_url",), {"database_url": 1})
    ('invalid setting DPGOV_JOB_NICE', 'invalid setting --database-url')
    >>> setting_named((), {})
    'invalid settings'
    """
    if not loc:
        return "invalid settings"
    field, rest = str(loc[0]), "".join(f"[{x}]" for x in loc[1:])
    name = f"--{field.replace('_', '-')}" if field in given else f"{PREFIX}{field.upper()}"
    return f"invalid setting {name}{rest}"


def setting_problem(error: ErrorDetails, given: Mapping[str, object]) -> str:
    """One validation error of the settings as one line naming the setting as the user set it.

    A check of several settings names the one at fault first (`` `audit_key` must be...``):
    that one is named as the user set it too.

    >>> setting_problem({"type": "value_error", "loc": (), "input": {},
    ...     "msg": "Value error, `audit_key` must be at least 32 characters"}, {})
    'invalid setting DPGOV_AUDIT_KEY: must be at least 32 characters'
    """
    loc, message = tuple(error["loc"]), error_message(error)
    first = re.fullmatch(r"`([a-z_]+)` (.+)", message)
    if not loc and first is not None and first[1] in Settings.model_fields:
        loc, message = (first[1],), first[2]
    return f"{setting_named(loc, given)}: {message}"


def unparsed_setting(exc: SettingsError, given: Mapping[str, object]) -> str:
    """A list or object setting that is not JSON, as one line naming the setting.

    >>> from pydantic_settings import SettingsError
    >>> print(unparsed_setting(SettingsError('error parsing value for field "witnesses"'), {}))
    invalid setting DPGOV_WITNESSES: not JSON (a list is JSON, e.g. '["URL VKEY"]')
    """
    field = re.search(r'field "([a-z_]+)"', str(exc))
    named = "invalid setting" if field is None else setting_named((field[1],), given)
    example = _LIST_EXAMPLES.get(field[1] if field else "", '["..."]')
    return f"{named}: not JSON (a list is JSON, e.g. '{example}')"


# What a list setting's value looks like, for the line that refuses one that is not JSON.
_LIST_EXAMPLES = {"witnesses": '["URL VKEY"]', "scheduled_jobs": '["checkpoint"]'}

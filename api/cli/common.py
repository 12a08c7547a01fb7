"""What the service commands share: settings, opening the database, refusing, progress."""

from __future__ import annotations

import enum
import gc
import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TextIO
from urllib.parse import quote

import typer

# Each command imports what it uses, so that `dpgov --help` and a read command start fast
# (benchmarks/startup.py): no FastAPI, scipy, dp-accounting or pyarrow unless the command needs it.
if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID
    from rich.status import Status
    from rich.table import Table

    from dp_governor.api._keys import ServiceKeys
    from dp_governor.api.settings import Settings
    from dp_governor.budget import Ledger


DatabaseOption = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        metavar="URL",
        help="Overrides DPGOV_DATABASE_URL (default: sqlite:///dpgov.sqlite, in this folder).",
    ),
]


@contextmanager
def long_lived_imports() -> Iterator[None]:
    """Import modules with the cyclic collector off, then keep them out of its scans.

    Modules, classes and functions live as long as the process. A collection while they load
    scans all that has loaded so far, and each later one would scan it again; frozen
    (``gc.freeze``), they are never scanned. The server does the same once it has started
    (:func:`dp_governor.api.app.lifespan`). About a quarter of a read command's CPU time. Frozen
    objects are never freed, so a process freezes once (a test process runs many commands).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:
            gc.freeze()
        if enabled:
            gc.enable()


def refuse_unknown_settings() -> None:
    """Exit 2 naming a ``DPGOV_`` variable that is no setting, before any command runs.

    A removed setting (``RETIRED``) is one warning line on stderr: the command runs.
    Every command, those that read no setting included: a typo must never pass for a default.
    The settings' names are imported only when some such variable is set (``--help`` stays light).
    """
    import os

    from dp_governor.api._unknown_settings import (
        PREFIX,
        SettingRefused,
        check_environment,
        retired_variables,
    )

    if not any(name.upper().startswith(PREFIX) for name in os.environ):
        return
    for warning in retired_variables(os.environ):
        typer.echo(f"Warning: {warning}", err=True)
    with long_lived_imports():
        from dp_governor.api.settings import setting_names
    try:
        check_environment(os.environ, setting_names())
    except SettingRefused as exc:
        refuse(str(exc))


def load_settings(database_url: str | None, **overrides: object) -> Settings:
    """Settings from the environment with command-line overrides; exits 2 on invalid values.

    The first thing every command with a database does: it loads the ledger's modules (the
    settings name its keys and their checks), through :func:`long_lived_imports`.
    """
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from dp_governor.api._unknown_settings import SettingRefused

    with long_lived_imports():
        from dp_governor.api.settings import Settings, setting_problem, unparsed_setting

    values = {k: v for k, v in overrides.items() if v is not None}
    if database_url is not None:
        values["database_url"] = database_url
    try:
        return Settings(**values)  # type: ignore[arg-type]
    except SettingRefused as exc:
        refuse(str(exc))
    except SettingsError as exc:  # a list or object setting that is not JSON
        refuse(unparsed_setting(exc, values))
    except ValidationError as exc:
        refuse(setting_problem(exc.errors()[0], values))


class Access(enum.Enum):
    """What a command may do to the database it opens (and to the keys beside it)."""

    CREATE = "create"  # serve, db init: the database, its tables and defaults; keys if new
    WRITE = "write"  # jobs run, policies apply: an existing database; records missing fingerprints
    READ = "read"  # everything else: changes nothing, creates nothing


def finite(
    low: float, high: float, *, open_low: bool = False, open_high: bool = False
) -> Callable[[str], float]:
    """A parser of a float option: a finite number in ``[low, high]`` (ends excluded if open).

    ``nan`` and ``inf`` are refused as not finite before the bounds, which NaN would fail with
    a misleading message (NaN compares false with every bound).

    >>> finite(0, 1, open_low=True)("0.5")
    0.5
    """

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise typer.BadParameter(f"must be a number, got {text!r}") from None
        if not math.isfinite(value):
            raise typer.BadParameter(f"must be a finite number, got {text!r}")
        if (
            value < low
            or value > high
            or (open_low and value == low)
            or (open_high and value == high)
        ):
            ends = f"{'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
            raise typer.BadParameter(f"must be in {ends}, got {value!r}")
        return value

    return parse


def file_path(text: str) -> Path:
    """A parser of a path option: refuses an empty one (an unset variable), never the folder ``.``.

    >>> file_path("ledger.jsonl")
    PosixPath('ledger.jsonl')
    """
    if not text.strip():
        raise typer.BadParameter("empty path")
    return Path(text)


def path_option(*names: str, **options: Any) -> Any:
    """A ``typer.Option`` that takes a path: :func:`file_path` parses it (empty: refused)."""
    return typer.Option(*names, parser=file_path, **options)


def path_argument(**options: Any) -> Any:
    """A ``typer.Argument`` that takes a path: :func:`file_path` parses it (empty: refused)."""
    return typer.Argument(parser=file_path, **options)


class Refused(Exception):
    """A refusal where it cannot be printed (a worker's): its line and exit code, to say after."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message, code)  # the arguments pickle: a worker's comes back whole
        self.message, self.code = message, code

    def __str__(self) -> str:
        return self.message


_RAISED: ContextVar[bool] = ContextVar("refusals_raised", default=False)


@contextmanager
def refusals_raised() -> Iterator[None]:
    """In the block, :func:`refuse` raises :class:`Refused` instead (this thread's context only)."""
    token = _RAISED.set(True)
    try:
        yield
    finally:
        _RAISED.reset(token)


def refuse(message: str, code: int = 2) -> NoReturn:
    """Print one error line and exit (2: what the command was given is wrong).

    Within :func:`refusals_raised`: raise :class:`Refused` for the command to say.
    """
    if _RAISED.get():
        raise Refused(message, code)
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(code)


def existing_database(url: str) -> str:
    """``url``, refused unless its database exists; SQLite opened ``mode=rw`` (never created).

    A relative SQLite path is relative to the current folder: the message names the absolute
    path, so that an operator in the wrong folder sees where the command looked.
    """
    from sqlalchemy import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        refuse(f"`database_url` must be a sqlite:// or postgresql:// URL, got {url!r}")
    if parsed.get_backend_name() != "sqlite":
        return url
    database = parsed.database or ""
    if database in ("", ":memory:"):
        refuse(f"{url!r} is an in-memory database, which holds no ledger: set DPGOV_DATABASE_URL")
    if database.startswith("file:"):  # already a SQLite URI: the operator chose its mode
        return url
    path = Path(database).resolve()
    if not path.is_file():
        refuse(
            f"no database at {path}: set DPGOV_DATABASE_URL (or --database-url) to the"
            " service's database, or run `dpgov db init` to create one there"
        )
    query = {**parsed.query, "mode": "rw", "uri": "true"}
    return parsed.set(database=f"file:{quote(str(path))}", query=query).render_as_string(
        hide_password=False
    )


def open_service(
    settings: Settings,
    access: Access = Access.READ,
    *,
    upgrade: bool | None = None,
    own_origin: bool = False,
) -> tuple[Ledger, ServiceKeys]:
    """The ledger and its checked keys; refuses (exit 2) anything that is not the service's.

    Only :attr:`Access.CREATE` creates a database, tables or key files (key files only for a
    database with no history); every access checks the keys against the recorded fingerprints.
    ``upgrade`` is passed to :func:`dp_governor.api.database.init_service_db` (``None``: the
    backend's rule, SQLite upgrades and PostgreSQL refuses an old schema; ``db init`` upgrades). A
    database that cannot be used is one line naming the setting (exit 1). A log whose checkpoints
    are signed under another origin than ``DPGOV_TLOG_ORIGIN`` is refused, unless ``own_origin``
    (a reader of several shards' ledgers, each its own log): then it is opened under its own.
    """
    from sqlalchemy import inspect

    from dp_governor.api._handles import policy_store
    from dp_governor.api._keys import NOT_INITIALISED, service_keys
    from dp_governor.api.settings import KeyRefused
    from dp_governor.budget import Ledger, create_db_engine

    url = (
        settings.database_url
        if access is Access.CREATE
        else existing_database(settings.database_url)
    )
    try:
        engine = create_db_engine(
            url, job_pause=settings.job_pause, job_lock_seconds=settings.job_lock_seconds
        )
    except ValueError as exc:
        refuse(_database_problem(settings.database_url, exc) or str(exc))
    try:
        if access is Access.WRITE and not inspect(engine).has_table("audit_log"):
            raise KeyRefused(NOT_INITIALISED)
        if access is Access.READ:  # a read neither creates nor upgrades: it refuses an old schema
            from dp_governor.api._schema_status import schema_status

            status = schema_status(engine)
            if status.ledger and not status.current:
                raise KeyRefused(f"this database's schema is {status.state()}")
        else:
            from dp_governor.api.database import init_service_db

            init_service_db(engine, upgrade=upgrade)
        keys = service_keys(
            settings, engine, generate=access is Access.CREATE, record=access is not Access.READ
        )
        ledger = Ledger(
            engine,
            keys.device_key_secret,
            audit_key=keys.audit_key,
            tlog_origin=settings.tlog_origin,
        )
        origin = ledger.tlog.origin_problem()
        signed = ledger.tlog.signed_origin() if origin is not None and own_origin else None
        if signed is not None:
            ledger = Ledger(
                engine, keys.device_key_secret, audit_key=keys.audit_key, tlog_origin=signed
            )
        elif origin is not None:
            raise KeyRefused(origin)
        if access is Access.CREATE:
            policy_store(ledger).ensure_defaults()
    except KeyRefused as exc:
        engine.dispose()
        refuse(str(exc))
    except Exception as exc:
        engine.dispose()
        problem = _database_problem(settings.database_url, exc)
        if problem is None:
            raise
        refuse(problem, 1)
    return ledger, keys


def _database_problem(url: str, exc: Exception) -> str | None:
    """:func:`dp_governor.api.database.database_problem`, imported only when there is a problem."""
    from dp_governor.api.database import database_problem

    return database_problem(url, exc)


def result_table(*columns: str, left: int = 2) -> Table:
    """A :class:`rich.table.Table` for a command's result: a header row, no frame.

    The first ``left`` columns (names, ranks) are left-aligned, the others (figures) right.
    Plain text in a pipe or a file; ``print_table`` writes it to stdout.
    """
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i < left else "right", no_wrap=True)
    return table


def print_table(table: Table) -> None:
    """Print ``table`` on stdout, as wide as it needs (a pipe is not cut to 80 columns)."""
    from rich.console import Console
    from rich.measure import Measurement

    console = Console(file=sys.stdout, highlight=False, soft_wrap=True)
    width = Measurement.get(console, console.options, table).maximum
    console.width = max(console.width if console.is_terminal else 0, width)
    console.print(table)


def open_ledger(
    settings: Settings, access: Access = Access.READ, *, own_origin: bool = False
) -> Ledger:
    """The ledger of :func:`open_service`, for commands that need no key themselves."""
    return open_service(settings, access, own_origin=own_origin)[0]


class Progress:
    """How far a long command has got, on stderr: rich's bar on a terminal, plain lines otherwise.

    Call it with ``(done, total)``: it is the ``Callable[[int, int], None]`` that the library's
    long functions take as ``progress``. On a terminal it is a :class:`rich.progress.Progress`
    (a bar, the count and the time left, redrawn in place, one row per step); in a pipe or a
    log it writes a plain line each time another tenth of the total is done (and at least every
    ``interval`` seconds when a tenth takes longer), so that a log shows the work moving
    without a line per item. :meth:`step` gives a callback for a named part of the work;
    :meth:`close` ends the bar, or writes the final count. Stdout stays the command's result.

    >>> import io
    >>> log = io.StringIO()
    >>> with Progress("export", "reports", stream=log) as progress:
    ...     for done in range(0, 101, 25):
    ...         progress(done, 100)
    >>> print(log.getvalue(), end="")
    export: 0 of 100 reports (0%)
    export: 25 of 100 reports (25%)
    export: 50 of 100 reports (50%)
    export: 75 of 100 reports (75%)
    export: 100 of 100 reports (100%)
    """

    _REDRAW = 0.1  # seconds between two bar redraws

    def __init__(
        self,
        label: str,
        unit: str,
        *,
        stream: TextIO | None = None,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.bar = self.stream.isatty()
        self.interval = interval
        self.clock = clock
        self.done = 0
        self.total: int | None = None
        self._tenth = -1  # the last tenth written as a plain line
        self._shown = clock()  # when the last line or bar was written (or the work began)
        self._started = False  # reported on since the start, or since the last close
        self._last: tuple[int, int | None] | None = None  # the count of the last plain line
        self._rich: RichProgress | None = None  # the terminal's bar, once drawn
        self._task: TaskID | None = None  # its row for the current label

    def step(self, label: str) -> Callable[[int, int], None]:
        """A callback for one named part of the work (the count starts again under its name)."""

        def report(done: int, total: int) -> None:
            if label != self.label:
                self._end_row()
                self.label, self.done, self.total = label, 0, None
            self(done, total)

        return report

    def __call__(self, done: int, total: int | None = None) -> None:
        """Record that ``done`` of ``total`` units are done (``None``: the total is unknown)."""
        self.done, self.total, self._started = done, total, True
        now = self.clock()
        if self.bar:
            if self._task is None or now - self._shown >= self._REDRAW or done == total:
                self._draw(now)
            return
        # a line per tenth of a known total; at least every `interval` seconds either way
        tenth = self._tenth if total is None else 10 if not total else 10 * done // total
        if tenth > self._tenth or now - self._shown >= self.interval:
            self._tenth = tenth
            self._write(now)

    def close(self) -> None:
        """End the bar, or write the final count unless the last line showed it."""
        if self.bar:
            if self._rich is not None:
                self._draw(self.clock())
                self._rich.stop()
                self._rich, self._task = None, None
        elif self._started and self._last != (self.done, self.total):
            self._write(self.clock())
        self._started, self._tenth, self._shown, self._last = False, -1, self.clock(), None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _end_row(self) -> None:
        """Finish the current label: its bar row stays on screen, its plain count is written."""
        if self.bar:
            if self._task is not None:
                self._draw(self.clock())
            self._task = None
        else:
            self.close()

    def _count(self) -> str:
        if self.total is None:
            return f"{self.done:,d} {self.unit}"
        share = 100 if not self.total else 100 * self.done // self.total
        return f"{self.done:,d} of {self.total:,d} {self.unit} ({share}%)"

    def _write(self, now: float) -> None:
        self.stream.write(f"{self.label}: {self._count()}\n")
        self.stream.flush()
        self._shown, self._last = now, (self.done, self.total)

    def _draw(self, now: float) -> None:
        """Redraw the terminal's bar (rich, refreshed here: the clock is the injected one)."""
        from rich.console import Console
        from rich.progress import BarColumn, TextColumn, TimeRemainingColumn
        from rich.progress import Progress as Bars

        if self._rich is None:
            self._rich = Bars(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[count]}"),
                TimeRemainingColumn(),
                console=Console(file=self.stream, force_terminal=True),
                auto_refresh=False,
                get_time=self.clock,
            )
            self._rich.start()
        if self._task is None:
            self._task = self._rich.add_task(self.label, total=self.total, count="")
        total = None if self.total is None else max(self.total, 1)
        done = 1 if self.total == 0 else self.done
        self._rich.update(self._task, completed=done, total=total, count=self._count())
        self._rich.refresh()
        self._shown = now


class Stages:
    """The parts of a long command that give no count, on stderr, each with the time it took.

    Call it with the name of the part that starts (``stages("the chain")``). On a terminal,
    a rich spinner names the part under way and a line is left for each part done; in a pipe
    or a log, a line when each part starts and one with the total time at :meth:`close`.

    >>> import io
    >>> clock = iter([0.0, 1.5, 1.5, 4.0]).__next__
    >>> log = io.StringIO()
    >>> with Stages("audit verify", stream=log, clock=clock) as stages:
    ...     stages("the chain")
    ...     stages("the sketches")
    >>> print(log.getvalue(), end="")
    audit verify: the chain...
    audit verify: the chain: 1.5 s
    audit verify: the sketches...
    audit verify: the sketches: 2.5 s
    """

    def __init__(
        self,
        label: str,
        *,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self._current: tuple[str, float] | None = None
        self._status: Status | None = None
        self._console: Console | None = None
        if self.stream.isatty():
            from rich.console import Console

            self._console = Console(file=self.stream, force_terminal=True, highlight=False)

    def __call__(self, stage: str) -> None:
        """``stage`` starts (the one under way, if any, is done)."""
        self._end()
        self._current = (stage, self.clock())
        if self._console is None:
            self.stream.write(f"{self.label}: {stage}...\n")
            self.stream.flush()
        elif self._status is None:
            self._status = self._console.status(f"{self.label}: {stage}...")
            self._status.start()
        else:
            self._status.update(f"{self.label}: {stage}...")

    def _end(self) -> None:
        if self._current is None:
            return
        stage, began = self._current
        line = f"{self.label}: {stage}: {self.clock() - began:.1f} s"
        if self._console is None:
            self.stream.write(line + "\n")
            self.stream.flush()
        else:
            self._console.print(line)
        self._current = None

    def close(self) -> None:
        """The part under way is done; the spinner stops."""
        self._end()
        if self._status is not None:
            self._status.stop()
            self._status = None

    def __enter__(self) -> Stages:
        return self

    def __exit__(self, error: type[BaseException] | None, *exc: object) -> None:
        if error is not None:
            self._current = None  # stopped, not done: the error says why
        self.close()

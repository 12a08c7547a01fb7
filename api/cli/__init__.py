"""The ``dpgov`` command line."""

from __future__ import annotations

import enum
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn
from urllib.parse import quote

import numpy as np
import typer
from pydantic import TypeAdapter, ValidationError
from sqlalchemy import inspect, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from api.database import init_service_db
from api.demo.simulation import (
    default_mechanism,
    emoji_vocabulary,
    made_up_words,
    simulate_frequency,
    zipf_indices,
)
from api.ingestion.ingest import Ingestor, params_hash
from api.integrity import kept_checkpoints, verify_service
from api.jobs import JOBS, RUNTIMES, Runtime, lease_holder, lease_of, release_job, run_job
from api.settings import NOT_INITIALISED, KeyRefused, ServiceKeys, Settings, service_keys
from budget import (
    InvalidRequest,
    Ledger,
    PolicyConflict,
    SystemClock,
    UnknownUseCase,
    create_db_engine,
    utc_day,
)
from budget.audit_log import write_checkpoints
from budget.reporting.export import export_ledger, read_export, report_from_export
from budget.reporting.report import EffectiveEpsilonReport, render_text
from budget.reporting.views import what_if
from mechanisms import CMS, HCMS, SFP
from mechanisms.empirical_audit import audit, exact_max_log_ratio
from policies import (
    Policy,
    PolicyBase,
    PolicyCreate,
    PolicyFileError,
    default_policies,
    dump_policies,
    load_policies,
    mechanism_for,
)

app = typer.Typer(
    name="dpgov",
    help="dp-governor: privacy accounting and budget governance for local-DP telemetry.",
    no_args_is_help=True,
    add_completion=False,
)


class UseCase(enum.StrEnum):
    """The collections ``dpgov simulate`` can run, with Apple's published parameters."""

    emoji = "emoji"
    safari = "safari"
    quicktype = "quicktype"


@app.callback()
def _root() -> None:
    """dp-governor: privacy accounting and budget governance for local-DP telemetry."""


@app.command()
def simulate(
    use_case: Annotated[
        UseCase, typer.Option("--use-case", "-u", help="Which collection to simulate.")
    ] = UseCase.emoji,
    devices: Annotated[
        int,
        typer.Option("--devices", "-n", min=1, max=100_000_000, help="Devices, one report each."),
    ] = 1_000_000,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the simulation's generator.")] = 7,
    hash_seed: Annotated[int, typer.Option(min=0, help="Seed of the shared hash family.")] = 0,
    exponent: Annotated[float, typer.Option(min=0.0, max=10.0, help="Zipf exponent.")] = 1.1,
    top: Annotated[int, typer.Option(min=1, max=1000, help="How many items to print.")] = 10,
) -> None:
    """Simulate a fleet privatizing with the real mechanism; print the top estimates and truth."""
    rng = np.random.default_rng(seed)
    mechanism = default_mechanism(use_case.value, hash_seed)
    if isinstance(mechanism, SFP):
        _simulate_sfp(mechanism, devices, exponent, top, rng)
        return
    if use_case is UseCase.emoji:
        vocabulary = emoji_vocabulary()
    else:
        vocabulary = [f"www.domain{i}.example" for i in range(250_000)]
    _print_header(mechanism, devices, len(vocabulary))
    result = simulate_frequency(mechanism, vocabulary, devices, exponent=exponent, rng=rng, top=top)
    print(f"{'rank':>4}  {'item':<24} {'true count':>11} {'estimate':>11} {'95% +-':>9}  true rank")
    for row in result.top:
        true_rank = result.true_top.index(row.item) + 1 if row.item in result.true_top else "-"
        print(
            f"{row.rank:>4}  {row.item:<24} {row.true_count:>11,d} {row.estimate:>11,.0f}"
            f" {1.96 * row.stderr:>9,.0f}  {true_rank}"
        )
    hits = len(set(result.true_top) & {r.item for r in result.top})
    print(f"\n{hits}/{top} of the true top {top} recovered.")
    _print_timing(result.seconds, devices)
    _print_spend(mechanism.epsilon)


def _print_header(mechanism: CMS | HCMS | SFP, devices: int, d: int) -> None:
    if isinstance(mechanism, SFP):
        params = (
            f"SFP eps={mechanism.epsilon_word:g}+{mechanism.epsilon_fragment:g},"
            f" k={mechanism.k}, m={mechanism.m},"
            f" k'={mechanism.k_fragment}, m'={mechanism.m_fragment}"
        )
    else:
        name = mechanism.name.upper()
        params = f"{name} eps={mechanism.epsilon:g}, k={mechanism.k}, m={mechanism.m}"
    print(f"Simulating {devices:,d} devices, {d:,d} possible values, {params}.\n")


def _print_timing(seconds: dict[str, float], devices: int) -> None:
    parts = ", ".join(f"{k} {v:.2f} s" for k, v in seconds.items())
    print(f"Timing ({devices:,d} reports): {parts}.")


def _print_spend(epsilon: float) -> None:
    print(
        f"Each report is {epsilon:g}-LDP (the mechanism's parameter). This simulation keeps no"
        " ledger; `dpgov demo` charges every report to a real one and prints the spend."
    )


def _simulate_sfp(
    sfp: SFP, devices: int, exponent: float, top: int, rng: np.random.Generator
) -> None:
    words = made_up_words(5000, rng=rng)
    _print_header(sfp, devices, len(words))
    t0 = time.perf_counter()
    index = zipf_indices(len(words), devices, exponent, rng=rng)
    truth = np.bincount(index, minlength=len(words))
    reports = sfp.privatize(np.asarray(words, dtype=object)[index], rng=rng)
    t1 = time.perf_counter()
    sketch = sfp.sketch().add(reports)
    t2 = time.perf_counter()
    found = sketch.discover_detailed()
    t3 = time.perf_counter()
    position = {w: i for i, w in enumerate(words)}
    true_top = [words[i] for i in np.argsort(-truth, kind="stable")[:top].tolist()]
    print(f"{'rank':>4}  {'discovered word':<12} {'true count':>11} {'estimate':>11} {'95% +-':>9}")
    for r, d in enumerate(found[:top], start=1):
        true_count = int(truth[position[d.word]]) if d.word in position else 0
        print(f"{r:>4}  {d.word:<12} {true_count:>11,d} {d.count:>11,.0f} {1.96 * d.stderr:>9,.0f}")
    hits = len(set(true_top) & {d.word for d in found})
    print(f"\n{len(found)} words discovered; {hits}/{top} of the true top {top} among them.")
    _print_timing({"privatize": t1 - t0, "aggregate": t2 - t1, "discover": t3 - t2}, devices)
    _print_spend(sfp.epsilon)


@app.command()
def demo(
    devices: Annotated[
        int, typer.Option(min=100, max=1_000_000, help="Simulated devices.")
    ] = 20_000,
    days: Annotated[int, typer.Option(min=1, max=30, help="Days of collection.")] = 3,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the simulation.")] = 7,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            help="Write into this database (the one `dpgov serve` uses, with the same keys)"
            " so that its dashboard shows the demo; default: a temporary database.",
        ),
    ] = None,
) -> None:
    """Start the service on a database, run a fleet over real HTTP, show the results."""
    from api.demo.demo import demo_reports, run_demo

    settings = None if database_url is None else _settings(database_url)
    where = "a temporary database" if settings is None else "the database given"
    typer.echo(
        f"Simulating {devices:,d} devices over {days} days (emoji + new words), over HTTP,"
        f" into {where}."
    )
    with typer.progressbar(length=demo_reports(devices, days), label="submitting") as bar:
        try:
            result = run_demo(devices, days, seed=seed, progress=bar.update, settings=settings)
        except RuntimeError as exc:
            _refuse(f"{exc} (check --database-url and the keys beside it)")
    true_top = sorted(result.emoji_truth, key=lambda k: -result.emoji_truth[k])[:10]
    print(
        f"\n{result.accepted:,d} of {result.submitted:,d} reports accepted, {result.refused:,d}"
        f" refused by a cap ({result.seconds:.0f} s)."
    )
    print("\nEmoji (CMS, eps 4): estimated top 10 beside the truth")
    print(f"{'rank':>4}  {'emoji':<6} {'estimate':>10} {'95% +-':>8} {'true':>8}  true rank")
    for rank, e in enumerate(result.emoji_top, start=1):
        true_rank = true_top.index(e["item"]) + 1 if e["item"] in true_top else "-"
        print(
            f"{rank:>4}  {e['item']:<6} {e['count']:>10,.0f} {1.96 * e['stderr']:>8,.0f}"
            f" {result.emoji_truth[e['item']]:>8,d}  {true_rank}"
        )
    print("\nQuickType new words (SFP, eps 2 + 6): discovered without a dictionary")
    for d in result.words:
        print(
            f"  {d['word']:<12} {d['count']:>9,.0f} +- {1.96 * d['stderr']:,.0f}"
            f"   true {result.word_truth.get(d['word'], 0):,d}"
        )
    alike = "the same for every demo device: a refused report spends nothing"
    print(f"\nPrivacy spent by {result.spend_device}, from its ledger ({alike}):")
    for row in result.spend:
        print(
            f"  {row['use_case']:<12} {row['epsilon_lifetime']:>5g} in {result.days} days"
            f" (window {row['epsilon_window']:g}); "
            + (
                "no window or lifetime cap: unbounded over time"
                if row["window_cap"] is None and row["lifetime_cap"] is None
                else f"caps: window {row['window_cap']}, lifetime {row['lifetime_cap']}"
            )
        )
    report = TypeAdapter(EffectiveEpsilonReport).validate_python(result.effective_epsilon)
    print()
    print(render_text(report), end="")
    chain = result.audit
    print(
        f"\nAudit log: {'verified' if chain['ok'] else 'FAILED: ' + str(chain['problem'])},"
        f" {chain['entries']:,d} entries, signed checkpoint at entry"
        f" {chain['latest_checkpoint_seq']}."
    )
    if settings is not None:
        print("\n`dpgov serve` on this database shows all of it on its dashboard, at `/`.")


# -- service commands -----------------------------------------------------------------------------

DatabaseOption = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help="Overrides DPGOV_DATABASE_URL (default: sqlite:///dpgov.sqlite, in this folder).",
    ),
]


def _settings(database_url: str | None, **overrides: object) -> Settings:
    """Settings from the environment with command-line overrides; exits 2 on invalid values."""
    try:
        values = {k: v for k, v in overrides.items() if v is not None}
        if database_url is not None:
            values["database_url"] = database_url
        return Settings(**values)  # type: ignore[arg-type]
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"]) or "settings"
        typer.echo(f"Error: invalid setting `{field}`: {err['msg']}", err=True)
        raise typer.Exit(2) from None


class Access(enum.Enum):
    """What a command may do to the database it opens (and to the keys beside it)."""

    CREATE = "create"  # serve, db init: the database, its tables and defaults; keys if new
    WRITE = "write"  # jobs run, policies apply: an existing database; records missing fingerprints
    READ = "read"  # everything else: changes nothing, creates nothing


def _refuse(message: str, code: int = 2) -> NoReturn:
    """Print one error line and exit (2: what the command was given is wrong)."""
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(code)


def _existing_database(url: str) -> str:
    """``url``, refused unless its database exists; SQLite opened ``mode=rw`` (never created).

    A relative SQLite path is relative to the current folder: the message names the absolute
    path, so that an operator in the wrong folder sees where the command looked.
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        _refuse(f"`database_url` must be a sqlite:// or postgresql:// URL, got {url!r}")
    if parsed.get_backend_name() != "sqlite":
        return url
    database = parsed.database or ""
    if database in ("", ":memory:"):
        _refuse(f"{url!r} is an in-memory database, which holds no ledger: set DPGOV_DATABASE_URL")
    if database.startswith("file:"):  # already a SQLite URI: the operator chose its mode
        return url
    path = Path(database).resolve()
    if not path.is_file():
        _refuse(
            f"no database at {path}: set DPGOV_DATABASE_URL (or --database-url) to the"
            " service's database, or run `dpgov db init` to create one there"
        )
    query = {**parsed.query, "mode": "rw", "uri": "true"}
    return parsed.set(database=f"file:{quote(str(path))}", query=query).render_as_string(
        hide_password=False
    )


def _open(settings: Settings, access: Access = Access.READ) -> tuple[Ledger, ServiceKeys]:
    """The ledger and its checked keys; refuses (exit 2) anything that is not the service's.

    Only :attr:`Access.CREATE` creates a database, tables or key files (key files only for a
    database with no history); every access checks the keys against the recorded fingerprints.
    """
    url = (
        settings.database_url
        if access is Access.CREATE
        else _existing_database(settings.database_url)
    )
    try:
        engine = create_db_engine(url)
    except ValueError as exc:
        _refuse(str(exc))
    try:
        if access is Access.WRITE and not inspect(engine).has_table("audit_log"):
            raise KeyRefused(NOT_INITIALISED)
        if access is not Access.READ:
            init_service_db(engine)
        keys = service_keys(
            settings, engine, generate=access is Access.CREATE, record=access is not Access.READ
        )
        ledger = Ledger(engine, keys.device_key_secret, audit_key=keys.audit_key)
        if access is Access.CREATE:
            ledger.policies.ensure_defaults()
    except KeyRefused as exc:
        engine.dispose()
        _refuse(str(exc))
    except DBAPIError as exc:
        engine.dispose()
        shown = make_url(settings.database_url).render_as_string(hide_password=True)
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
        _refuse(f"cannot use the database {shown}: {reason}", 1)
    return ledger, keys


def _ledger(settings: Settings, access: Access = Access.READ) -> Ledger:
    """The ledger of :func:`_open`, for commands that need no key themselves."""
    return _open(settings, access)[0]


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Interface to bind (DPGOV_HOST).")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="Port (DPGOV_PORT).")] = None,
    workers: Annotated[int, typer.Option(min=1, max=64, help="Worker processes.")] = 1,
    database_url: DatabaseOption = None,
) -> None:
    """Run the HTTP service; creates the database and its keys if new (docs/operations.md)."""
    import uvicorn

    from api.server import serve_options

    settings = _settings(database_url, host=host, port=port)
    ledger, keys = _open(settings, Access.CREATE)  # tables, defaults, keys: once, up front
    ledger.engine.dispose()
    os.environ["DPGOV_DATABASE_URL"] = settings.database_url  # the workers read the same
    os.environ["DPGOV_SECRET_FILE"] = str(settings.secret_path().resolve())
    os.environ["DPGOV_AUDIT_KEY_FILE"] = str(settings.audit_key_path().resolve())
    typer.echo(f"device-key secret from {keys.sources[0]}, audit key from {keys.sources[1]}")
    typer.echo(f"dp-governor on http://{settings.host}:{settings.port} (docs at /docs)")
    uvicorn.run(
        "api.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=workers,
        log_level="info",
        access_log=False,  # access lines carry client addresses: never on the report path
        **serve_options(settings),  # read deadlines, keep-alive, header cap, concurrency limit
    )


db_app = typer.Typer(help="Create the service's database and keys.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("init")
def db_init(database_url: DatabaseOption = None) -> None:
    """Create the database, its tables, Apple's default policies and its keys (if new).

    On an existing database: record the fingerprints of the keys in use if it has none yet,
    else check the keys against them. Idempotent.
    """
    settings = _settings(database_url)
    ledger, keys = _open(settings, Access.CREATE)
    ledger.engine.dispose()
    shown = make_url(settings.database_url).render_as_string(hide_password=True)
    typer.echo(
        f"{shown}: ready; device-key secret from {keys.sources[0]}, audit key from"
        f" {keys.sources[1]}; their fingerprints are recorded in the database"
    )


jobs_app = typer.Typer(help="Run scheduled jobs now.", no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")


@jobs_app.command("run")
def jobs_run(
    name: Annotated[str, typer.Argument(help="flush-inbox, aggregate, purge or checkpoint.")],
    database_url: DatabaseOption = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Take the job's lease from whoever holds it (a crashed process)."
        ),
    ] = False,
) -> None:
    """Run one scheduled job against the configured database and print its result."""
    if name not in JOBS:
        typer.echo(f"Error: unknown job {name!r}; jobs: {', '.join(JOBS)}", err=True)
        raise typer.Exit(2)
    settings = _settings(database_url)
    ledger, keys = _open(settings, Access.WRITE)
    key = f"cli-{name}"
    RUNTIMES[key] = Runtime(
        ledger,
        Ingestor(ledger, keys.device_key_secret),
        SystemClock(),
        settings.shuffle_batch,
        min_batch=settings.flush_min_batch,
        lease_seconds=settings.job_lease_seconds,
        checkpoint_file=settings.checkpoint_file,
    )
    try:
        result = run_job(name, key, force=force)
        held = None if result is not None else lease_holder(ledger.engine, lease_of(name))
    finally:
        RUNTIMES.pop(key, None)
        ledger.engine.dispose()
    if result is None:
        by = "" if held is None else f" ({held[0]} holds its lease for {held[1]:.0f} s more)"
        typer.echo(
            f"Error: job {name!r} is running in another process{by}; if that process is gone,"
            f" `dpgov jobs run {name} --force` runs it now",
            err=True,
        )
        raise typer.Exit(1)
    typer.echo(json.dumps({"job": name, "result": result}))


@jobs_app.command("release")
def jobs_release(
    name: Annotated[str, typer.Argument(help="flush-inbox, aggregate, purge or checkpoint.")],
    database_url: DatabaseOption = None,
) -> None:
    """Clear a job's lease whoever holds it, so the next run need not wait for it to expire."""
    if name not in JOBS:
        typer.echo(f"Error: unknown job {name!r}; jobs: {', '.join(JOBS)}", err=True)
        raise typer.Exit(2)
    ledger = _ledger(_settings(database_url))
    try:
        released = release_job(ledger.engine, name)
    finally:
        ledger.engine.dispose()
    typer.echo(json.dumps({"job": name, "lease": lease_of(name), "released": released}))


audit_app = typer.Typer(help="Verify and export the audit log.", no_args_is_help=True)
app.add_typer(audit_app, name="audit")


@audit_app.command("verify")
def audit_verify(
    checkpoints: Annotated[
        Path | None,
        typer.Option(
            help="Checkpoints kept outside the database (default: the `checkpoint_file`"
            " setting); a log truncated back to an earlier one fails."
        ),
    ] = None,
    database_url: DatabaseOption = None,
) -> None:
    """Check the audit chain and the state the gate decides on; exit 1 naming what fails."""
    settings = _settings(database_url)
    path = checkpoints or settings.checkpoint_file
    if checkpoints is not None and not checkpoints.exists():
        _refuse(f"no checkpoint file at {checkpoints}")
    try:
        kept = kept_checkpoints(path)
    except ValueError as exc:
        _refuse(str(exc))
    ledger = _ledger(settings)
    try:
        result = verify_service(ledger, now=datetime.now(UTC), kept=kept)
    finally:
        ledger.engine.dispose()
    typer.echo(json.dumps(result.to_dict(), indent=2))
    if not result.ok:
        where = "" if result.first_bad is None else f" at entry {result.first_bad}"
        _refuse(f"the audit log fails{where}: {result.problem}", 1)


@audit_app.command("checkpoints")
def audit_checkpoints(
    output: Annotated[
        Path, typer.Option("--output", "-o", help="File to append the signed checkpoints to.")
    ],
    database_url: DatabaseOption = None,
) -> None:
    """Copy the signed checkpoints out of the database (keep the file somewhere else)."""
    ledger = _ledger(_settings(database_url))
    try:
        added = write_checkpoints(ledger.audit.checkpoints(), output)
    finally:
        ledger.engine.dispose()
    typer.echo(f"{added} new checkpoint(s) appended to {output}")


@audit_app.command("report")
def audit_report(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    delta: Annotated[
        float | None, typer.Option(help="Delta of the tight bounds (default: the policies').")
    ] = None,
    database_url: DatabaseOption = None,
) -> None:
    """The effective-epsilon report: what each policy allows and what devices spent."""
    if delta is not None and not 0 < delta < 1:
        typer.echo(f"Error: --delta must be in (0, 1), got {delta!r}", err=True)
        raise typer.Exit(2)
    ledger = _ledger(_settings(database_url))
    try:
        report = ledger.effective_epsilon(now=SystemClock().now(), delta=delta)
    finally:
        ledger.engine.dispose()
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        typer.echo(render_text(report), nl=False)


@audit_app.command("export")
def audit_export(
    out: Annotated[Path, typer.Option("--out", "-o", help="File to write.")],
    fmt: Annotated[str, typer.Option("--format", help="jsonl or csv.")] = "jsonl",
    database_url: DatabaseOption = None,
) -> None:
    """Export the ledger (policies, charges, lifetime totals) to recompute the report offline."""
    if fmt not in ("jsonl", "csv"):
        typer.echo(f"Error: --format must be jsonl or csv, got {fmt!r}", err=True)
        raise typer.Exit(2)
    ledger = _ledger(_settings(database_url))
    try:
        with out.open("w", encoding="utf-8", newline="") as handle:
            n = export_ledger(ledger, handle, fmt=fmt, now=SystemClock().now())  # type: ignore[arg-type]
    except OSError as exc:
        typer.echo(f"Error: cannot write {out}: {exc.strerror}", err=True)
        raise typer.Exit(1) from None
    finally:
        ledger.engine.dispose()
    typer.echo(f"{n} records written to {out}")


@audit_app.command("recompute")
def audit_recompute(
    file: Annotated[Path, typer.Argument(help="An export written by `dpgov audit export`.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Recompute the effective-epsilon report from an export, offline (no database)."""
    try:
        report = report_from_export(read_export(file))
    except (OSError, ValueError) as exc:
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        typer.echo(render_text(report), nl=False)


class AggregateEngine(enum.StrEnum):
    """Where ``dpgov aggregate`` folds the partitions."""

    local = "local"
    dask = "dask"


def _day_number(value: datetime | None, default: int) -> int:
    return utc_day(value.replace(tzinfo=UTC)) if value is not None else default


@app.command()
def aggregate(
    use_case: Annotated[str, typer.Argument(help="The use case whose reports to aggregate.")],
    start: Annotated[
        datetime | None,
        typer.Option("--from", formats=["%Y-%m-%d"], help="First UTC day (default: window start)."),
    ] = None,
    end: Annotated[
        datetime | None,
        typer.Option("--to", formats=["%Y-%m-%d"], help="Last UTC day (default: today)."),
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Parquet dataset directory.")] = Path(
        "dpgov-parquet"
    ),
    engine: Annotated[
        AggregateEngine, typer.Option(help="local: this process; dask: a Dask cluster.")
    ] = AggregateEngine.local,
    scheduler: Annotated[
        str | None,
        typer.Option(help="Dask scheduler address (default: start a LocalCluster)."),
    ] = None,
    workers: Annotated[int, typer.Option(min=1, max=256, help="LocalCluster workers.")] = 2,
    rows_per_file: Annotated[
        int, typer.Option(min=1, help="Reports per Parquet file (bounds a task's memory).")
    ] = 1_000_000,
    export: Annotated[
        bool, typer.Option(help="Export the report store first (--no-export: reuse --out).")
    ] = True,
    sketch_file: Annotated[
        Path | None, typer.Option("--sketch", help="Write the merged sketch here (.npz).")
    ] = None,
    database_url: DatabaseOption = None,
) -> None:
    """Export stored reports to Parquet and aggregate them into one sketch (local or Dask)."""
    from api.ingestion.distributed import DaskOptions, aggregate_files
    from api.ingestion.parquet import dataset_files, export_reports
    from api.ingestion.pipeline import mechanisms_by_params, sketch_digest, sketch_to_bytes

    if scheduler is not None and engine is not AggregateEngine.dask:
        typer.echo("Error: --scheduler needs --engine dask", err=True)
        raise typer.Exit(2)
    ledger = _ledger(_settings(database_url))
    try:
        try:
            policy = ledger.policies.get(use_case)
        except UnknownUseCase:
            typer.echo(f"Error: unknown use case {use_case!r}", err=True)
            raise typer.Exit(1) from None
        today = utc_day(SystemClock().now())
        first = _day_number(start, today - policy.retention_days + 1)
        last = _day_number(end, today)
        if first > last:
            typer.echo("Error: --from must not be after --to", err=True)
            raise typer.Exit(2)
        mechanism = mechanism_for(policy)
        params = params_hash(mechanism)
        t0 = time.perf_counter()
        exported = None
        if export:
            try:
                exported = export_reports(
                    ledger.engine,
                    out,
                    use_case,
                    first,
                    last,
                    mechanisms_by_params(ledger, use_case),
                    rows_per_file=rows_per_file,
                )
            except OSError as exc:
                typer.echo(f"Error: cannot write {out}: {exc.strerror}", err=True)
                raise typer.Exit(1) from None
    finally:
        ledger.engine.dispose()
    t1 = time.perf_counter()
    files = dataset_files(out, use_case, range(first, last + 1), params)
    try:
        sketch = aggregate_files(
            mechanism,
            files,
            engine=engine.value,
            dask=DaskOptions(scheduler=scheduler, workers=workers),
        )
    except (OSError, ValueError) as exc:
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(1) from None
    t2 = time.perf_counter()
    if sketch_file is not None:
        sketch_file.write_bytes(sketch_to_bytes(sketch))
    other = sorted({p for (_, p) in exported.partitions if p != params} if exported else set())
    summary = {
        "use_case": use_case,
        "days": [first, last],
        "params": params,
        "engine": engine.value,
        "exported": exported.rows if exported else None,
        "files": len(files),
        "reports": sketch.n,
        "sketch_sha256": sketch_digest(sketch),
        "sketch_file": str(sketch_file) if sketch_file else None,
        "other_params_skipped": other,
        "seconds": {"export": round(t1 - t0, 3), "aggregate": round(t2 - t1, 3)},
    }
    typer.echo(json.dumps(summary, indent=2))


policies_app = typer.Typer(
    help="List, show, apply and export use-case policies.", no_args_is_help=True
)
app.add_typer(policies_app, name="policies")


@policies_app.command("list")
def policies_list(database_url: DatabaseOption = None) -> None:
    """The current policies, one line each."""
    ledger = _ledger(_settings(database_url))
    print(
        f"{'use case':<24} {'mech':<5} {'eps':>5} {'/day':>4} {'eps/day':>7} {'window':>6}  budget"
    )
    for p in ledger.policies.list():
        print(
            f"{p.name:<24} {p.mechanism:<5} {p.epsilon_per_report:>5g} {p.max_reports_per_day:>4}"
            f" {p.epsilon_per_report * p.max_reports_per_day:>7g} {p.retention_days:>5}d"
            f"  {p.budget_group or p.name}"
        )


@policies_app.command("show")
def policies_show(
    name: Annotated[str, typer.Argument(help="The use case.")], database_url: DatabaseOption = None
) -> None:
    """One policy as YAML, with its version."""
    ledger = _ledger(_settings(database_url))
    try:
        policy = ledger.policies.get(name)
    except UnknownUseCase:
        typer.echo(f"Error: unknown use case {name!r}", err=True)
        raise typer.Exit(1) from None
    print(f"# version {policy.version}, {policy.created_at:%Y-%m-%d %H:%M} UTC by {policy.actor}")
    print(dump_policies([policy]), end="")


@policies_app.command("apply")
def policies_apply(
    file: Annotated[Path, typer.Argument(help="A .yaml, .yml or .toml file of policies.")],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print each change and its what-if; write nothing.")
    ] = False,
    allow_loosen: Annotated[
        bool,
        typer.Option(
            "--allow-loosen",
            help="Allow raising or removing a cap, raising epsilon or shortening retention.",
        ),
    ] = False,
    database_url: DatabaseOption = None,
) -> None:
    """Create or update every policy of a complete file; print each change and its what-if first.

    Loosening (a daily, window or lifetime cap raised or removed, an epsilon raised, retention
    shortened) needs --allow-loosen. Nothing is written unless every check passes; --dry-run
    runs them all and writes nothing.
    """
    try:
        policies = load_policies(file)
    except PolicyFileError as exc:
        _refuse(f"{file}: {exc}", 1)
    ledger = _ledger(_settings(database_url), Access.READ if dry_run else Access.WRITE)
    try:
        problems, loosening, changed = _review(ledger, policies, now=SystemClock().now())
        if problems:
            _refuse("; ".join(problems), 1)
        if loosening and not allow_loosen:
            _refuse(
                f"these changes loosen a policy and need --allow-loosen: {'; '.join(loosening)}", 1
            )
        if dry_run or not changed:
            print(f"{'dry run: ' if dry_run else ''}{len(changed)} change(s), nothing written")
            return
        for policy in changed:
            try:
                stored = ledger.policies.apply(policy, actor="cli")
            except PolicyConflict as exc:  # a concurrent change since the review
                _refuse(f"{policy.name}: {exc}", 1)
            print(f"{stored.name}: version {stored.version} written")
    finally:
        ledger.engine.dispose()


def _review(
    ledger: Ledger, policies: list[PolicyCreate], *, now: datetime
) -> tuple[list[str], list[str], list[PolicyCreate]]:
    """Print each policy's diff and what-if; return the problems, the loosenings and the changes."""
    problems: list[str] = []
    loosening: list[str] = []
    changed: list[PolicyCreate] = []
    for policy in policies:
        try:
            current: Policy | None = ledger.policies.get(policy.name)
        except UnknownUseCase:
            current = None
        if current is None:
            print(f"{policy.name}: new use case")
            for field in PolicyBase.model_fields:
                print(f"  {field}: {_shown(getattr(policy, field))}")
            try:
                with ledger.engine.connect() as conn:
                    ledger.policies.check_group(conn, policy)
            except PolicyConflict as exc:
                problems.append(f"{policy.name}: {exc}")
            changed.append(policy)
            continue
        diff = [
            (field, getattr(current, field), getattr(policy, field))
            for field in PolicyBase.model_fields
            if getattr(current, field) != getattr(policy, field)
        ]
        if not diff:
            print(f"{policy.name}: unchanged (version {current.version})")
            continue
        changed.append(policy)
        looser = _loosening(current, policy)
        loosening.extend(f"{policy.name}: {x}" for x in looser.values())
        print(f"{policy.name}: version {current.version} -> {current.version + 1}")
        for field, old, new in diff:
            mark = "   (loosens)" if field in looser else ""
            print(f"  {field}: {_shown(old)} -> {_shown(new)}{mark}")
        try:
            result = what_if(ledger, policy.name, policy, now=now)
        except (PolicyConflict, InvalidRequest) as exc:
            problems.append(f"{policy.name}: {exc}")
            continue
        print("  what-if on today's ledger (current -> proposed):")
        for line in _what_if_lines(result.to_dict()):
            print(f"    {line}")
    return problems, loosening, changed


def _loosening(old: PolicyBase, new: PolicyBase) -> dict[str, str]:
    """The changes from ``old`` to ``new`` that let a device spend more, by field."""
    out: dict[str, str] = {}
    if new.max_reports_per_day > old.max_reports_per_day:
        out["max_reports_per_day"] = (
            f"daily cap raised from {old.max_reports_per_day} to {new.max_reports_per_day} reports"
        )
    for cap in ("window_epsilon_cap", "lifetime_epsilon_cap"):
        was, now = getattr(old, cap), getattr(new, cap)
        if was is not None and now is None:
            out[cap] = f"`{cap}` removed (was {was:g})"
        elif was is not None and now > was:
            out[cap] = f"`{cap}` raised from {was:g} to {now:g}"
    for eps in ("epsilon_per_report", "epsilon_word", "epsilon_fragment"):
        was, now = getattr(old, eps), getattr(new, eps)
        if was is not None and now is not None and now > was:
            out[eps] = f"`{eps}` raised from {was:g} to {now:g}"
    if new.retention_days < old.retention_days:
        out["retention_days"] = (
            f"retention shortened from {old.retention_days} to {new.retention_days} days"
        )
    return out


def _what_if_lines(result: dict[str, Any], prefix: str = "") -> list[str]:
    """``name: current -> proposed`` for every compared figure of a what-if, nested by dots."""
    lines: list[str] = []
    for key, value in result.items():
        if isinstance(value, dict) and set(value) == {"current", "proposed"}:
            lines.append(
                f"{prefix}{key}: {_shown(value['current'])} -> {_shown(value['proposed'])}"
            )
        elif isinstance(value, dict):
            lines.extend(_what_if_lines(value, prefix=f"{prefix}{key}."))
    return lines


def _shown(value: Any) -> str:
    """A policy field or what-if figure as one short phrase."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict) and {"epsilon", "delta", "method", "epsilon_basic"} <= set(value):
        return (
            f"{value['epsilon']:g} at delta {value['delta']:g} ({value['method']};"
            f" sum {value['epsilon_basic']:g})"
        )
    return str(value)


@policies_app.command("export")
def policies_export(
    fmt: Annotated[str, typer.Option("--format", help="yaml or toml.")] = "yaml",
    database_url: DatabaseOption = None,
) -> None:
    """Print the current policies as a file that `apply` reads."""
    if fmt not in ("yaml", "toml"):
        typer.echo(f"Error: --format must be yaml or toml, got {fmt!r}", err=True)
        raise typer.Exit(2)
    ledger = _ledger(_settings(database_url))
    print(dump_policies(ledger.policies.list(), fmt), end="")


@app.command()
def selftest(
    samples: Annotated[
        int, typer.Option(min=10_000, max=100_000_000, help="Reports drawn per input.")
    ] = 2_000_000,
    seed: Annotated[int | None, typer.Option(min=0, help="Fixed seed (default: fresh).")] = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url", help="Audit this database's policies (default: Apple's defaults)."
        ),
    ] = None,
) -> None:
    """Audit every policy's randomizer as installed: exact at a small size, then empirically."""
    if database_url is None:
        policies: list[Any] = list(default_policies())
    else:
        ledger = _ledger(_settings(database_url))
        policies = ledger.policies.list()
        ledger.engine.dispose()
    rng = np.random.default_rng(seed)
    print(
        f"{'use case':<24} {'mech':<5} {'eps':>5} {'exact':>9} {'samples':>10}"
        f" {'lower':>7} {'estimate':>8} {'upper':>7}  verdict"
    )
    failed = 0
    for policy in policies:
        mech = mechanism_for(policy)
        exact = exact_max_log_ratio(mech)
        result = audit(
            mech,
            "selftest-alpha",
            "selftest-zulu!",
            epsilon=policy.epsilon_per_report,
            samples=samples,
            rng=rng,
        )
        exact_ok = abs(exact - policy.epsilon_per_report) < 1e-9
        verdict = "ok" if result.passed and exact_ok else "FAILED"
        if not exact_ok:
            verdict += " (exact loss differs from epsilon)"
        elif result.leaks_more:
            verdict += " (leaks more than charged)"
        elif not result.reaches:
            verdict += " (less signal than designed)"
        failed += verdict != "ok"
        print(
            f"{policy.name:<24} {policy.mechanism:<5} {policy.epsilon_per_report:>5g}"
            f" {exact:>9.6f} {samples:>10,d} {result.lower:>7.3f} {result.estimate:>8.3f}"
            f" {result.upper:>7.3f}  {verdict}"
        )
    print(
        f"\nClopper-Pearson bounds at alpha = {1e-6:g} on ln P(E|x)/P(E|x') for the worst-case"
        " event E; exact = max |ln P(y|x) - ln P(y|x')| by enumeration at a small k and m."
    )
    if failed:
        typer.echo(f"Error: {failed} randomizer(s) failed the audit", err=True)
        raise typer.Exit(1)


@app.command()
def budget(
    device_id: Annotated[str, typer.Argument(help="The device's id.")],
    database_url: DatabaseOption = None,
) -> None:
    """A device's remaining budget for every use case."""
    if not device_id or len(device_id) > 256:
        typer.echo("Error: DEVICE_ID must be 1 to 256 characters", err=True)
        raise typer.Exit(2)
    ledger = _ledger(_settings(database_url))
    print(
        f"{'use case':<24} {'today':>5} {'left':>4} {'eps today':>9}"
        f" {'eps window':>10} {'eps ever':>9}"
    )
    for s in ledger.status(device_id, now=SystemClock().now()):
        print(
            f"{s.use_case:<24} {s.reports_today:>5} {s.reports_left_today:>4} {s.epsilon_today:>9g}"
            f" {s.epsilon_window:>10g} {s.epsilon_lifetime:>9g}"
        )


def main() -> None:
    """Entry point of the ``dpgov`` console script."""
    app()


if __name__ == "__main__":
    main()

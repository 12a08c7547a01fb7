"""``dpgov audit``: verify the chain, copy checkpoints, report, export, recompute."""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TextIO, cast

import typer

from dp_governor.api.cli._engine import (
    AggregateEngine,
    EngineOption,
    SchedulerOption,
    SchedulerTimeoutOption,
    check_engine,
    parts_executor,
    worker_opener,
)
from dp_governor.api.cli.common import (
    DatabaseOption,
    Progress,
    Stages,
    finite,
    load_settings,
    open_ledger,
    path_argument,
    path_option,
    refuse,
)

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from dp_governor.api.settings import Settings
    from dp_governor.budget.ledger import Ledger
    from dp_governor.budget.reporting.report import EffectiveEpsilonReport

app = typer.Typer(help="Verify and export the audit log.", no_args_is_help=True)
QuietOption = Annotated[
    bool, typer.Option("--quiet", "-q", help="No progress on stderr (the result only).")
]


@app.command("verify")
def audit_verify(
    checkpoints: Annotated[
        Path | None,
        path_option(
            help="Checkpoints kept outside the database (default: the `checkpoint_file`"
            " setting); a log truncated back to an earlier one fails. A file given here that"
            " cannot be read as checkpoints is refused (exit 2); the setting's fails the run."
        ),
    ] = None,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="Replay the chain from its first entry (default: from the signed checkpoint"
            " the last accepted verification reached).",
        ),
    ] = False,
    archive: Annotated[
        list[Path] | None,
        path_option(
            "--archive",
            help="With --full: an archive file (`dpgov audit archive`) to replay first;"
            " repeat for each, so that the replay starts at the first entry.",
        ),
    ] = None,
    database_url: DatabaseOption = None,
    quiet: QuietOption = False,
) -> None:
    """Check the audit chain and the state the gate decides on; exit 1 naming what fails.

    Starts at the signed checkpoint the last accepted verification reached (docs/audit.md
    says which checks then cover only the entries after it); ``--full`` replays everything the
    log holds, and with ``--archive`` the archived entries first.
    On stderr: the entries verified (a bar on a terminal, a line per tenth in a log), then
    each later part with its time, then the verdict in a line (the entries checked, first to
    last, and the note, as the dashboard says them); ``--quiet``: none of it.
    """
    from dp_governor.api._integrity import kept_checkpoints, verify_service
    from dp_governor.api._verdict_text import summary
    from dp_governor.budget.audit.archive import NotTheArchives

    files = archive or []
    if files and not full:
        refuse("--archive needs --full (an incremental verification reads no archive)")
    for file in files:
        if not file.is_file():
            refuse(f"--archive: no archive file at {file}")
    settings = load_settings(database_url)
    path = checkpoints or settings.checkpoint_file
    if checkpoints is not None and not checkpoints.exists():
        refuse(f"no checkpoint file at {checkpoints}")
    kept = kept_checkpoints(path)  # one it cannot read fails the verification, naming it
    if checkpoints is not None and kept.problem is not None:  # ... unless given here: wrong
        refuse(f"--checkpoints: {kept.problem}")
    ledger = open_ledger(settings)  # a refusal is one line, before any progress
    sink = io.StringIO() if quiet else None
    try:
        with (
            Progress("audit verify: the chain", "entries", stream=sink) as bar,
            Stages("audit verify", stream=sink) as stages,
        ):
            chain_part = True

            def stage(name: str) -> None:
                nonlocal chain_part
                if chain_part:  # the first part counts its entries on the bar
                    chain_part = False
                    return
                bar.close()
                stages(name)

            result = verify_service(
                ledger,
                now=datetime.now(UTC),
                kept=kept,
                stage=stage,
                progress=bar,
                full=full,
                archive_files=files,
            )
    except NotTheArchives as exc:  # the argument is wrong, not the log: no verdict recorded
        refuse(f"--archive: {exc}")
    finally:
        ledger.close()
    typer.echo(json.dumps(result.to_dict(), indent=2))
    if not quiet:  # the verdict in the words the dashboard uses
        typer.echo(f"audit verify: {summary(result)}", err=True)
    if not result.ok:
        where = "" if result.first_bad is None else f" at entry {result.first_bad}"
        refuse(f"the audit log fails{where}: {result.problem}", 1)


@app.command("archive")
def audit_archive(
    through: Annotated[
        str,
        typer.Option(
            help="The signed checkpoint's entry to archive up to (kept), or 'verified': the one"
            " the last accepted verification reached (the only one it holds the state at)."
        ),
    ],
    out: Annotated[Path, path_option("--out", "-o", help="The archive file to write (new).")],
    database_url: DatabaseOption = None,
) -> None:
    """Move the entries before a verified signed checkpoint to a file, then delete them.

    The file (gzip JSON lines) is written, fsynced, read back and checked against the chain
    and its checkpoints before the entries are deleted; keep it (and a copy) with the
    checkpoint file. ``dpgov audit verify --full --archive FILE`` replays it again.
    """
    from dp_governor.api.cli.common import Access
    from dp_governor.budget.audit.archive import ArchiveError, ArchiveRefused

    seq: int | None = None
    if through != "verified":
        if not through.isdigit() or int(through) < 1:
            refuse(f"--through must be a checkpoint's entry number or 'verified', got {through!r}")
        seq = int(through)
    if out.exists() or out.is_symlink():
        refuse(f"--out: {out} exists (an archive is never overwritten): choose a new name")
    if not out.parent.is_dir():
        refuse(f"--out: no folder {out.parent}")
    ledger = open_ledger(load_settings(database_url), Access.WRITE)
    try:
        record = ledger.archive(through=seq, out=out, now=datetime.now(UTC))
    except (ArchiveRefused, ArchiveError) as exc:
        refuse(str(exc))
    finally:
        ledger.close()
    typer.echo(
        f"entries {record.first_seq} to {record.boundary - 1} archived to {out}"
        f" (sha256 {record.sha256}); the log starts at entry {record.boundary}"
    )


@app.command("checkpoints")
def audit_checkpoints(
    output: Annotated[
        Path, path_option("--output", "-o", help="File to append the signed checkpoints to.")
    ],
    database_url: DatabaseOption = None,
) -> None:
    """Copy the signed checkpoints out of the database (keep the file somewhere else).

    The file is created with mode 0600; one that cannot be read is left untouched (exit 1).
    """
    from dp_governor.budget.audit.log import (
        CheckpointFileError,
        last_kept_seq,
        write_checkpoints,
    )

    ledger = open_ledger(load_settings(database_url))
    try:
        held = last_kept_seq(output) if output.exists() or output.is_symlink() else 0
        added = write_checkpoints(ledger.audit.iter_checkpoints(after=held), output)
    except CheckpointFileError as exc:
        refuse(str(exc), 1)
    finally:
        ledger.close()
    typer.echo(f"{added} new checkpoint(s) appended to {output}")


@app.command("tiles")
def audit_tiles(
    out: Annotated[
        Path, path_option("--out", help="Folder to write the tiles to (a static host's root).")
    ],
    database_url: DatabaseOption = None,
) -> None:
    """Write the transparency log as C2SP tlog-tiles static files, the checkpoint last.

    The same bytes at the same paths as ``/checkpoint`` and ``/tile/...``; a second run writes
    only the tiles new since the last (a tile once written never changes) and the checkpoint.
    Beside them, ``vkey``: the log's verifier key, to give devices and witnesses (they check
    the tiles with it: docs/transparency.md).
    """
    from dp_governor.budget.audit.tiles import write_tiles

    if out.exists() and not out.is_dir():
        refuse(f"`--out` must be a folder, {out} is a file")
    ledger = open_ledger(load_settings(database_url))
    try:
        done = write_tiles(ledger.tlog, out)
    except OSError as exc:
        refuse(f"cannot write the tiles under {out}: {exc.strerror or exc}", 1)
    finally:
        ledger.close()
    if done.size == 0:
        refuse("the log has signed no checkpoint yet: run `dpgov jobs run checkpoint`", 1)
    said = "written" if done.checkpoint else "unchanged"
    typer.echo(
        f"checkpoint of {done.size:,} leaves {said}; {done.tiles:,} tile(s) written,"
        f" {done.kept:,} already there, under {out}"
        + (f"; the log's verifier key written to {out / 'vkey'}" if done.vkey else "")
    )
    for name in done.skipped:
        typer.echo(
            f"Warning: {name} not written: a leaf is longer than a bundle can hold"
            " (/v1/tlog/leaves serves it)",
            err=True,
        )


@app.command("report")
def audit_report(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    delta: Annotated[
        float | None,
        typer.Option(
            parser=finite(0.0, 1.0, open_low=True, open_high=True),
            help="Delta of the tight bounds, in (0, 1) (default: the policies').",
        ),
    ] = None,
    partitions: Annotated[
        int,
        typer.Option(
            min=1,
            help="When a full pass is due, split the devices into this many key ranges (with"
            " --shard: each shard's), each read in a process of its own; the results merge"
            " exactly. A stored summary is brought up to date instead when it can be.",
        ),
    ] = 1,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1, help="Processes at once with --partitions or --shard (default: the CPUs)."
        ),
    ] = None,
    shard: Annotated[
        list[str] | None,
        typer.Option(
            help="A shard's database URL (repeat for each shard of a ledger sharded by device"
            " key): each shard's stored summary is brought up to date (or, when a full pass is"
            " due, its --partitions ranges read), and the results merged.",
        ),
    ] = None,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="Read every account instead of bringing the stored summary up to date"
            " (the figures are the same; the summary is stored again; with --shard every"
            " device's routing is checked).",
        ),
    ] = False,
    engine: EngineOption = AggregateEngine.local,
    scheduler: SchedulerOption = None,
    scheduler_timeout: SchedulerTimeoutOption = None,
    database_url: DatabaseOption = None,
    quiet: QuietOption = False,
) -> None:
    """The effective-epsilon report: what each policy allows and what devices spent.

    Starts from the summary the last report stored and reads only what changed since, unless
    ``--full`` or the policies changed (docs/scaling.md). On stderr: the devices read (a bar on
    a terminal, a line per tenth in a log), or with ``--partitions`` or ``--shard`` the parts
    finished (a summary brought forward or a key range read), then the bounds' time;
    ``--quiet``: none of it. ``--engine dask`` runs the parts on a Dask cluster.
    """
    import os

    from dp_governor.budget import SystemClock
    from dp_governor.budget.reporting.loss import effective_epsilon

    check_engine(engine, scheduler, scheduler_timeout, bool(shard) or partitions > 1)
    sink = io.StringIO() if quiet else None
    where = functools.partial(parts_executor, engine, scheduler, scheduler_timeout)
    if shard:
        from dp_governor.api.cli._sharded import sharded_report

        if database_url is not None:
            refuse("give --shard URLs or --database-url, not both")
        workers = workers or os.cpu_count() or 1
        with where(workers) as executor:
            report = sharded_report(shard, partitions, workers, delta, sink, full, executor)
        _print_report(report, as_json)
        return
    if workers is not None and partitions == 1:
        refuse("--workers needs --partitions (more than 1) or --shard")
    settings = load_settings(database_url)
    ledger = open_ledger(settings)  # a refusal: one line, no progress
    if partitions > 1:
        workers = workers or os.cpu_count() or 1
        try:
            with where(workers) as executor:
                report = _partitioned_report(
                    ledger, settings, partitions, workers, delta, sink, full, executor
                )
        finally:
            ledger.close()
        _print_report(report, as_json)
        return
    try:
        with (
            Progress("audit report: every device's spend", "devices", stream=sink) as bar,
            Stages("audit report", stream=sink) as stages,
        ):
            scanning = True

            def read(done: int, total: int) -> None:
                nonlocal scanning
                if not scanning:
                    return
                bar(done, total)
                if done >= total:  # the scan is done: the bounds follow
                    scanning = False
                    bar.close()
                    stages("the bounds of every policy")

            ledger.scan_progress = read
            report = effective_epsilon(ledger, now=SystemClock().now(), delta=delta, full=full)
    finally:
        ledger.close()
    _print_report(report, as_json)


def _print_report(report: EffectiveEpsilonReport, as_json: bool) -> None:
    """The report on stdout: JSON or the text table."""
    from dp_governor.budget.reporting.report_text import render_text

    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        typer.echo(render_text(report), nl=False)


def _partitioned_report(
    ledger: Ledger,
    settings: Settings,
    partitions: int,
    workers: int,
    delta: float | None,
    sink: TextIO | None,
    full: bool,
    executor: Executor | None,
) -> EffectiveEpsilonReport:
    """``audit report --partitions``: the summary brought forward, or the key ranges' passes.

    In ``workers`` local processes, or on ``executor`` (Dask's) when given.
    """
    from dp_governor.budget import SystemClock
    from dp_governor.budget.reporting.partitioned import partitioned_basis
    from dp_governor.budget.reporting.report import finish_report

    with (
        Progress("audit report: the summary or key ranges", "parts", stream=sink) as bar,
        Stages("audit report", stream=sink) as stages,
    ):
        bar(0)  # the whole is known once the summary is brought forward or found stale
        basis = partitioned_basis(
            ledger,
            worker_opener(settings),
            now=SystemClock().now(),
            partitions=partitions,
            workers=workers,
            full=full,
            done=bar,
            executor=executor,
        )
        bar.close()
        stages("the bounds of every policy")
        return finish_report(basis, accountant=ledger.accountant, delta=delta)


@app.command("export")
def audit_export(
    out: Annotated[Path, path_option("--out", "-o", help="File to write.")],
    fmt: Annotated[str, typer.Option("--format", help="jsonl or csv.")] = "jsonl",
    database_url: DatabaseOption = None,
) -> None:
    """Export the ledger (policies, charges, lifetime totals) to recompute the report offline.

    The file is written with mode 0600 (it names every device pseudonym and its spend).
    """
    from dp_governor.budget import SystemClock
    from dp_governor.budget.reporting.export import export_ledger
    from dp_governor.budget.storage.files import open_private

    if fmt not in ("jsonl", "csv"):
        typer.echo(f"Error: --format must be jsonl or csv, got {fmt!r}", err=True)
        raise typer.Exit(2)
    ledger = open_ledger(load_settings(database_url))
    try:
        with (
            open_private(out, "w") as handle,
            Progress("audit export", "lines") as progress,
        ):
            counted = cast(TextIO, _LineCounter(handle, progress))
            n = export_ledger(ledger, counted, fmt=fmt, now=SystemClock().now())  # type: ignore[arg-type]
    except OSError as exc:
        typer.echo(f"Error: cannot write {out}: {exc.strerror}", err=True)
        raise typer.Exit(1) from None
    finally:
        ledger.close()
    typer.echo(f"{n} records written to {out}")


class _LineCounter:
    """A file that reports the lines written through it: an export writes one per record."""

    def __init__(self, out: TextIO, progress: Callable[[int], None]) -> None:
        self.out = out
        self.progress = progress
        self.lines = 0

    def write(self, text: str) -> int:
        """Write ``text`` and report the lines written so far."""
        written = self.out.write(text)
        if "\n" in text:
            self.lines += text.count("\n")
            self.progress(self.lines)
        return written


@app.command("recompute")
def audit_recompute(
    file: Annotated[
        Path | None, path_argument(help="An export written by `dpgov audit export`.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    log: Annotated[
        str | None,
        typer.Option(
            "--log",
            help="Check the privacy claims of a public log instead: the service's base URL"
            " or a copy saved with --save.",
        ),
    ] = None,
    log_key: Annotated[
        str | None,
        typer.Option(help="The log's verifier key (vkey), from its operator, never the log."),
    ] = None,
    witness: Annotated[
        list[str] | None, typer.Option(help="A witness's vkey (repeat for several).")
    ] = None,
    quorum: Annotated[
        int | None,
        typer.Option(
            help="Witness cosignatures required: 1 to the number of --witness keys (default:"
            " all of them)."
        ),
    ] = None,
    checkpoint: Annotated[
        Path | None,
        path_option(
            help="With --log: check against this signed checkpoint (e.g. one a witness"
            " cosigned) instead of the one the log serves."
        ),
    ] = None,
    save: Annotated[Path | None, path_option(help="With --log URL: save the log here.")] = None,
    reports: Annotated[
        Path | None,
        path_option(help="With --log: write each regenerated daily report into this folder."),
    ] = None,
) -> None:
    """Recompute the effective-epsilon report from an export, or a log's claims (no database).

    The export is split by device into temporary files (under TMPDIR, about its own size), so
    memory stays that of one part of it whatever the number of devices.
    """
    if log is not None:
        if file is not None:
            refuse("give an export FILE or --log, not both")
        witnesses = witness or []
        needed = len(witnesses) if quorum is None else quorum
        _recompute_log(log, log_key, witnesses, needed, checkpoint, save, reports)
        return
    if file is None:
        refuse("give an export FILE (`dpgov audit export`) or --log URL_OR_FILE")
    from dp_governor.budget.reporting.export import recompute

    try:
        report = recompute(file)
    except OSError as exc:  # the file given (exit 2), or this machine (its scratch space: 1)
        given = exc.filename is not None and Path(exc.filename) == file
        refuse(f"cannot read the export {str(file)!r}: {exc.strerror or exc}", 2 if given else 1)
    except ValueError as exc:
        refuse(f"{str(file)!r} is not a ledger export (`dpgov audit export`): {exc}")
    _print_report(report, as_json)


def _recompute_log(
    source: str,
    log_key: str | None,
    witnesses: list[str],
    quorum: int,
    checkpoint: Path | None,
    save: Path | None,
    reports: Path | None,
) -> None:
    """``recompute --log``: the tree against its signed checkpoint, then every claim."""
    import dataclasses

    from dp_governor.api.client.log_copy import LogCopy, LogCopyError, check_tree
    from dp_governor.budget.reporting.claims import check_claims
    from dp_governor.mechanisms.signed_note import NoteError, Verifier, check_quorum

    try:
        check_quorum(quorum, len(witnesses))
    except ValueError as exc:
        refuse(str(exc))
    try:
        copy = LogCopy.load(source)
    except LogCopyError as exc:
        refuse(f"--log: {exc}", 1)
    if checkpoint is not None:
        try:
            copy = dataclasses.replace(copy, note=checkpoint.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            refuse(f"--checkpoint: {exc}")
    if save is not None:
        save.write_bytes(copy.to_json())
    try:
        keys = [Verifier.parse(w) for w in witnesses]
    except NoteError as exc:
        refuse(f"--witness: {exc}")
    if log_key is None:
        typer.echo("warning: no --log-key: the key the log itself names is used", err=True)
    try:
        key = Verifier.parse(log_key or copy.vkey)
    except NoteError as exc:
        refuse(f"--log-key: {exc}")
    from dp_governor.budget.clock import day_date  # here: `dpgov --help` loads no ledger

    failed = 0
    size, tree = check_tree(copy, key, keys, quorum)
    typer.echo(f"tree: {tree}" if tree else f"tree: {size} leaves match the signed checkpoint")
    failed += tree is not None
    checks = check_claims(copy.leaves[:size] if tree is None else copy.leaves)
    for check in checks:
        day = day_date(check.day).isoformat() if check.day >= 0 else "?"
        verdict = "reproduced exactly" if check.ok else "MISMATCH"
        typer.echo(f"claim at leaf {check.index}: {check.use_case} {day}: {verdict}")
        for problem in check.problems:
            typer.echo(f"  {problem}")
        if reports is not None and check.report:
            reports.mkdir(parents=True, exist_ok=True)
            (reports / f"{check.use_case}-{day}.txt").write_text(check.report, encoding="utf-8")
    failed += sum(not c.ok for c in checks)
    typer.echo(f"{len(checks)} claims, {sum(c.ok for c in checks)} reproduced exactly")
    if failed:
        refuse(f"{failed} check(s) failed", 1)

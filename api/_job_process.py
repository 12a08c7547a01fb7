"""The service's job worker: one long-lived child process at the lowest CPU priority.

The population jobs (``dashboard``, ``verify``, ``purge``) and the figures' refresher read the
whole ledger for seconds to minutes. Run in the server's threads they would take the
interpreter lock from the threads that answer reports, and on a small machine the CPU as well.
A :class:`JobWorker` runs them in one spawned child process per server process instead: started
on the first call, reused by the next ones (its imports and its database engine paid once),
started again if it died, closed with the app. The child runs in Linux's idle scheduling class
(``DPGOV_JOB_CPU=idle``: it gets a core only when nothing else wants it) or at a higher niceness
(``DPGOV_JOB_NICE``), and each call in a thread of its own, so a refresh does not wait for a
verification. The parent keeps what makes a job run a run (the lease, its heartbeat, the log
line, the metrics); the child returns the result or, instead of raising, what went wrong
(:class:`JobProcessError`, a lost lease as :class:`~dp_governor.api.leases.LeaseLost`).

The child ends when its server does: it reads the pipe to the server on its main thread and
stops at once at its end of file, and a watcher thread stops it when its parent process is
gone, so a killed server leaves no orphan writing; an open transaction then rolls back.
"""

from __future__ import annotations

import itertools
import logging
import logging.config
import multiprocessing
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy.exc import DBAPIError

from dp_governor.api._job_database import as_job_sessions
from dp_governor.api._keys import ServiceKeys
from dp_governor.api._service import Service, open_service_parts, service_engine
from dp_governor.api.leases import LeaseLost
from dp_governor.api.logs import log_config
from dp_governor.budget.storage.db import is_busy

if TYPE_CHECKING:
    from dp_governor.api.settings import Settings

__all__ = ["JobProcessError", "JobWorker", "busy_cause", "lower_priority"]

log = logging.getLogger("dpgov.jobs")

_CLOSE_SECONDS = 10.0  # how long a closing worker may take to end before it is terminated
_WATCH_SECONDS = 1.0  # how often the worker looks whether its parent process is still there


class JobProcessError(RuntimeError):
    """A job's work failed in the worker process: the exception's type name and message there.

    ``busy``: the database stayed locked past the job's lock wait (as
    :func:`~dp_governor.budget.storage.db.is_busy` says), the message the database's own.
    """

    def __init__(self, error: str, message: str, *, busy: bool = False) -> None:
        self.error = error
        self.message = message
        self.busy = busy
        super().__init__(f"{error}: {message}" if message else error)


@dataclass(frozen=True, slots=True)
class _Failed:
    """What the worker sends instead of raising (an exception may not survive pickling)."""

    error: str
    message: str
    busy: bool = False
    lost: tuple[str, int, int | None] | None = None  # a LeaseLost's lease, token, current


def busy_cause(exc: BaseException) -> str | None:
    """The database's message when ``exc`` says it stayed busy (here or in the worker)."""
    if isinstance(exc, JobProcessError):
        return exc.message if exc.busy else None
    if not is_busy(exc):
        return None
    orig = exc.orig if isinstance(exc, DBAPIError) else None
    lines = str(orig).splitlines() if orig is not None else []
    return lines[0] if lines else type(orig if orig is not None else exc).__name__


def lower_priority(cpu: Literal["idle", "nice"], nice: int) -> str:
    """Lower this thread's CPU priority (and its later threads'); what it got, for the log.

    ``nice`` raises the niceness by that much (0: unchanged; the kernel keeps at most 19).
    ``cpu="idle"`` also puts the thread in Linux's idle scheduling class, where it runs only
    on a core nothing else wants; a system without it keeps the niceness alone.
    """
    if nice > 0:
        os.nice(nice)
    if cpu == "idle" and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except OSError as exc:  # a sandbox that forbids it: the niceness stands
            return f"niceness {os.getpriority(os.PRIO_PROCESS, 0)} (no idle class: {exc})"
        return "the idle scheduling class"
    return f"niceness {os.getpriority(os.PRIO_PROCESS, 0)}"


class JobWorker:
    """The server's job worker process: started on the first :meth:`call`, reused, restarted.

    ``settings`` and ``keys`` are what the worker opens the service with (pickled to it once).
    """

    def __init__(self, settings: Settings, keys: ServiceKeys) -> None:
        self._settings = settings
        self._keys = keys
        self._lock = threading.Lock()
        self._child: _Child | None = None
        self._closed = False

    def call(self, target: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
        """``target(service, *args)`` in the worker, ``service`` its :class:`Service`.

        ``target`` and ``args`` are pickled (a module-level function and plain values). Waits
        for the answer; raises :class:`LeaseLost` or :class:`JobProcessError` for what the
        worker reports, and :class:`JobProcessError` ``ProcessExited`` if the worker ended
        without answering (killed, out of memory: the next call starts a new one).
        """
        sent = self._running().submit(target, args)
        if sent is None:  # the worker had ended unseen: the call never reached it, so resend
            sent = self._running().submit(target, args)
        if sent is None:
            raise JobProcessError("ProcessExited", "the job's process ended before the call")
        answer = sent.result()
        if isinstance(answer, _Failed):
            if answer.lost is not None:
                raise LeaseLost(*answer.lost)
            raise JobProcessError(answer.error, answer.message, busy=answer.busy)
        result: dict[str, Any] = answer
        return result

    def pid(self) -> int | None:
        """The running worker's process id (``None``: none runs)."""
        with self._lock:
            child = self._child
        return child.proc.pid if child is not None and child.alive() else None

    def close(self) -> None:
        """End the worker (the app's shutdown); later calls fail rather than start another."""
        with self._lock:
            child, self._child, self._closed = self._child, None, True
        if child is not None:
            child.close()

    def _running(self) -> _Child:
        """The live worker, started now if none runs (never started, or it died)."""
        with self._lock:
            if self._closed:
                raise JobProcessError("Closed", "the service is stopping; the job did not run")
            if self._child is None or not self._child.alive():
                if self._child is not None:
                    log.warning("job worker %s ended; starting another", self._child.proc.pid)
                self._child = _Child(self._settings, self._keys)
            return self._child


class _Child:
    """One worker process, the pipe to it, and the calls waiting for its answers."""

    def __init__(self, settings: Settings, keys: ServiceKeys) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child_end = context.Pipe()
        self.proc = context.Process(
            target=_serve,
            args=(child_end, os.getpid(), settings, keys),
            name="dpgov-jobs",
            daemon=True,
        )
        self.proc.start()
        child_end.close()  # the worker's end only in the worker: its death ends recv() here
        self._lock = threading.Lock()
        self._pending: dict[int, Future[Any]] = {}
        self._ids = itertools.count()
        self._ended = False
        self._reader = threading.Thread(target=self._read, name="dpgov-jobs-reader", daemon=True)
        self._reader.start()

    def alive(self) -> bool:
        """Whether the worker still answers (its pipe open and its process running)."""
        return not self._ended and self.proc.is_alive()

    def submit(
        self, target: Callable[..., dict[str, Any]], args: tuple[Any, ...]
    ) -> Future[Any] | None:
        """Send one call; its future receives the answer (or ``ProcessExited``).

        ``None``: the worker had ended before the call reached it (the pipe was closed).
        """
        future: Future[Any] = Future()
        with self._lock:
            if self._ended:
                return None
            n = next(self._ids)
            call = pickle.dumps((target, args))  # loaded in the call's thread: its own failure
            try:
                self.conn.send((n, call))
            except (OSError, ValueError):  # a closed pipe: the worker is gone
                self._ended = True
                return None
            self._pending[n] = future
        return future

    def close(self) -> None:
        """Ask the worker to end, then make sure it has (terminated past a bound)."""
        with self._lock:
            if not self._ended:
                try:
                    self.conn.send(None)
                except (OSError, ValueError):
                    pass
        self.proc.join(_CLOSE_SECONDS)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(_CLOSE_SECONDS)
        self._reader.join(_CLOSE_SECONDS)

    def _read(self) -> None:
        """The answers, to their calls; at the pipe's end, every waiting call fails."""
        try:
            while True:
                n, answer = self.conn.recv()
                with self._lock:
                    future = self._pending.pop(n)
                future.set_result(answer)
        except (EOFError, OSError):
            pass
        except Exception:  # an answer that cannot be read: this worker is given up
            log.exception("job worker %s: an unreadable answer; it is stopped", self.proc.pid)
            self.proc.terminate()
        with self._lock:
            self._ended = True
            waiting = list(self._pending.values())
            self._pending.clear()
        self.proc.join(_CLOSE_SECONDS)  # for its exit code
        for future in waiting:
            future.set_exception(self._exited())
        self.conn.close()

    def _exited(self) -> JobProcessError:
        ended = f"the job's process ended (exit code {self.proc.exitcode}) without a result"
        return JobProcessError("ProcessExited", ended)


def _serve(conn: Connection, parent: int, settings: Settings, keys: ServiceKeys) -> None:
    """The worker process: lower its priority, then run each call in a thread of its own."""
    logging.config.dictConfig(log_config(settings.log_format))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's: it closes the worker
    got = lower_priority(settings.job_cpu, settings.job_nice)
    threading.Thread(target=_watch, args=(parent,), name="dpgov-parent", daemon=True).start()
    log.info("job worker %d started for process %d (%s)", os.getpid(), parent, got)
    opened = _Opened(settings, keys)
    send_lock = threading.Lock()
    try:
        while (message := conn.recv()) is not None:
            n, call = message
            threading.Thread(
                target=_answer,
                args=(conn, send_lock, n, opened, call),
                name=f"dpgov-job-{n}",
                daemon=True,
            ).start()
    except (EOFError, OSError):  # the server is gone: stop now, an open transaction rolls back
        os._exit(1)
    opened.close()


def _watch(parent: int) -> None:
    """End the worker once its parent process is gone (it was adopted by another)."""
    while os.getppid() == parent:
        time.sleep(_WATCH_SECONDS)
    os._exit(1)


class _Opened:
    """The worker's service, opened on first use (a failure is that call's, the next retries)."""

    def __init__(self, settings: Settings, keys: ServiceKeys) -> None:
        self._settings = settings
        self._keys = keys
        self._lock = threading.Lock()
        self._service: Service | None = None

    def get(self) -> Service:
        """The service, opened now if it is not yet."""
        with self._lock:
            if self._service is None:
                engine = service_engine(self._settings)
                as_job_sessions(engine)
                self._service = open_service_parts(self._settings, self._keys, engine)
            return self._service

    def close(self) -> None:
        """Close the ledger's connections (the worker's orderly end)."""
        with self._lock:
            if self._service is not None:
                self._service.ledger.close()


def _answer(
    conn: Connection,
    send_lock: threading.Lock,
    n: int,
    opened: _Opened,
    call: bytes,
) -> None:
    """Run one call (its target and arguments pickled) and send back its result or failure.

    Whatever happens, call number ``n`` gets an answer: a call that cannot be loaded, a
    result that cannot be sent, each comes back as that call's failure.
    """
    answer: dict[str, Any] | _Failed
    try:
        target, args = pickle.loads(call)
        answer = target(opened.get(), *args)
    except LeaseLost as exc:
        answer = _Failed(type(exc).__name__, str(exc), lost=(exc.lease, exc.token, exc.current))
    except BaseException as exc:  # the parent logs its line; the traceback is only here
        answer = _failure(exc)
        if not answer.busy and isinstance(exc, Exception):
            log.error("job worker %d: %s", os.getpid(), answer.error, exc_info=exc)
    with send_lock:
        try:
            conn.send((n, answer))
        except (OSError, ValueError):  # the server is gone; the main thread ends the worker
            pass
        except Exception as exc:  # the result does not pickle: nothing was written yet
            unsent = f"its result could not be sent back: {exc}"
            conn.send((n, _Failed(type(exc).__name__, unsent)))


def _failure(exc: BaseException) -> _Failed:
    """An exception as the worker reports it (a busy database: its first line, as logged)."""
    cause = busy_cause(exc)
    if cause is not None:
        return _Failed(type(exc).__name__, cause, busy=True)
    return _Failed(type(exc).__name__, str(exc))

"""A job's work in a spawned child process at a lower CPU priority, out of the server's GIL.

The population jobs (``dashboard``, ``verify``, ``purge``) read the whole ledger for seconds
to minutes. Run in the server's scheduler threads they would take the interpreter lock from the
threads that answer reports, and on a small machine the CPU as well; in a child process at a
higher niceness (``DPGOV_JOB_NICE``) they take neither from the server while it has work. The
parent keeps what makes a run a run (the lease, its heartbeat, the log line, the metrics); the
child opens the database itself and returns the job's result or, instead of raising, what went
wrong (:class:`JobProcessError`, a lost lease as :class:`~dp_governor.api.leases.LeaseLost`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from sqlalchemy.exc import DBAPIError

from dp_governor.api.leases import LeaseLost
from dp_governor.budget.storage.db import is_busy

__all__ = ["JobProcessError", "lower_priority", "run_in_child"]

log = logging.getLogger("dpgov.jobs")


class JobProcessError(RuntimeError):
    """A job's work failed in its child process: the exception's type name and message there.

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
    """What the child sends instead of raising (an exception may not survive pickling)."""

    error: str
    message: str
    busy: bool = False
    lost: tuple[str, int, int | None] | None = None  # a LeaseLost's lease, token, current


def lower_priority(nice: int) -> None:
    """Raise this process's niceness by ``nice`` (0: unchanged), as far as the system allows.

    Unix niceness runs from -20 to 19; past 19 the kernel keeps 19.
    """
    if nice > 0:
        os.nice(nice)


def run_in_child(target: Callable[..., dict[str, Any]], *args: Any, nice: int) -> dict[str, Any]:
    """``target(*args)`` in a new spawned process whose niceness is ``nice`` above this one's.

    ``target`` and ``args`` are pickled (a module-level function and plain values). Waits for
    the child's answer; raises :class:`LeaseLost` or :class:`JobProcessError` for what it
    reports, and :class:`JobProcessError` if it ends without answering (killed, out of memory).
    """
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(
        target=_child, args=(send, nice, target, args), name="dpgov-job", daemon=True
    )
    child.start()
    send.close()  # the child's end: a child that dies closes the last one, and recv() ends
    try:
        answer = receive.recv()
    except EOFError:
        child.join()
        ended = f"the job's process ended (exit code {child.exitcode}) without a result"
        raise JobProcessError("ProcessExited", ended) from None
    finally:
        receive.close()
    child.join()
    if isinstance(answer, _Failed):
        if answer.lost is not None:
            raise LeaseLost(*answer.lost)
        raise JobProcessError(answer.error, answer.message, busy=answer.busy)
    result: dict[str, Any] = answer
    return result


def _child(
    send: Connection, nice: int, target: Callable[..., dict[str, Any]], args: tuple[Any, ...]
) -> None:
    """The child process: lower its priority, run ``target``, send its result or its failure."""
    try:
        lower_priority(nice)
        send.send(target(*args))
    except LeaseLost as exc:
        send.send(_Failed(type(exc).__name__, str(exc), lost=(exc.lease, exc.token, exc.current)))
    except BaseException as exc:  # the parent logs its line; the traceback is only here
        failed = _failure(exc)
        if not failed.busy and isinstance(exc, Exception):
            log.error("job process %d: %s", os.getpid(), failed.error, exc_info=exc)
        send.send(failed)
    finally:
        send.close()


def _failure(exc: BaseException) -> _Failed:
    """An exception as the child reports it (a busy database: its first line, as the log says)."""
    if isinstance(exc, DBAPIError) and is_busy(exc):
        cause = str(exc.orig).splitlines()[0] if exc.orig is not None else type(exc).__name__
        return _Failed(type(exc).__name__, cause, busy=True)
    return _Failed(type(exc).__name__, str(exc))

"""The service's log lines: plain text, or one JSON object per line, never a device or an address.

``dpgov serve --log-format json`` (setting ``log_format``) makes every line a JSON object with
``time``, ``level``, ``logger`` and ``message``, plus the fields a line carries: one per request
(``method``, the route *template*, ``status``, ``duration_ms``: the path itself names devices)
and one per job run (``job``, ``outcome``, ``duration_ms`` and the job's counts). uvicorn's
access log, which prints client addresses, stays off.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any, Final, Literal

__all__ = [
    "LOG_FORMATS",
    "JsonFormatter",
    "LogFormat",
    "SkippedRun",
    "log_config",
    "log_fields",
]

LogFormat = Literal["text", "json"]
LOG_FORMATS: Final = ("text", "json")
_TEXT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message and the record's fields."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (an exception as its last line, never a traceback)."""
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(line, default=str, ensure_ascii=False)


class SkippedRun(logging.Filter):
    """apscheduler's WARNING that a run was skipped, its previous one still running: a DEBUG line.

    With ``max_instances=1`` a job slower than its interval (``checkpoint`` under load) skips
    a run by design; the line moves to ``dpgov.jobs`` at DEBUG. Every other apscheduler line,
    its errors included, passes as it is.
    """

    MESSAGE: Final = "maximum number of running instances reached"

    def filter(self, record: logging.LogRecord) -> bool:
        """False for the skipped-run warning (logged again at DEBUG), True for every other."""
        if record.levelno == logging.WARNING and self.MESSAGE in str(record.msg):
            logging.getLogger("dpgov.jobs").debug("%s", record.getMessage())
            return False
        return True


def log_fields(**fields: Any) -> dict[str, Any]:
    """The ``extra`` of a log call whose fields the JSON format lists one by one."""
    return {"fields": fields}


def log_config(log_format: LogFormat, level: str = "info") -> dict[str, Any]:
    """A :func:`logging.config.dictConfig` for uvicorn and the service's loggers, to stderr."""
    formatter: dict[str, Any] = (
        {"()": "dp_governor.api.logs.JsonFormatter"} if log_format == "json" else {"format": _TEXT}
    )
    handler = {
        "class": "logging.StreamHandler",
        "formatter": "default",
        "stream": "ext://sys.stderr",
    }
    upper = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": formatter},
        "filters": {"skipped_run": {"()": "dp_governor.api.logs.SkippedRun"}},
        "handlers": {"default": handler},
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": upper, "propagate": False},
            "uvicorn.error": {"level": upper},
            "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
            "dpgov": {"handlers": ["default"], "level": upper, "propagate": False},
            # a line per request only as JSON, for a collector; text is for a person to read
            "dpgov.requests": {"level": upper if log_format == "json" else "WARNING"},
            "apscheduler": {"handlers": ["default"], "level": "WARNING", "propagate": False},
            "apscheduler.scheduler": {"filters": ["skipped_run"]},
        },
    }

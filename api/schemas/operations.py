"""The wire models of errors and operations: the error body, liveness, jobs, the audit chain."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel
from pydantic import Field as PydField

__all__ = ["AuditVerification", "ErrorBody", "Health", "JobRelease", "JobRun"]


class ErrorBody(BaseModel):
    """An error: ``detail`` says what is wrong (a list of field errors for 422)."""

    detail: str | list[dict[str, Any]] = PydField(
        description="What is wrong: a sentence, or for 422 a list of field errors."
    )
    field: str | None = PydField(
        default=None, description="The field, header or parameter at fault, when there is one."
    )


class Health(BaseModel):
    """Liveness: the service answers and its database is reachable."""

    status: Literal["ok"] = PydField(description="Always `ok` (otherwise the route fails).")


class JobRun(BaseModel):
    """A scheduled job run now: its name and what it did."""

    job: str = PydField(description="The job that ran.")
    result: dict[str, Any] = PydField(description="What the job did (its own figures).")


class JobRelease(BaseModel):
    """A job's lease cleared: which lease, and whether anyone held it."""

    job: str = PydField(description="The job.")
    lease: str = PydField(description="The lease the job takes (jobs may share one).")
    released: bool = PydField(description="True when the lease was held and is now free.")


class AuditVerification(BaseModel):
    """The audit chain's state: entries checked, head, checkpoints, and the first failure."""

    ok: bool = PydField(description="True when every entry, tag and checkpoint checks out.")
    entries: int = PydField(
        description="Entries checked: `from_seq + 1` to `from_seq + entries`, 1-based and"
        " inclusive (the dashboard's 'entries X to Y'); on an accepted run the last is"
        " `head_seq`."
    )
    head_seq: int = PydField(
        description="The last entry the run read: the log's head on an accepted run, where it"
        " stopped on a failed one."
    )
    head_hash: str = PydField(description="The last entry's chain hash (SHA-256, hex).")
    checkpoints: int = PydField(description="Signed checkpoints in the database.")
    latest_checkpoint_seq: int | None = PydField(
        description="The entry the latest checkpoint signs; null: none yet."
    )
    latest_checkpoint_at: str | None = PydField(
        description="When the latest checkpoint was made (UTC, ISO 8601)."
    )
    first_bad: int | None = PydField(description="The first entry that fails; null when `ok`.")
    problem: str | None = PydField(description="What is wrong with `first_bad`; null when `ok`.")
    state_checked: bool = PydField(
        description="Whether the tables the gate decides on were checked against the chain."
    )
    note: str | None = PydField(
        description="What the run did not check and why, and how the sealed inbox rows were"
        " checked (opened under the shuffler key, or only counted); the dashboard shows it too."
    )
    kept_checkpoints: int = PydField(description="Checkpoints read from `checkpoint_file`.")
    from_seq: int = PydField(
        0,
        description="The signed checkpoint the check started after (0: none, the first"
        " entry is 1); `entries` counts those after it.",
    )

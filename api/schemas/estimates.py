"""The wire models of the estimate routes: estimates, their query, SFP's discovered words."""

from __future__ import annotations

from datetime import date
from typing import Annotated

from pydantic import AllowInfNan, BaseModel, BeforeValidator, ConfigDict, StringConstraints
from pydantic import Field as PydField

__all__ = [
    "Discoveries",
    "Discovery",
    "EstimateItem",
    "EstimateQuery",
    "Estimates",
    "Finite",
    "IsoDay",
]


class EstimateItem(BaseModel):
    """One candidate's estimated count."""

    item: str = PydField(description="The candidate.")
    count: float = PydField(
        description="Its estimated count (unbiased; may be negative before the threshold)."
    )
    stderr: float = PydField(
        description="The estimate's standard error (95% interval: count +- 1.96 stderr)."
    )


class Estimates(BaseModel):
    """Published estimates (count >= the policy's threshold) over a day range."""

    use_case: str = PydField(description="The use case.")
    days: list[date] = PydField(description="The UTC days whose sketches were combined.")
    n: int = PydField(description="Reports in those sketches.")
    publish_threshold: float = PydField(description="Estimates below this count are not published.")
    estimates: list[EstimateItem] = PydField(
        description="Candidates at or above the threshold, largest first."
    )


def _iso_day(value: object) -> object:
    """An ISO date ``YYYY-MM-DD`` as given (pydantic would also take a number as a timestamp).

    >>> _iso_day("2026-11-01")
    '2026-11-01'
    """
    if isinstance(value, date) or (
        isinstance(value, str) and len(value) == 10 and value[4] == value[7] == "-"
    ):
        return value
    raise ValueError(f"must be an ISO date (YYYY-MM-DD), got {value!r}")


IsoDay = Annotated[date, BeforeValidator(_iso_day)]
"""A UTC day as an ISO date string; numbers (which pydantic reads as timestamps) are refused."""

Finite = Annotated[float, AllowInfNan(False)]
"""A float parameter: ``nan`` and ``inf`` are refused before any bound (NaN fails every
comparison, so ``lt=1`` alone would call it too large); 422 ``must be a finite number``."""


class EstimateQuery(BaseModel):
    """The body of ``POST .../estimates:query``."""

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "examples": [{"candidates": ["😂", "❤️"], "from": "2026-11-01", "to": "2026-11-23"}]
        },
    )

    candidates: list[Annotated[str, StringConstraints(max_length=1000)]] = PydField(
        min_length=1, max_length=1_000_000, description="The values to estimate."
    )
    start: IsoDay | None = PydField(
        default=None,
        alias="from",
        description="The first UTC day; default 89 days before today (the last 90 days).",
    )
    end: IsoDay | None = PydField(
        default=None, alias="to", description="The last UTC day; default today."
    )


class Discovery(BaseModel):
    """A word discovered by SFP, with its estimate."""

    word: str = PydField(description="The word SFP found.")
    count: float = PydField(description="Its estimated count.")
    stderr: float = PydField(description="The estimate's standard error.")


class Discoveries(BaseModel):
    """SFP's discovered words over a day range."""

    use_case: str = PydField(description="The SFP use case.")
    days: list[date] = PydField(description="The UTC days whose sketches were combined.")
    n: int = PydField(description="Reports in those sketches.")
    words: list[Discovery] = PydField(
        description="The words found above the publication threshold, most frequent first."
    )
    threshold: float = PydField(
        description="The estimated count a word needs to be published: the policy's"
        " `publish_threshold`, or 4 standard errors of a word nobody sent (the noise floor,"
        " which grows with the square root of `n`)."
    )

"""Refuse ``DPGOV_`` environment variables that name no setting, suggesting the nearest one.

A mistyped setting (``DPGOV_DATABASE_ULR``) would otherwise be ignored, and the command would
run on the default in its place: a ledger in the current folder that reports 0 spent.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping

__all__ = [
    "NOT_SETTINGS",
    "PREFIX",
    "RETIRED",
    "NullList",
    "SettingRefused",
    "UnknownSetting",
    "check_environment",
    "check_no_null_lists",
    "retired_variables",
    "unknown_variables",
]

PREFIX = "DPGOV_"

# Variables with the prefix that are not service settings: the test suite's own.
NOT_SETTINGS = frozenset({"DPGOV_TEST_DATABASE_URL", "DPGOV_SCREENSHOT_DIR"})

# Settings a release removed: still set in deployments, so they warn instead of stopping a start.
RETIRED = {
    "DPGOV_VERIFY_CACHE_SECONDS": "the dashboard shows the `verify` job's verification, run"
    " every DPGOV_VERIFY_SECONDS",
}


class SettingRefused(ValueError):
    """A ``DPGOV_`` variable refused before the settings are parsed; the message says why."""


class NullList(SettingRefused):
    """A list setting set to JSON ``null``, which the settings' parser would take for unset."""

    def __init__(self, name: str) -> None:
        super().__init__(f"invalid setting {name}: null is not a list (unset it for the default)")
        self.name = name


def check_no_null_lists(environ: Mapping[str, str], lists: Collection[str]) -> None:
    """Raise :class:`NullList` for a variable of ``lists`` whose value is ``null``.

    >>> try:
    ...     check_no_null_lists({"DPGOV_WITNESSES": " null "}, ["DPGOV_WITNESSES"])
    ... except NullList as exc:
    ...     print(exc.name)
    DPGOV_WITNESSES
    """
    wanted = {name.upper() for name in lists}
    for name in sorted(environ):
        if name.upper() in wanted and environ[name].strip() == "null":
            raise NullList(name.upper())


class UnknownSetting(SettingRefused):
    """A ``DPGOV_`` variable that is no setting; the message names it and the nearest name."""

    def __init__(self, name: str, suggestion: str | None) -> None:
        hint = f" (did you mean {suggestion}?)" if suggestion else ""
        super().__init__(
            f"unknown setting {name}{hint}: every DPGOV_ variable must be a setting listed in"
            " docs/configuration.md; unset or rename it"
        )
        self.name = name
        self.suggestion = suggestion


def unknown_variables(environ: Mapping[str, str], known: Collection[str]) -> list[str]:
    """The variables of ``environ`` with the prefix (in any case) that ``known`` does not name.

    >>> unknown_variables({"DPGOV_PORT": "1", "DPGOV_PROT": "2", "HOME": "/"}, ["DPGOV_PORT"])
    ['DPGOV_PROT']
    """
    names = {name.upper() for name in known} | NOT_SETTINGS | RETIRED.keys()
    return sorted(
        name for name in environ if name.upper().startswith(PREFIX) and name.upper() not in names
    )


def check_environment(environ: Mapping[str, str], known: Collection[str]) -> None:
    """Raise :class:`UnknownSetting` for the first unknown variable, with the nearest known name.

    >>> try:
    ...     check_environment({"DPGOV_DATABASE_ULR": "x"}, ["DPGOV_DATABASE_URL"])
    ... except UnknownSetting as exc:
    ...     print(exc.name, exc.suggestion)
    DPGOV_DATABASE_ULR DPGOV_DATABASE_URL
    """
    unknown = unknown_variables(environ, known)
    if unknown:
        name = unknown[0]
        suffixes = {known_name.upper().removeprefix(PREFIX): known_name for known_name in known}
        stem = name.upper().removeprefix(PREFIX)  # the shared prefix would make any name close
        nearest = difflib.get_close_matches(stem, sorted(suffixes), n=1, cutoff=0.6)
        raise UnknownSetting(name, suffixes[nearest[0]] if nearest else None)


def retired_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning for each variable of ``environ`` naming a removed setting (:data:`RETIRED`).

    >>> retired_variables({"DPGOV_VERIFY_CACHE_SECONDS": "60"})[0].split(":")[0]
    'DPGOV_VERIFY_CACHE_SECONDS is no longer used and has no effect'
    """
    return [
        f"{name.upper()} is no longer used and has no effect: {RETIRED[name.upper()]}; unset it"
        for name in sorted(environ)
        if name.upper() in RETIRED
    ]

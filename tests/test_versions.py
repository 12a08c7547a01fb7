"""One version, written once in pyproject.toml: what states it reads it, and the changelog has it.

A release bumps ``[project] version`` in ``pyproject.toml``, reinstalls, and gives CHANGELOG.md a
``## X.Y.Z - YYYY-MM-DD`` section for it; everything else reads the installed metadata.
"""

from __future__ import annotations

import re
import tomllib
from datetime import date
from importlib.metadata import version
from pathlib import Path

from pydantic import SecretStr

import dp_governor
from dp_governor.api.app import create_app
from dp_governor.api.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
CHANGELOG = ROOT / "CHANGELOG.md"
_RELEASE = re.compile(r"^## (\d+\.\d+\.\d+) - (\d{4}-\d{2}-\d{2})$", re.M)


def _sections() -> list[str]:
    """The changelog's second-level headings, in the file's order."""
    return re.findall(r"^## (.+)$", CHANGELOG.read_text(encoding="utf-8"), flags=re.M)


def _releases() -> list[tuple[str, date]]:
    """Every released section's version and date, newest first as written."""
    text = CHANGELOG.read_text(encoding="utf-8")
    return [(v, date.fromisoformat(d)) for v, d in _RELEASE.findall(text)]


def _key(v: str) -> tuple[int, ...]:
    return tuple(int(part) for part in v.split("."))


def test_the_installed_version_is_pyproject_s() -> None:
    """A bumped ``pyproject.toml`` without a reinstall fails here, not in a user's hands."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        written = tomllib.load(f)["project"]["version"]
    assert version("dp-governor") == written, "reinstall: pip install -e '.[test,dev]'"
    assert dp_governor.__version__ == written


def test_the_newest_released_section_of_the_changelog_is_the_installed_version() -> None:
    releases = _releases()
    assert releases, "CHANGELOG.md has no `## X.Y.Z - YYYY-MM-DD` section"
    assert releases[0][0] == dp_governor.__version__, (
        f"the installed version is {dp_governor.__version__} but CHANGELOG.md's newest release"
        f" is {releases[0][0]}: give the release its section"
    )


def test_the_changelog_has_unreleased_first_then_releases_newest_first() -> None:
    sections = _sections()
    assert sections[0] == "Unreleased"
    releases = _releases()
    assert len(releases) == len(sections) - 1, f"a heading is not `X.Y.Z - YYYY-MM-DD`: {sections}"
    versions = [_key(v) for v, _ in releases]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    dates = [d for _, d in releases]
    assert dates == sorted(dates, reverse=True)


def test_the_service_states_the_installed_version() -> None:
    app = create_app(Settings(admin_token=SecretStr("x" * 32)))
    assert app.openapi()["info"]["version"] == dp_governor.__version__

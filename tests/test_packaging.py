"""What ``pip install .`` puts on a user's machine: one import package, typed, complete.

The wheel is built from this checkout (the same build ``pip install .`` runs) and read as a user's
interpreter and type checker would see it, from a folder that is not the repository.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOT_SOURCE = (".git", ".venv", "build", "*.egg-info", "node_modules", "__pycache__", ".*_cache")
USER_CODE = """\
from dp_governor.client import Client

with Client("http://localhost:8000") as client:
    budget = client.budget("device-1")
    wrong: int = budget
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel's files unpacked into a fresh folder, as site-packages would hold them."""
    out = tmp_path_factory.mktemp("wheel")
    source = out / "source"  # a copy: the build writes build/ and *.egg-info into its source
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
        cwd=out,
    )
    (wheel,) = out.glob("*.whl")
    site = out / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def test_the_wheel_holds_exactly_one_top_level_package(installed: Path) -> None:
    top = {p.name for p in installed.iterdir() if not p.name.endswith(".dist-info")}
    assert top == {"dp_governor"}
    for part in ("py.typed", "api/openapi_examples.json", "budget/storage/migrations/env.py"):
        assert (installed / "dp_governor" / part).is_file(), part
    assert not any(p.is_symlink() for p in (installed / "dp_governor").iterdir())


def test_a_users_type_checker_sees_the_clients_real_types(installed: Path, tmp_path: Path) -> None:
    user = tmp_path / "user.py"
    user.write_text(USER_CODE, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(user)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"MYPYPATH": str(installed), "PATH": ""},
    )
    # the user's one error is the deliberate one, naming the real return type (not Any); the
    # package's own lines (third-party stubs it lacks) are site-packages' business, not the user's
    mine = [line for line in proc.stdout.splitlines() if line.startswith(("user.py", str(user)))]
    assert len(mine) == 1, proc.stdout + proc.stderr
    assert 'Incompatible types in assignment (expression has type "DeviceBudget"' in mine[0]

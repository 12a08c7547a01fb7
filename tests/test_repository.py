"""The README's Quickstart and CI stay in step."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _quickstart_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S)]


def test_quickstart_has_exactly_two_one_line_commands() -> None:
    commands = _quickstart_commands()
    assert len(commands) == 2
    assert all("\n" not in c for c in commands)
    assert "dpgov" in commands[0] and "pytest" in commands[1]


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert _quickstart_commands()[1] in ci.splitlines()


def test_every_package_imports_first_in_a_fresh_interpreter() -> None:
    # Import cycles only show when a package is the first one imported.
    import subprocess
    import sys

    packages = (
        "dp_governor",
        "dp_governor.client",
        "dp_governor.policies",
        "dp_governor.budget",
        "dp_governor.mechanisms",
        "dp_governor.pipeline",
        "dp_governor.api",
        "dp_governor.api.app",
        "dp_governor.api.cli",
        "dp_governor.api._lane",
    )
    for package in (
        *packages,
        "dp_governor.api.errors",
        "dp_governor.pipeline.ingest",
        "dp_governor.api.routes.reports",
    ):
        proc = subprocess.run(
            [sys.executable, "-c", f"import {package}"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
        assert proc.returncode == 0, (package, proc.stderr)


def test_the_service_imports_neither_the_cli_nor_the_demo() -> None:
    import subprocess
    import sys

    code = (
        "import sys, dp_governor.api.app; "
        "print(sorted(m for m in sys.modules"
        " if m.split('.')[:3] in (['dp_governor', 'api', 'cli'], ['dp_governor', 'api', 'demo'])))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert proc.stdout.strip() == "[]", proc.stdout


def test_the_policy_store_uses_the_ledgers_write_option() -> None:
    from dp_governor.budget.storage.db import WRITE_OPTION

    source = (ROOT / "policies" / "repository.py").read_text(encoding="utf-8")
    assert f"{WRITE_OPTION}=True" in source


def test_the_concepts_mechanisms_example_runs_as_written() -> None:
    concepts = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
    (code,) = re.findall(r"```python\n(.*?)```", concepts, flags=re.S)
    assert "import dp_governor" in code or "from dp_governor" in code  # as an installed user
    scope: dict[str, object] = {}
    exec(compile(code, "docs/concepts.md", "exec"), scope)
    est = scope["est"]
    counts = est.counts  # type: ignore[attr-defined]
    stderr = est.stderr  # type: ignore[attr-defined]
    # 60,000 and 40,000 reports of two domains, none of the third: within 5 standard errors
    for got, want, se in zip(counts, (60_000, 40_000, 0), stderr, strict=True):
        assert abs(got - want) < 5 * se, (got, want, se)

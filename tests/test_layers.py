"""The layers of docs/architecture.md hold: each package imports only the ones below it.

Read from the source with ``ast`` (every import, at module level or inside a function), so a
local import cannot hide a dependency the way ``init_db``'s once hid a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Each package may import only the packages listed before it.
ORDER = ("mechanisms", "policies", "budget", "api")


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", ORDER)
def test_a_package_imports_only_the_layers_below_it(package: str) -> None:
    forbidden = set(ORDER[ORDER.index(package) + 1 :]) | {"benchmarks", "tests"}
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _modules(package)
        for name in _imported_modules(path)
        if name.split(".")[0] in forbidden
    ]
    assert not wrong, wrong


def test_the_service_never_imports_the_cli_or_the_demo() -> None:
    tools = ("api.cli", "api.demo")
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _modules("api")
        if not {"cli", "demo"} & set(path.relative_to(ROOT / "api").parts)
        for name in _imported_modules(path)
        if name.startswith(tools)
    ]
    assert not wrong, wrong

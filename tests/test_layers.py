"""The layers of docs/architecture.md hold, and no module imports itself back through others.

Each package imports only the ones below it. Read from the source with ``ast`` (every import,
at module level or inside a function), so a local import cannot hide a dependency or a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Each package may import only the packages listed before it.
ORDER = ("mechanisms", "policies", "budget", "pipeline", "api")
PACKAGES = (*ORDER, "benchmarks", "tests")
NAMESPACE = "dp_governor"


def _layer(module: str) -> str:
    """The package a module name belongs to: ``dp_governor.budget.ledger`` is in ``budget``."""
    parts = module.split(".")
    return parts[1] if parts[0] == NAMESPACE and len(parts) > 1 else parts[0]


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
        if _layer(name) in forbidden
    ]
    assert not wrong, wrong


def test_the_project_is_imported_only_through_its_namespace() -> None:
    """Every import of the project's code names ``dp_governor``, never a top-level name."""
    bare = set(ORDER)
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for package in PACKAGES
        for path in _modules(package)
        for name in _imported_modules(path)
        if name.split(".")[0] in bare
    ]
    assert not wrong, wrong


# Inside budget/, each sub-layer may import only those before it (the basics at budget/'s top
# level are below them all; the ledger facade is the module budget/ledger.py).
BUDGET_ORDER = ("privacy", "rule", "storage", "audit", "gate", "ledger", "reporting")
BUDGET_BASICS = ("clock", "errors", "keyed")


def _budget_layer(module: str) -> str | None:
    """The sub-layer of ``dp_governor.budget.<layer>...``; ``None`` for other modules."""
    parts = module.split(".")
    if parts[:2] != [NAMESPACE, "budget"] or len(parts) < 3 or parts[2] in BUDGET_BASICS:
        return None
    return parts[2]


def test_budgets_sub_layers_import_only_the_ones_below() -> None:
    wrong = []
    for path in _modules("budget"):
        layer = _budget_layer(_module_name(path))
        if layer is None:
            continue
        assert layer in BUDGET_ORDER, f"{path} is in no sub-layer of budget/"
        above = set(BUDGET_ORDER[BUDGET_ORDER.index(layer) + 1 :])
        wrong += [
            f"{path.relative_to(ROOT)} imports {name}"
            for name in _imported_modules(path)
            if _budget_layer(name) in above
        ]
    assert not wrong, wrong


def test_the_service_never_imports_the_cli_or_the_demo() -> None:
    tools = ("dp_governor.api.cli", "dp_governor.api.demo")
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _modules("api")
        if not {"cli", "demo"} & set(path.relative_to(ROOT / "api").parts)
        for name in _imported_modules(path)
        if any(name == t or name.startswith(f"{t}.") for t in tools)
    ]
    assert not wrong, wrong


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[0] in ORDER:
        parts = (NAMESPACE, *parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_imports(path: Path, modules: set[str]) -> set[str]:
    """The repository's modules that ``path`` imports: ``from m import x`` is ``m.x`` if a module.

    Relative imports are resolved against the module's package.
    """
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    out = set()
    for target in found:
        while target and target not in modules:  # a name inside a module: the module
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back() -> None:
    paths = [p for package in PACKAGES for p in _modules(package)]
    modules = {_module_name(p) for p in paths}
    graph = {_module_name(p): _module_imports(p, modules) for p in paths}
    assert graph["dp_governor.budget.ledger"] >= {
        "dp_governor.budget.gate.charge",
        "dp_governor.budget.gate.prepared",
    }  # the graph is read
    assert not _cycles(graph), _cycles(graph)


def _owner(module: str) -> str:
    """Who may import a private module: its package, or its sub-layer inside ``budget``."""
    return ".".join(module.split(".")[: 3 if _budget_layer(module) is not None else 2])


def _private_part(module: str) -> str | None:
    """The module's private owner if any of its parts is ``_private``, else ``None``."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return _owner(".".join(parts[: i + 1]))
    return None


def test_no_package_imports_anothers_private_module() -> None:
    """``_private`` modules are their package's own (inside ``budget``: their sub-layer's)."""
    sources = [path for package in ORDER for path in _modules(package)]
    modules = {_module_name(path) for path in sources}
    assert any(_private_part(m) for m in modules), "no private module found: is the test blind?"
    wrong = [
        f"{path.relative_to(ROOT)} imports {target}"
        for path in sources
        for target in _module_imports(path, modules)
        if (owner := _private_part(target)) is not None
        and not _module_name(path).startswith(f"{owner}.")
        and _module_name(path) != owner
    ]
    assert not wrong, wrong


def _ledger_part_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """Reads of ``.engine`` or ``.policies`` on anything (or by ``getattr``), with their lines.

    Whatever the receiver is called (``ledger``, ``self._ledger``, ``app.state.x``): the
    service has no other object with these attributes, so any such read is a ledger's part.
    """
    parts = {"engine", "policies"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in parts:
            found.append((node.lineno, node.attr))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"getattr", "setattr"}
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in parts
        ):
            found.append((node.lineno, str(node.args[1].value)))
    return found


def test_the_service_reaches_the_ledgers_parts_only_through_its_handles() -> None:
    """``api`` asks the ledger facade, or takes its engine and policy store from ``_handles``."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line} reads .{attr}"
        for path in _modules("api")
        if path.name != "_handles.py"
        for line, attr in _ledger_part_reads(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert not wrong, wrong


def test_the_handles_check_sees_any_receiver() -> None:
    code = "x = self._ledger.engine\ny = state.book.policies\nz = getattr(led, 'engine')\n"
    assert [attr for _, attr in _ledger_part_reads(ast.parse(code))] == [
        "engine",
        "policies",
        "engine",
    ]


MAX_MODULE_LINES = 600  # a module a reader can hold in mind; split it by what it does
MAX_FUNCTION_LINES = 150  # a function on a few screens; past that it hides its steps


def test_modules_and_functions_stay_readable() -> None:
    """No module of the packages over 600 lines, no function over 150 (docstrings included)."""
    wrong = []
    for package in ORDER:
        for path in _modules(package):
            text = path.read_text(encoding="utf-8")
            if (lines := text.count("\n")) > MAX_MODULE_LINES:
                wrong.append(f"{path.relative_to(ROOT)}: {lines} lines")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        wrong.append(f"{path.relative_to(ROOT)}: {node.name}() {length} lines")
    assert not wrong, wrong

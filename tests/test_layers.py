"""Imports point down only: the layering of the package, checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

import aiservices

PACKAGE = Path(aiservices.__file__).parent
SDKS = {
    "openai",
    "anthropic",
    "httpx",
    "redis",
    "psycopg",
    "psycopg_pool",
    "opentelemetry",
    "fastapi",
    "starlette",
    "mcp",
}
DRIVER_MODULES = {
    "models/openai.py": {"openai", "httpx"},
    "models/anthropic.py": {"anthropic", "httpx"},
    "models/_anthropic_tokens.py": {"anthropic"},
    "stores/redis.py": {"redis"},
    "stores/postgres.py": {"psycopg", "psycopg_pool"},
    "otel.py": {"opentelemetry"},
    "fastapi.py": {"fastapi"},
    "mcp.py": {"mcp"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(node: ast.Import | ast.ImportFrom, package: str) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if node.level:
        base = package.split(".")
        base = base[: len(base) - node.level + 1]
        name = ".".join([*base, node.module] if node.module else base)
    else:
        name = node.module or ""
    return {name, *(f"{name}.{alias.name}" for alias in node.names)}


def _package(path: Path) -> str:
    return module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:` (never imported at run time)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for statement in node.body:
                inside.update(id(n) for n in ast.walk(statement))
    return inside


def all_imports(path: Path) -> set[str]:
    """Modules ``path`` imports at run time: at the top and inside function bodies."""
    tree = ast.parse(path.read_text())
    skipped = _type_checking_blocks(tree)
    package = _package(path)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skipped:
            found |= _imported(node, package)
    return found


def top_level_imports(path: Path) -> set[str]:
    """Modules imported when ``path`` is imported (not those imported inside functions)."""
    tree = ast.parse(path.read_text())
    package = _package(path)
    found: set[str] = set()
    nodes: list[ast.stmt] = list(tree.body)
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, (ast.If, ast.Try)):
            nodes.extend(node.body + node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= _imported(node, package)
    return found


def sources() -> dict[str, set[str]]:
    """Each module's run-time imports, including those inside function bodies."""
    return {str(path.relative_to(PACKAGE)): all_imports(path) for path in PACKAGE.rglob("*.py")}


def roots(imports: set[str]) -> set[str]:
    return {name.split(".")[0] for name in imports}


def test_sdks_and_drivers_are_imported_only_in_their_own_module() -> None:
    for relative, imports in sources().items():
        allowed = DRIVER_MODULES.get(relative, set())
        assert roots(imports) & SDKS <= allowed, relative


def test_bottom_layers_import_nothing_above_them() -> None:
    above = {
        "aiservices.service",
        "aiservices._runner",
        "aiservices._plan",
        "aiservices.tools",
        "aiservices._toolbox",
        "aiservices._output",
        "aiservices.prompts",
    }
    for relative, imports in sources().items():
        top = relative.split("/")[0]
        if top in {"errors.py", "markers.py", "messages.py", "memory", "stores", "models"}:
            assert not {i for i in imports if any(i.startswith(a) for a in above)}, relative


def test_memory_stores_and_models_do_not_import_each_other() -> None:
    for relative, imports in sources().items():
        top = relative.split("/")[0]
        if top in {"memory", "stores", "models"}:
            others = {"memory", "stores", "models"} - {top}
            # Protocols (the `_base` modules) are the seams everyone may depend on.
            bad = {
                i
                for i in imports
                if any(i.startswith(f"aiservices.{o}") for o in others)
                and not any(i.startswith(f"aiservices.{o}._base") for o in others)
                # A memory given no store makes the default one (design: in-memory).
                and not (top == "memory" and i.startswith("aiservices.stores.in_memory"))
            }
            assert not bad, (relative, bad)


def _modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def test_no_module_imports_another_modules_underscore_names() -> None:
    modules = _modules()
    bad: list[str] = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = _imported(node, _package(path))
            target = min(source, key=len)
            for alias in node.names:
                # A private module's own names need no underscore; a private name of any
                # module is its own business.
                if alias.name.startswith("_") and f"{target}.{alias.name}" not in modules:
                    bad.append(f"{module_name(path)}: {alias.name} from {target}")
    assert not bad, bad


def test_the_package_has_no_import_cycles() -> None:
    """Counting imports inside functions too: a cycle hidden in a function is a cycle."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in all_imports(path):
            # `from . import x` names a module or a name in a package: keep the modules.
            module = imported
            while module and module not in modules:
                module = module.rpartition(".")[0]
            if module and module != name and not name.startswith(f"{module}."):
                targets.add(module)
        graph[name] = targets
    # A package's __init__ re-exports its modules: an edge into a package stands for the
    # module it re-exports, so package nodes are left out of the walk.
    packages = {module_name(p) for p in PACKAGE.rglob("__init__.py")}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, path: list[str]) -> bool:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if target in packages:
                continue
            if state.get(target) == 1:
                cycle.extend([*path[path.index(target) :], target])
                return True
            if target not in state and visit(target, [*path, target]):
                return True
        state[node] = 2
        return False

    for node in sorted(graph):
        if node not in packages and node not in state and visit(node, [node]):
            break
    assert not cycle, " -> ".join(cycle)

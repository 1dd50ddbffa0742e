"""Imports point down only: the layering of the package, checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

import aiservices

PACKAGE = Path(aiservices.__file__).parent
SDKS = {"openai", "anthropic", "httpx", "redis", "psycopg", "psycopg_pool", "opentelemetry"}
DRIVER_MODULES = {
    "models/openai.py": {"openai", "httpx"},
    "models/anthropic.py": {"anthropic", "httpx"},
    "models/_anthropic_tokens.py": {"anthropic"},
    "stores/redis.py": {"redis"},
    "stores/postgres.py": {"psycopg", "psycopg_pool"},
    "otel.py": {"opentelemetry"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def top_level_imports(path: Path) -> set[str]:
    """Modules imported when ``path`` is imported (not those imported inside functions)."""
    tree = ast.parse(path.read_text())
    package = (
        module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    )
    found: set[str] = set()
    nodes: list[ast.stmt] = list(tree.body)
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, (ast.If, ast.Try)):
            nodes.extend(node.body + node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.add(name)
            for alias in node.names:
                found.add(f"{name}.{alias.name}")
    return found


def sources() -> dict[str, set[str]]:
    return {
        str(path.relative_to(PACKAGE)): top_level_imports(path) for path in PACKAGE.rglob("*.py")
    }


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
            }
            assert not bad, (relative, bad)

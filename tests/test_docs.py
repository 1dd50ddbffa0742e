"""The documentation site: it builds strictly, its pages exist, and its code runs.

The build needs the ``docs`` extra (MkDocs, Material, mkdocstrings). Without it the build
test is skipped, saying how to install it; under ``CI=true`` it fails instead, so CI never
passes without having built the site.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"

# Pages whose ```python blocks run as they are, in order, one namespace per page. A block
# right after a line `<!-- not run: why -->` is skipped (it needs an API key, say).
RUNNABLE_PAGES = [
    "index.md",
    "getting-started.md",
    "prompts.md",
    "streaming.md",
    "events.md",
    "guardrails.md",
    "retrieval.md",
    "observability.md",
    "coming-from-langchain4j.md",
    "testing.md",
    "services.md",
    "outputs.md",
    "memory.md",
    "stores.md",
    "tools.md",
    "providers.md",
]

_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```python[^\n]*\n(?P<code>.*?)^(?P=indent)```[ \t]*$", re.M | re.S
)
_NOT_RUN = re.compile(r"<!--\s*not run\b.*?-->\s*$")


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _nav_pages() -> list[str]:
    """The pages named in mkdocs.yml's nav, read without a YAML parser."""
    text = CONFIG.read_text(encoding="utf-8")
    nav = re.search(r"^nav:\n(?P<body>(?:[ \t]+.*\n|\n)+)", text, re.M)
    assert nav is not None, "mkdocs.yml has no nav"
    return re.findall(r"^\s*-\s*(?:[^:\n]+:\s*)?(\S+\.md)\s*$", nav["body"], re.M)


def _code_blocks(page: Path) -> list[tuple[int, str]]:
    """``(line, code)`` of every python block of a page that is meant to run."""
    text = page.read_text(encoding="utf-8")
    blocks = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if _NOT_RUN.search(before):
            continue
        line = text.count("\n", 0, match.start()) + 2
        blocks.append((line, textwrap.dedent(match["code"])))
    return blocks


def test_every_nav_page_exists() -> None:
    pages = _nav_pages()
    assert pages, "the nav names no page"
    missing = [p for p in pages if not (DOCS / p).is_file()]
    assert not missing, f"pages in mkdocs.yml's nav that do not exist: {missing}"


def test_every_page_is_in_the_nav() -> None:
    pages = set(_nav_pages())
    present = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert present - pages == set(), "pages missing from mkdocs.yml's nav"


def test_links_between_pages_point_at_pages() -> None:
    broken = []
    for page in DOCS.rglob("*.md"):
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", page.read_text("utf-8")):
            if "://" not in target and not (page.parent / target).resolve().is_file():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken


def test_readme_links_to_existing_docs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\((docs/[^)#\s]+)", readme)
    assert targets, "the README links to no documentation page"
    assert [t for t in targets if not (ROOT / t).is_file()] == []


def test_api_reference_names_exist() -> None:
    """Every ``::: dotted.name`` and every listed member resolves, without MkDocs."""
    problems = []
    for page in sorted((DOCS / "api").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(
            r"^::: (?P<name>[\w.]+)\n(?P<options>(?:[ \t]+.*\n)*)", text + "\n", re.M
        ):
            obj = _resolve(match["name"])
            if obj is None:
                problems.append(f"{page.name}: {match['name']}")
                continue
            members = re.search(r"members:\n((?:[ \t]+- \w+\n)+)", match["options"])
            if members:
                for member in re.findall(r"- (\w+)", members[1]):
                    if not hasattr(obj, member):
                        problems.append(f"{page.name}: {match['name']}.{member}")
    assert not problems, f"API reference entries that do not exist: {problems}"


def _resolve(dotted: str) -> object | None:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return None
            obj = getattr(obj, attribute)
        return obj
    return None


@pytest.mark.parametrize("page", RUNNABLE_PAGES)
def test_page_code_runs(
    page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The page's python blocks run, offline, in order, as a reader would paste them."""
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for line, code in _code_blocks(DOCS / page):
        try:
            # dont_inherit: this module's `from __future__ import annotations` must not
            # reach the page's code, which a reader runs without it.
            exec(compile(code, f"{page}:{line}", "exec", dont_inherit=True), namespace)
        except BaseException as error:
            pytest.fail(f"the block at {page}:{line} raised {error!r}\n\n{code}")
    capsys.readouterr()


def test_site_builds_strictly(tmp_path: Path) -> None:
    missing = [name for name in _DOCS_MODULES if not _importable(name)]
    if missing:
        reason = f'the docs build needs {", ".join(missing)}: pip install -e ".[docs]"'
        if _in_ci():
            pytest.fail(f"{reason} (CI is set: the site must build here)")
        pytest.skip(reason)
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(CONFIG), "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for page in _nav_pages():
        path = Path(page)
        folder = path.parent if path.name == "index.md" else path.with_suffix("")
        assert (site / folder / "index.html").is_file(), f"{page} was not built"
    # Every public name has an entry in the API reference.
    anchors: set[str] = set()
    for built in (site / "api").glob("*/index.html"):
        anchors |= set(re.findall(r'id="([^"]+)"', built.read_text(encoding="utf-8")))
    absent = [
        f"{module}.{name}"
        for module in _PUBLIC_MODULES
        for name in importlib.import_module(module).__all__
        if not any(anchor == name or anchor.endswith(f".{name}") for anchor in anchors)
    ]
    assert not absent, f"public names missing from docs/api: {absent}"


_PUBLIC_MODULES = (
    "aiservices",
    "aiservices.observability",
    "aiservices.memory",
    "aiservices.stores",
    "aiservices.tools",
    "aiservices.models",
    "aiservices.testing",
)


_DOCS_MODULES = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def test_docstrings_use_markdown_not_restructuredtext_roles() -> None:
    # The API pages render docstrings as Markdown: a `:meth:` role would show as written.
    role = re.compile(r":(?:meth|func|class|attr|mod|data|exc|obj):`")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "aiservices").rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if role.search(line)
    ]
    assert not found, "write `name` instead of :meth:`name` in: " + ", ".join(found)

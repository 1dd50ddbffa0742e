"""Every code block of the README runs as written, and prints what its ``# ->`` lines say.

A ```python block runs on its own, in a fresh namespace and an empty folder, as a reader
pasting it would. A statement followed by ``# -> text`` (on its last line, or on comment
lines right after it) must show that text: the repr of its value, or what it printed. The
lines of a long output are each marked ``# ->``; whitespace is compared loosely.

The ```bash blocks install into a new virtualenv, which a test cannot do in reasonable
time; their commands are checked against what the tests run instead, and the demo command
is run with this interpreter.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
_FENCE = re.compile(r"^```(?P<lang>\w*)[^\n]*\n(?P<code>.*?)^```[ \t]*$", re.M | re.S)
_EXPECTED = re.compile(r"#\s?->\s?(?P<text>.*)$")


@dataclass(frozen=True)
class Block:
    """One fenced block of the README."""

    lang: str
    line: int
    code: str


def _blocks(lang: str) -> list[Block]:
    text = README.read_text(encoding="utf-8")
    return [
        Block(m["lang"], text.count("\n", 0, m.start()) + 2, m["code"])
        for m in _FENCE.finditer(text)
        if m["lang"] == lang
    ]


def _loose(text: str) -> str:
    return " ".join(text.split())


def _expectations(code: str, statement: ast.stmt, following: ast.stmt | None) -> str | None:
    """The text the ``# ->`` comments after ``statement`` expect, or ``None`` if none."""
    lines = code.splitlines()
    end = statement.end_lineno or statement.lineno
    stop = following.lineno - 1 if following is not None else len(lines)
    found = []
    for number in range(end, stop + 1):
        line = lines[number - 1]
        if number > end and not line.lstrip().startswith("#"):
            break  # only comment lines right after the statement belong to it
        match = _EXPECTED.search(line)
        if match is not None:
            found.append(match["text"])
    return " ".join(found) if found else None


def _run_block(block: Block) -> list[str]:
    """Run the block statement by statement; the mismatches found."""
    tree = ast.parse(block.code)
    namespace: dict[str, object] = {"__name__": "__readme__"}
    problems = []
    statements = tree.body
    for index, statement in enumerate(statements):
        following = statements[index + 1] if index + 1 < len(statements) else None
        expected = _expectations(block.code, statement, following)
        where = f"README.md:{block.line + statement.lineno - 1}"
        printed = io.StringIO()
        # dont_inherit: this module's `from __future__ import annotations` is not the reader's.
        with contextlib.redirect_stdout(printed):
            if isinstance(statement, ast.Expr):
                code = compile(ast.Expression(statement.value), where, "eval", dont_inherit=True)
                value = eval(code, namespace)
            else:
                module = ast.Module([statement], [])
                exec(compile(module, where, "exec", dont_inherit=True), namespace)
                value = None
        shown = printed.getvalue() + (repr(value) if value is not None else "")
        if expected is not None and _loose(shown) != _loose(expected):
            problems.append(f"{where}: expected {expected!r}, got {shown!r}")
    return problems


PYTHON_BLOCKS = _blocks("python")


def test_the_readme_shows_python_blocks_with_their_output() -> None:
    assert len(PYTHON_BLOCKS) >= 6  # hello world, memory, typed, tools, streaming, async
    silent = [b.line for b in PYTHON_BLOCKS if not _EXPECTED.search(b.code)]
    assert silent == [], f"README blocks that show no output (# -> ...): lines {silent}"


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=lambda b: f"line{b.line}")
def test_readme_python_block(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    assert _run_block(block) == []


def _commands() -> list[str]:
    commands = []
    for block in _blocks("bash"):
        for line in block.code.splitlines():
            line = line.split("#", 1)[0].strip()  # noqa: PLW2901 - the command without its comment
            if line:
                commands.extend(part.strip() for part in line.split("&&"))
    return commands


def test_the_readme_commands_are_the_ones_tested() -> None:
    commands = _commands()
    # The two commands a newcomer runs first; .ci/run runs the same test command.
    assert "python3 -m venv .venv" in commands
    assert ".venv/bin/pip install -e ." in commands
    assert ".venv/bin/python -m aiservices.demo" in commands
    assert '.venv/bin/pip install -e ".[dev]"' in commands
    assert ".venv/bin/python -m pytest -q" in commands
    assert ".venv/bin/python -m pytest -q" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    unknown = [
        c
        for c in commands
        if not c.startswith((".venv/bin/", "python3 -m venv .venv", "bash .ci/services"))
    ]
    assert unknown == []


def test_the_readme_demo_command_runs(tmp_path: Path) -> None:
    """The demo as the README starts it, in an empty folder, with no key set."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")}
    done = subprocess.run(
        [sys.executable, "-m", "aiservices.demo"],
        input="Hi, my name is Alice\nwhat is 6 * 7?\n/profile\n",
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
        check=True,
    )
    assert "OFFLINE" in done.stdout
    assert "calculate(expression='6 * 7') -> 42" in done.stdout
    assert "name:  'Alice'" in done.stdout
    assert (tmp_path / "aiservices-demo.db").is_file()

"""Every example runs offline, on the scripted model."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs_offline(path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")}
    done = subprocess.run(
        [sys.executable, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


def test_tool_agent_runs_both_tools() -> None:
    module = runpy.run_path(str(EXAMPLES[0].parent / "tool_agent.py"))
    if os.environ.get("OPENAI_API_KEY") or os.environ.get("ANTHROPIC_API_KEY"):
        pytest.skip("runs against a real provider when a key is set")
    result = module["main"]()
    assert [e.request.name for e in result.tool_executions] == ["order_status", "calculate"]
    assert result.tool_executions[0].result == "shipped on Monday"
    assert float(result.tool_executions[1].result) == pytest.approx(59.97)


def test_the_fastapi_example_says_what_to_install_without_fastapi() -> None:
    # None in sys.modules makes `import fastapi` fail as it does where it is not installed.
    code = (
        "import runpy, sys; sys.modules['fastapi'] = None\n"
        f"runpy.run_path({str(EXAMPLES[0].parent / 'fastapi_chat.py')!r}, run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert 'this example needs FastAPI and httpx: pip install -e ".[fastapi]" httpx' in done.stderr

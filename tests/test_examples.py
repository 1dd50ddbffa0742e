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

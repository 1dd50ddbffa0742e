"""The demo behind the README's first command, driven through a pipe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_demo(db: Path, *lines: str, user: str = "alice") -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")}
    done = subprocess.run(
        [sys.executable, "-m", "aiservices.demo", "--db", str(db), "--user", user],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    return done.stdout


def test_demo_is_offline_and_remembers_across_restarts(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    first = run_demo(db, "Hi, my name is Alice", "/quit")
    assert "OFFLINE" in first
    second = run_demo(db, "who am I?")
    assert 'You told me: "Hi, my name is Alice"' in second


def test_demo_commands(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    out = run_demo(
        db,
        "I like tea",
        "/history",
        "/user bob",
        "who am I?",
        "/user alice",
        "/forget",
        "who am I?",
    )
    assert "[user] I like tea" in out
    assert "(now talking as bob)" in out
    assert "I know nothing about you yet" in out
    assert "(forgot everything about alice)" in out
    assert out.count("I know nothing about you yet") == 2

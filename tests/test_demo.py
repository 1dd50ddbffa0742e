"""The demo behind the README's first command, driven through a pipe."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from aiservices import demo
from aiservices.demo import _calculation, calculate

KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in KEYS}
    env.update(extra)
    return env


def run_demo(
    db: Path, *lines: str, user: str = "alice", args: tuple[str, ...] = (), code: int = 0
) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "aiservices.demo", "--db", str(db), "--user", user, *args],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        check=False,
    )
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
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


def test_help_unknown_commands_and_an_empty_history(tmp_path: Path) -> None:
    out = run_demo(tmp_path / "demo.db", "/history", "/help", "/halp", "/user")
    assert "(nothing yet: alice has not said anything)" in out
    assert "/profile" in out
    assert "/forget" in out
    assert "unknown command /halp; /help lists the commands" in out
    assert "usage: /user NAME" in out
    assert "bot:" not in out  # no command went to the model


def test_a_tool_call_and_a_typed_answer(tmp_path: Path) -> None:
    out = run_demo(
        tmp_path / "demo.db", "Hi, I am Alice", "I like green tea", "what is 12 * (3 + 4)?"
    )
    assert "[tool] calculate(expression='12 * (3 + 4)') -> 84" in out
    assert "bot: 12 * (3 + 4) = 84" in out
    out = run_demo(tmp_path / "demo.db", "/profile", "/history")
    assert "a Profile, parsed from the model's JSON answer" in out
    assert "name:  'Alice'" in out
    assert "facts: I am Alice; I like green tea" in out
    assert "[ai] asks for calculate(expression='12 * (3 + 4)')" in out
    assert "[tool] calculate -> 84" in out


def test_every_line_fits_80_columns(tmp_path: Path) -> None:
    folder = tmp_path / "a very long folder name that goes on and on"
    folder.mkdir()
    out = run_demo(
        folder / "demo.db",
        "Hi, my name is Alice and I would like to tell you a long story about my "
        "grandmother's garden, where tomatoes grew taller than the fence every summer",
        "what is 2 ** 2000?",
        "/history",
        "/profile",
        "/help",
        "who am I?",
    )
    wide = [line for line in out.splitlines() if len(line) > 80]
    assert wide == []


def test_a_database_in_a_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    out = run_demo(tmp_path / "nowhere" / "demo.db", "hello", code=2)
    assert "there is no folder" in " ".join(out.split())


def test_end_of_input_and_quit_leave_quietly(tmp_path: Path) -> None:
    run_demo(tmp_path / "demo.db", "hello")
    run_demo(tmp_path / "demo.db", "/quit", "never read")


@pytest.mark.skipif(sys.platform == "win32", reason="no SIGINT to a child on Windows")
def test_ctrl_c_leaves_without_a_traceback(tmp_path: Path) -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "aiservices.demo", "--db", str(tmp_path / "demo.db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert demo.stdout is not None
    try:
        # The banner's last line is printed once the demo waits for input.
        while "/help lists the commands" not in demo.stdout.readline():
            pass
        demo.send_signal(signal.SIGINT)
        out, err = demo.communicate(timeout=30)
    finally:
        demo.kill()
    assert demo.returncode == 130
    assert "Traceback" not in err, err
    assert "bye" in out


def _demo_without(sdk: str, *args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    # None in sys.modules makes `import openai` fail as it does where it is not installed.
    code = (
        f"import sys; sys.modules[{sdk!r}] = None\n"
        "from aiservices.demo import main\n"
        f"raise SystemExit(main({list(args)!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(**({key: "sk-test"} if key else {})),
        check=False,
    )


def test_a_key_without_its_sdk_falls_back_to_the_offline_model(tmp_path: Path) -> None:
    done = _demo_without("openai", "--db", str(tmp_path / "demo.db"), key="OPENAI_API_KEY")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    out = " ".join(done.stdout.split())
    assert "OPENAI_API_KEY is set, but the 'openai' package is not installed" in out
    assert '\n    pip install -e ".[openai]"\n' in done.stdout
    assert "the offline model answers" in out
    assert "OFFLINE" in out


def test_a_provider_asked_for_without_its_sdk_is_a_clear_error(tmp_path: Path) -> None:
    args = ("--db", str(tmp_path / "demo.db"), "--provider", "anthropic")
    done = _demo_without("anthropic", *args, key="ANTHROPIC_API_KEY")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    out = " ".join(done.stdout.split())
    assert "error: the 'anthropic' package is not installed" in out
    assert '\n    pip install -e ".[anthropic]"\n' in done.stdout


def test_provider_offline_ignores_a_key(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "aiservices.demo", "--provider", "offline"]
    done = subprocess.run(
        [*command, "--db", str(tmp_path / "d.db")],
        input="hello\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(OPENAI_API_KEY="sk-never-used"),
        check=True,
    )
    assert "OFFLINE" in done.stdout
    assert "I heard you" in done.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        # A model's own colon is part of its name; the provider named in any case.
        (("--provider", "openai", "--model", "llama3.1:8b"), "no OpenAI API key"),
        (("--model", "OpenAI:gpt-4o-mini"), "no OpenAI API key"),
        (("--provider", "anthropic", "--model", "openai:gpt-4o"), "name two providers"),
    ],
)
def test_model_option_reads_provider_prefixes_as_the_registry_does(
    tmp_path: Path, args: tuple[str, ...], said: str
) -> None:
    out = run_demo(tmp_path / "demo.db", "/quit", args=args, code=2)
    assert said in out
    assert "unknown provider" not in out


@pytest.mark.parametrize(
    ("expression", "result"),
    [
        ("12 * (3 + 4)", "84"),
        ("7 / 2", "3.5"),
        ("-2 ** 3", "-8"),
        ("10 // 3 % 2", "1"),
        # Exact: no float rounding, no 6-digit display.
        ("1234567.5 + 1", "1234568.5"),
        ("100000.5 * 3", "300001.5"),
        ("2**53 + 1", "9007199254740993"),
        ("0.1 + 0.2", "0.3"),
        ("1 / 3", "0.3333333333333333333333333333"),
        ("2 ** -2", "0.25"),
        ("2 ** 0.5", "1.4142135623730951"),
        ("(-2) ** (7 // 2)", "-8"),
    ],
)
def test_calculate(expression: str, result: str) -> None:
    assert calculate(expression) == result


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("__import__('os')", "only numbers"),
        ("2 ** 5000", "exponents above 1000"),
        ("1 / 0", "division by zero"),
        ("1 +", "not an arithmetic expression"),
        ("2**1000 * 2**1000 * 2**1000 * 2**1000 * 2**1000", "too large"),
        ("(-8) ** 0.5", "no real root"),
    ],
)
def test_calculate_refuses(expression: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        calculate(expression)


@pytest.mark.parametrize(
    ("question", "expression"),
    [
        ("what is -5 + 3?", "-5 + 3"),
        ("what is 5 - (-3)?", "5 - (-3)"),
        ("12 * (3 + 4)", "12 * (3 + 4)"),
        ("calculate 2**10", "2**10"),
        ("I live at 10-12 Main Street", None),
        ("I am 42", None),
        ("I live at 10-12 Main Street; what is 2 + 2?", "2 + 2"),
    ],
)
def test_the_offline_model_calculates_what_is_asked_as_written(
    question: str, expression: str | None
) -> None:
    assert _calculation(question) == expression


@pytest.mark.parametrize(
    ("make", "said"), [("folder", "it is a directory"), ("text", "not a SQLite database")]
)
def test_a_database_path_sqlite_cannot_use_is_a_clear_error(
    tmp_path: Path, make: str, said: str
) -> None:
    db = tmp_path / "demo.db"
    if make == "folder":
        db.mkdir()
    else:
        db.write_text("not a database\n")
    out = " ".join(run_demo(db, "hello", code=2).split())
    assert out.startswith("error: cannot open SQLite database")
    assert said in out


def test_a_model_named_without_a_key_says_it_is_not_used(tmp_path: Path) -> None:
    out = " ".join(run_demo(tmp_path / "demo.db", "/quit", args=("--model", "gpt-4o")).split())
    assert "note: --model gpt-4o is not used: no OPENAI_API_KEY or ANTHROPIC_API_KEY is set." in out
    assert "OFFLINE" in out


def test_install_advice_follows_how_aiservices_was_installed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert 'pip install -e ".[openai]"' in demo._install_advice("openai")  # this clone
    monkeypatch.setattr(demo, "__file__", str(tmp_path / "site" / "aiservices" / "demo.py"))
    assert demo._install_advice("openai").endswith('pip install "aiservices[openai]"')

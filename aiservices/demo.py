"""A per-user chatbot in the terminal, its memory in SQLite: ``python -m aiservices.demo``."""

from __future__ import annotations

import argparse
import ast
import contextlib
import decimal
import itertools
import json
import math
import operator
import os
import re
import shutil
import sys
import textwrap
from collections.abc import Callable, Sequence
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Final, Protocol, TextIO

from pydantic import BaseModel

from ._result import Result
from .markers import MemoryId
from .memory import MessageWindowChatMemory
from .messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionRequest,
    ToolExecutionResultMessage,
    UserMessage,
)
from .models import ChatModel, ChatRequest, ChatResponse
from .prompts import system_message, user_message
from .service import ChatMemoryAccess, ai_service
from .tools import tool

__all__ = ["OfflineDemoModel", "Profile", "calculate", "main"]

_EPILOG: Final = """\
Without an API key the demo runs on an offline stand-in that can only recall
what you told it, do arithmetic with the calculate tool, and sum up what it
knows about you as a typed Profile: enough to see memory (across restarts too),
tools and typed answers at work. With OPENAI_API_KEY or ANTHROPIC_API_KEY set,
and the openai or anthropic extra installed, it talks to that provider."""

_PROVIDERS: Final = {
    "openai": ("OPENAI_API_KEY", "gpt-4o-mini"),
    "anthropic": ("ANTHROPIC_API_KEY", "claude-haiku-4-5"),
}

_HELP: Final = """\
commands:
  /help          this list
  /history       what this user's conversation holds
  /profile       what the model knows about this user, as a typed Profile
  /forget        erase this user's conversation
  /user NAME     talk as someone else (each user has a memory of their own)
  /quit          leave (Ctrl-D and Ctrl-C too)
try: "my name is Alice", "I like tea", "what is 12 * 7?", then /quit, start
again and ask "who am I?\""""

_WIDTH: Final = 80


# -- what the model is given: a tool and a typed answer -------------------------------


_OPERATORS: Final[dict[type[ast.AST], Callable[..., Any]]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_MAX_EXPONENT: Final = 1000
_MAX_BITS: Final = 4000  # about 1,200 digits


def _evaluate(node: ast.AST) -> Fraction | float:
    """The value of ``node``: exact (a Fraction) unless a root made it irrational."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        if isinstance(node.value, bool):
            raise ValueError("True and False are not numbers here")
        # As written: 0.1 is one tenth, not the float nearest to it.
        return Fraction(repr(node.value)) if isinstance(node.value, float) else Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _checked(_OPERATORS[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            # 9 ** 9 ** 9 would keep the demo busy for ever.
            if abs(float(right)) > _MAX_EXPONENT:
                raise ValueError(f"exponents above {_MAX_EXPONENT} are not supported")
            if isinstance(right, Fraction) and right.denominator == 1:
                return _checked(left**right.numerator)
            if left < 0:
                raise ValueError("a negative number has no real root")
            return _checked(float(left) ** float(right))
        return _checked(_OPERATORS[type(node.op)](left, right))
    raise ValueError("only numbers, + - * / // % ** and parentheses are supported")


def _checked(value: Fraction | float) -> Fraction | float:
    if isinstance(value, int):  # (what // gives)
        value = Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("the result is too large")
    elif max(abs(value.numerator).bit_length(), value.denominator.bit_length()) > _MAX_BITS:
        raise ValueError("the result is too large")
    return value


def _shown(value: Fraction | float) -> str:
    if isinstance(value, float):
        return repr(value)
    if value.denominator == 1:
        return str(value.numerator)
    # Exact when the decimal expansion ends (7/2 is 3.5), else 28 significant digits.
    with decimal.localcontext(prec=28):
        return format((Decimal(value.numerator) / Decimal(value.denominator)).normalize(), "f")


@tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression, such as ``(12 + 3) * 7``."""
    try:
        value = _evaluate(ast.parse(expression, mode="eval"))
    except SyntaxError:
        raise ValueError(f"{expression!r} is not an arithmetic expression") from None
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except OverflowError:
        raise ValueError("the result is too large") from None
    return _shown(value)


class Profile(BaseModel):
    """What the model knows about the user."""

    name: str | None
    facts: list[str]


@system_message(
    "You are a friendly assistant in a terminal demo. Keep answers short. "
    "Use the calculate tool for arithmetic."
)
class _Chatbot(ChatMemoryAccess, Protocol):
    def chat(self, user: Annotated[str, MemoryId], message: str) -> Result[str]: ...

    @user_message(
        "What do you know about me? Give my name if I told you, and the facts I told you "
        "about myself, in my words."
    )
    def profile(self, user: Annotated[str, MemoryId]) -> Profile: ...


# -- the offline stand-in -------------------------------------------------------------------

# A name starts with a capital: "I am Alice", not "I am tired".
_NAME: Final = re.compile(r"\b(?i:my name is|i am|i'm|call me)\s+([A-Z][\w-]*)")
_FACT: Final = re.compile(
    r"\b(?:my name is|i am|i'm|call me|i like|i love|i live in|i work)\b.*", re.I
)
_QUESTION: Final = re.compile(
    r"\b(what is my name|who am i|what do i (?:like|love)|where do i live|"
    r"what did i (?:say|tell you)|what do you know about me)\b",
    re.I,
)
# A run of numbers, operators and parentheses ("-5 + 3", "12 * (3 + 4)", "5 - (-3)") is a
# calculation when an operator stands between two operands and the user asks for it: a
# question, or the calculation alone ("10-12 Main Street" is an address).
_ARITHMETIC: Final = re.compile(r"(?<![\w.])(?:-\s*)?[\d(][\d\s.()+\-*/%]*[\d)]", re.ASCII)
_BINARY: Final = re.compile(r"[\d)]\s*(?:\*\*|//|[-+*/%])\s*[-(\d]", re.ASCII)
_ASKED: Final = re.compile(r"\?|^\s*(?:calculate|compute|what is|what's|how much is)\b", re.I)


def _calculation(question: str) -> str | None:
    """The calculation the user asks for, if any: the last one written."""
    found = [m for m in _ARITHMETIC.finditer(question) if _BINARY.search(m.group())]
    if not found:
        return None
    last = found[-1]
    alone = not question[: last.start()].strip() and not question[last.end() :].strip(" .=!")
    return last.group() if alone or _ASKED.search(question) else None


class OfflineDemoModel:
    """An offline stand-in for a real model: it recalls, calculates and sums up, nothing more."""

    model_name = "offline-demo"

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def chat(self, request: ChatRequest) -> ChatResponse:
        """Answer from the conversation alone, as a model would shape its answer."""
        messages = request.messages
        last = messages[-1] if messages else None
        said = [m.text for m in messages if isinstance(m, UserMessage)]
        if isinstance(last, ToolExecutionResultMessage):
            return ChatResponse(AiMessage(self._after_tool(messages, last)))
        if request.response_format is not None:
            return ChatResponse(AiMessage(self._profile(said[:-1]).model_dump_json()))
        question = said[-1] if said else ""
        arithmetic = _calculation(question)
        if arithmetic and any(t.name == "calculate" for t in request.tools):
            arguments = json.dumps({"expression": arithmetic})
            call = ToolExecutionRequest(f"call_{next(self._ids)}", "calculate", arguments)
            return ChatResponse(AiMessage(tool_execution_requests=[call]))
        return ChatResponse(AiMessage(self._recall(question, said[:-1])))

    @staticmethod
    def _after_tool(messages: Sequence[ChatMessage], result: ToolExecutionResultMessage) -> str:
        request = next(
            r
            for m in reversed(messages)
            if isinstance(m, AiMessage)
            for r in m.tool_execution_requests
            if r.id == result.id
        )
        expression = json.loads(request.arguments).get("expression", "")
        if result.is_error:
            return f"I could not work out {expression}: {result.text}"
        return f"{expression} = {result.text}"

    @staticmethod
    def _profile(earlier: list[str]) -> Profile:
        name = None
        for text in earlier:
            if found := _NAME.search(text):
                name = found.group(1)
        facts = [m.group().rstrip(".!") for t in earlier if (m := _FACT.search(t))]
        return Profile(name=name, facts=facts)

    @staticmethod
    def _recall(question: str, earlier: list[str]) -> str:
        if _QUESTION.search(question):
            facts = [f for f in earlier if _FACT.search(f)]
            if facts:
                return "You told me: " + "; ".join(f'"{f}"' for f in facts[-3:])
            if earlier:
                return f'I have no facts about you yet. Earlier you said: "{earlier[-1]}"'
            return "This is our first exchange: I know nothing about you yet."
        if _FACT.search(question):
            return "Noted, I will remember that."
        return (
            f"(offline model) I heard you. We have exchanged {len(earlier) + 1} message(s). "
            'Tell me your name, ask "what is 12 * 7?", or type /help.'
        )


# -- choosing the model -------------------------------------------------------------------


class _Unavailable(Exception):
    """The provider asked for cannot be used; the message says why and what to do."""


def _pick_model(provider: str, model: str | None) -> tuple[ChatModel, str, str | None]:
    """The model, its label, and a notice to show first (or ``None``)."""
    if model and ":" in model:
        # PROVIDER:MODEL only when it starts with a provider: a model's own name may hold a
        # colon (llama3.1:8b).
        prefix, _, name = model.partition(":")
        named = prefix.strip().lower()
        if named in _PROVIDERS:
            if provider not in ("auto", named):
                raise _Unavailable(
                    f"--provider {provider} and --model {model} name two providers; give one"
                )
            provider, model = named, name.strip()
    if provider == "auto":
        for name, (key, _) in _PROVIDERS.items():
            if os.environ.get(key):
                try:
                    return (*_provider_model(name, model), None)
                except _Unavailable as problem:
                    # The README's first command must run for everyone, key or no key.
                    return _offline(
                        f"{key} is set, but {problem}\nMeanwhile the offline model answers."
                    )
        keys = " or ".join(key for key, _ in _PROVIDERS.values())
        unused = f"--model {model} is not used: no {keys} is set." if model else None
        return _offline(unused, f" (no {keys} set)")
    if provider == "offline":
        return _offline(None)
    if provider not in _PROVIDERS:
        known = ", ".join(_PROVIDERS)
        raise _Unavailable(f"unknown provider {provider!r}; use {known} or offline.")
    return (*_provider_model(provider, model), None)


def _install_advice(extra: str) -> str:
    """How to install an extra: in a clone (an editable install), or from the index."""
    if (Path(__file__).resolve().parent.parent / "pyproject.toml").is_file():
        return f'In the clone, install it with\n    pip install -e ".[{extra}]"'
    return f'Install it with\n    pip install "aiservices[{extra}]"'


def _offline(notice: str | None, why: str = "") -> tuple[ChatModel, str, str | None]:
    return OfflineDemoModel(), f"OFFLINE demo model{why}", notice


def _provider_model(provider: str, model: str | None) -> tuple[ChatModel, str]:
    from .models._registry import resolve_model

    spec = f"{provider}:{model or _PROVIDERS[provider][1]}"
    try:
        return resolve_model(spec), spec
    except ModuleNotFoundError as exc:
        if exc.name != provider:
            raise
        raise _Unavailable(
            f"the {provider!r} package is not installed.\n{_install_advice(provider)}"
        ) from None
    except ValueError as exc:  # no key, a bad model name
        raise _Unavailable(str(exc)) from None


# -- the terminal ---------------------------------------------------------------------------


class _Screen:
    """Writes to the terminal, every line wrapped to fit it."""

    def __init__(self, out: TextIO, width: int) -> None:
        self.out = out
        self.width = width

    def say(self, text: str, *, first: str = "", rest: str | None = None) -> None:
        """Print ``text`` wrapped, ``first`` before its first line, ``rest`` before the others."""
        indent = " " * len(first) if rest is None else rest
        for number, paragraph in enumerate(text.splitlines() or [""]):
            lead = first if number == 0 else indent
            lines = textwrap.wrap(
                paragraph,
                self.width,
                initial_indent=lead,
                subsequent_indent=indent,
                break_on_hyphens=False,  # paths and names stay whole where they fit
            )
            print("\n".join(lines) or lead.rstrip(), file=self.out)
        self.out.flush()


def _describe(message: ChatMessage) -> tuple[str, str]:
    if isinstance(message, SystemMessage):
        return "system", message.text
    if isinstance(message, UserMessage):
        return "user", message.text
    if isinstance(message, ToolExecutionResultMessage):
        return "tool", f"{message.tool_name} -> {message.text}"
    asked = ", ".join(_call(r) for r in message.tool_execution_requests)
    if asked:
        return "ai", f"asks for {asked}" + (f"; {message.text}" if message.text else "")
    return "ai", message.text or ""


def _call(request: ToolExecutionRequest) -> str:
    """A tool request as a Python call: ``calculate(expression='12 * 7')``."""
    try:
        arguments = json.loads(request.arguments or "{}")
    except ValueError:
        return f"{request.name}({request.arguments})"
    if not isinstance(arguments, dict):
        return f"{request.name}({request.arguments})"
    return f"{request.name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


def _show_result(screen: _Screen, result: Result[str]) -> None:
    for execution in result.tool_executions:
        screen.say(f"{_call(execution.request)} -> {execution.result}", first="  [tool] ")
    screen.say(result.content, first="bot: ")


def _read_line(read: TextIO, screen: _Screen, prompt: str | None) -> str | None:
    """The next line typed, or ``None`` at the end of input."""
    if prompt is None:
        line = read.readline()
        return line if line else None
    try:
        return input(prompt)  # line editing and history, where readline is available
    except EOFError:
        print(file=screen.out)
        return None


def main(
    argv: Sequence[str] | None = None, *, stdin: TextIO | None = None, stdout: TextIO | None = None
) -> int:
    """Run the chatbot until ``/quit``, Ctrl-D or Ctrl-C; the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m aiservices.demo",
        description="A per-user chatbot in the terminal, its memory in SQLite.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--user", default="guest", help="who is talking (one memory each)")
    parser.add_argument("--db", default="aiservices-demo.db", help="SQLite file for memories")
    parser.add_argument(
        "--provider",
        choices=["auto", "offline", *_PROVIDERS],
        default="auto",
        help="auto (the default): the provider whose API key is set, else offline",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="the provider's model (gpt-4o, claude-sonnet-4-5, ...), or PROVIDER:MODEL",
    )
    args = parser.parse_args(argv)
    read = stdin or sys.stdin
    out = stdout or sys.stdout
    interactive = read is sys.stdin and out is sys.stdout and read.isatty() and out.isatty()
    width = min(_WIDTH, shutil.get_terminal_size((_WIDTH, 24)).columns) if interactive else _WIDTH
    screen = _Screen(out, width)
    try:
        return _run(args, read, screen, interactive)
    except KeyboardInterrupt:
        print(file=out)
        screen.say("bye")
        return 130


def _run(args: argparse.Namespace, read: TextIO, screen: _Screen, interactive: bool) -> int:
    """The conversation itself, until ``/quit`` or the end of input; the exit status."""
    folder = Path(args.db).parent
    if not folder.is_dir():
        screen.say(f"error: {args.db}: there is no folder {folder}; create it or pick another")
        return 2
    try:
        model, label, notice = _pick_model(args.provider, args.model)
    except _Unavailable as problem:
        screen.say(f"error: {problem}")
        return 2
    if interactive:
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401 - imported for its effect on input()

    import sqlite3

    from .stores.sqlite import SqliteChatMemoryStore

    try:
        store = SqliteChatMemoryStore(args.db)
    except (sqlite3.Error, OSError) as problem:
        screen.say(f"error: {problem}")  # (the store's message names the file and the fix)
        return 2
    bot = ai_service(
        _Chatbot,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20, store=store),
        tools=[calculate],
    )
    if notice:
        screen.say(f"note: {notice}")
    screen.say(f"aiservices demo: a chatbot that remembers each user, in {args.db}")
    screen.say(f"model: {label}")
    screen.say("/help lists the commands; /quit or Ctrl-D leaves.")
    user: str = args.user
    while True:
        line = _read_line(read, screen, f"{user}> " if interactive else None)
        if line is None:
            break
        text = line.strip()
        if not text:
            continue
        if text.startswith("/"):
            after = _command(text, bot, screen, user)
            if after is None:
                break
            user = after
            continue
        try:
            _show_result(screen, bot.chat(user, text))
        except Exception as error:  # a demo goes on after a failed call; nothing was kept
            screen.say(f"{type(error).__name__}: {error}", first="  (the call failed) ")
    if interactive:
        screen.say("bye")
    return 0


def _command(text: str, bot: _Chatbot, screen: _Screen, user: str) -> str | None:
    """Carry out a /command: the user talking after it, or ``None`` to leave."""
    command, _, argument = text.partition(" ")
    argument = argument.strip()
    if command in ("/quit", "/exit"):
        return None
    if command == "/help":
        screen.say(_HELP)
    elif command == "/history":
        messages = bot.get_chat_memory(user).messages()
        if not messages:
            screen.say(f"  (nothing yet: {user} has not said anything)")
        for message in messages:
            kind, shown = _describe(message)
            screen.say(shown, first=f"  [{kind}] ", rest="    ")
    elif command == "/profile":
        try:
            profile = bot.profile(user)
        except Exception as error:
            screen.say(f"{type(error).__name__}: {error}", first="  (the call failed) ")
            return user
        screen.say("  a Profile, parsed from the model's JSON answer:")
        screen.say(repr(profile.name), first="    name:  ")
        screen.say("; ".join(profile.facts) or "(none)", first="    facts: ")
    elif command == "/forget":
        bot.forget(user)
        screen.say(f"  (forgot everything about {user})")
    elif command == "/user":
        if not argument:
            screen.say("  usage: /user NAME")
            return user
        screen.say(f"  (now talking as {argument})")
        return argument
    else:
        screen.say(f"  unknown command {command}; /help lists the commands")
    return user


if __name__ == "__main__":
    raise SystemExit(main())

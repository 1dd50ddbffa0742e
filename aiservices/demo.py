"""A per-user chatbot in the terminal, with its memory in SQLite: ``python -m aiservices.demo``.

It uses OpenAI or Anthropic when ``OPENAI_API_KEY`` or ``ANTHROPIC_API_KEY`` is set (or
``--model openai:gpt-4o-mini``), and otherwise an offline model, labelled as such, that can
only recall what you told it earlier: enough to show memory at work across restarts.

Commands: ``/history``, ``/forget``, ``/user NAME``, ``/quit``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from typing import Annotated, Protocol, TextIO

from .markers import MemoryId
from .memory import MessageWindowChatMemory
from .messages import AiMessage, UserMessage
from .models import ChatModel, ChatRequest, ChatResponse
from .prompts import system_message
from .service import ChatMemoryAccess, ai_service

__all__ = ["OfflineRecallModel", "main"]

_FACT = re.compile(r"\b(?:my name is|i am|i'm|call me|i like|i love|i live in)\s+(.+)", re.I)
_QUESTION = re.compile(
    r"\b(what is my name|who am i|what do i (?:like|love)|where do i live|"
    r"what did i (?:say|tell you))\b",
    re.I,
)


class OfflineRecallModel:
    """An offline stand-in for a real model: it remembers what the user told it, nothing more."""

    model_name = "offline-recall"

    def chat(self, request: ChatRequest) -> ChatResponse:
        said = [m.text for m in request.messages if isinstance(m, UserMessage)]
        question = said[-1] if said else ""
        earlier = said[:-1]
        if _QUESTION.search(question):
            facts = [f for f in earlier if _FACT.search(f)]
            if facts:
                text = "You told me: " + "; ".join(f'"{f}"' for f in facts[-3:])
            elif earlier:
                text = f'I have no facts about you yet. Earlier you said: "{earlier[-1]}"'
            else:
                text = "This is our first exchange: I know nothing about you yet."
        elif _FACT.search(question):
            text = "Noted, I will remember that."
        else:
            text = (
                f"(offline model) I heard you. We have exchanged {len(said)} message(s); "
                "tell me your name, then ask me who you are."
            )
        return ChatResponse(AiMessage(text))


@system_message("You are a friendly assistant. Keep answers short.")
class _Chatbot(ChatMemoryAccess, Protocol):
    def chat(self, user: Annotated[str, MemoryId], message: str) -> str: ...


def _pick_model(choice: str | None) -> tuple[ChatModel | str, str]:
    if choice:
        return choice, choice
    if os.environ.get("OPENAI_API_KEY"):
        return "openai:gpt-4o-mini", "openai:gpt-4o-mini"
    if os.environ.get("ANTHROPIC_API_KEY"):
        return "anthropic:claude-3-5-haiku-latest", "anthropic:claude-3-5-haiku-latest"
    return OfflineRecallModel(), "OFFLINE demo model (set OPENAI_API_KEY or ANTHROPIC_API_KEY)"


def main(
    argv: Sequence[str] | None = None, *, stdin: TextIO | None = None, stdout: TextIO | None = None
) -> int:
    """Run the chatbot until ``/quit`` or the end of input."""
    parser = argparse.ArgumentParser(prog="python -m aiservices.demo", description=__doc__)
    parser.add_argument("--user", default="guest", help="who is talking (one memory each)")
    parser.add_argument("--db", default="aiservices-demo.db", help="SQLite file for memories")
    parser.add_argument("--model", default=None, help="openai:MODEL or anthropic:MODEL")
    args = parser.parse_args(argv)
    read = stdin or sys.stdin
    out = stdout or sys.stdout

    from .stores.sqlite import SqliteChatMemoryStore

    model, label = _pick_model(args.model)
    store = SqliteChatMemoryStore(args.db)
    bot = ai_service(
        _Chatbot,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20, store=store),
    )
    user = args.user
    print(f"aiservices demo: model = {label}; memory in {args.db}", file=out)
    print("commands: /history  /forget  /user NAME  /quit", file=out)
    interactive = read.isatty()
    while True:
        if interactive:
            print(f"{user}> ", end="", file=out, flush=True)
        line = read.readline()
        if not line:
            break
        text = line.strip()
        if not text:
            continue
        if text == "/quit":
            break
        if text == "/history":
            for message in bot.get_chat_memory(user).messages():
                kind = type(message).__name__.removesuffix("Message").lower() or "ai"
                print(f"  [{kind}] {message.text}", file=out)
            continue
        if text == "/forget":
            bot.forget(user)
            print(f"  (forgot everything about {user})", file=out)
            continue
        if text.startswith("/user"):
            name = text.removeprefix("/user").strip()
            if name:
                user = name
                print(f"  (now talking as {user})", file=out)
            else:
                print("  usage: /user NAME", file=out)
            continue
        print(f"bot: {bot.chat(user, text)}", file=out, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

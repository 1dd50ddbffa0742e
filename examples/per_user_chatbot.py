"""A chatbot with one conversation per user, kept in SQLite, surviving a restart.

Each user's id is the method's ``MemoryId`` parameter; ``MessageWindowChatMemory.provider``
gives every id its own window of the newest messages, all in one SQLite file.

Runs offline by default, on a scripted model whose replies only repeat what the request
shows it (enough to see whose memory it was given); set OPENAI_API_KEY (or
ANTHROPIC_API_KEY) to run it on a real provider: ``python examples/per_user_chatbot.py
[chat.db]`` (without a path, the file lives in a temporary directory).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Protocol

from aiservices import (
    ChatMemoryAccess,
    ChatModel,
    ChatRequest,
    MemoryId,
    MessageWindowChatMemory,
    SqliteChatMemoryStore,
    UserMessage,
    ai_service,
    system_message,
)
from aiservices.testing import ScriptedChatModel


@system_message("You are a friendly assistant. Answer in one or two sentences.")
class Chatbot(ChatMemoryAccess, Protocol):
    def chat(self, user: Annotated[str, MemoryId], message: str) -> str: ...


def recall(request: ChatRequest) -> str:
    """The offline stand-in: it answers with what the user said earlier in this request."""
    said = [m.text for m in request.messages if isinstance(m, UserMessage)]
    earlier = said[:-1]
    if not earlier:
        return "(offline model) Nice to meet you! Tell me about yourself."
    return "(offline model) You told me: " + " / ".join(earlier)


def pick_model() -> ChatModel | str:
    if os.environ.get("OPENAI_API_KEY"):
        return "openai:gpt-4o-mini"
    if os.environ.get("ANTHROPIC_API_KEY"):
        return "anthropic:claude-haiku-4-5"
    return ScriptedChatModel(default=recall)


def build(db: Path, model: ChatModel | str) -> tuple[Chatbot, SqliteChatMemoryStore]:
    store = SqliteChatMemoryStore(db)
    bot = ai_service(
        Chatbot,
        model=model,
        # Up to 6 messages per user, the system message included; whole turns are evicted,
        # so a window never starts with an answer whose question is gone.
        chat_memory_provider=MessageWindowChatMemory.provider(
            max_messages=6, store=store, evict_whole_turns=True
        ),
    )
    return bot, store


def say(bot: Chatbot, user: str, text: str) -> str:
    answer = bot.chat(user, text)
    print(f"{user:>5}: {text}\n  bot: {answer}")
    return answer


def main(db: Path) -> None:
    model = pick_model()
    bot, store = build(db, model)
    say(bot, "alice", "Hi, I am Alice and I love hiking.")
    say(bot, "bob", "Hello, I'm Bob. I collect stamps.")
    say(bot, "alice", "What do you know about me?")
    store.close()

    print("-- restart: a new service on the same file --")
    bot, store = build(db, model)
    say(bot, "bob", "Do you remember me?")
    for text in ("I live in Lyon.", "My favourite colour is green.", "Who am I?"):
        say(bot, "alice", text)

    window = bot.get_chat_memory("alice").messages()
    print(f"alice's window holds {len(window)} messages (the oldest turns were evicted):")
    for message in window:
        print(f"  [{type(message).__name__}] {message.text}")

    bot.forget("bob")
    print(f"after forget('bob'): {len(bot.get_chat_memory('bob').messages())} messages")
    store.close()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as folder:
            main(Path(folder) / "chat.db")

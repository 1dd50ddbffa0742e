"""What a scope costs: a call inside one, and a scope entered and left around one call.

Scenarios, on a service with a 20-message window on the in-memory store and a method
without a ``MemoryId`` parameter:

- ``default``: the call outside any scope (the ``"default"`` conversation);
- ``in-scope``: the same call inside a scope (made current as ``with`` does, not left);
- ``keep``: a scope entered and left (``on_exit="keep"``) around each call, on one id;
- ``forget``: the same with ``on_exit="forget"``: the exit erases the conversation, so
  each call also starts a new one (the provider makes its memory).

    python benchmarks/bench_scopes.py --rounds 11
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from aiservices import AiMessage, MessageWindowChatMemory, ai_service, memory_scope
from aiservices.models import ChatRequest, ChatResponse
from aiservices.scopes import _current


class Instant:
    response = ChatResponse(AiMessage("Hello!"))

    def chat(self, request: ChatRequest) -> ChatResponse:
        return self.response


class Chat(Protocol):
    def chat(self, message: str) -> str: ...


def scenarios(contender: str) -> dict[str, Callable[[int], Any]]:
    def service() -> Chat:
        return ai_service(
            Chat,
            model=Instant(),
            chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
        )

    plain, scoped, keeping, forgetting = service(), service(), service(), service()
    outer = memory_scope("outer", on_exit="keep")

    def default(i: int) -> Any:
        return plain.chat("Hi there")

    def in_scope(i: int) -> Any:
        # The scope made current as `with` does, without its exit: a call inside one.
        token = _current.set(outer)
        try:
            return scoped.chat("Hi there")
        finally:
            _current.reset(token)

    def keep(i: int) -> Any:
        with memory_scope("same", on_exit="keep"):
            return keeping.chat("Hi there")

    def forget(i: int) -> Any:
        with memory_scope("same"):
            return forgetting.chat("Hi there")

    return {
        "default": default,
        "in-scope": in_scope,
        "keep": keep,
        "forget": forget,
    }


if __name__ == "__main__":
    from _interleave import main

    main(__file__, scenarios, names=("default", "in-scope", "keep", "forget"), default_n=5000)

"""A scope that forgets erases a conversation's history too, on every store that keeps one."""

from __future__ import annotations

import asyncio
from typing import Protocol

from aiservices import MessageWindowChatMemory, ai_service, memory_scope
from aiservices.testing import ScriptedChatModel

from .conftest import OpenedBackend


class Bot(Protocol):
    def chat(self, text: str) -> str: ...


class AsyncBot(Protocol):
    async def chat(self, text: str) -> str: ...


def test_leaving_a_forgetting_scope_erases_window_and_history(
    history_backend: OpenedBackend,
) -> None:
    store = history_backend.open(keep_history=True)
    bot = ai_service(
        Bot,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=2, store=store),
    )
    with memory_scope("request-1"):
        for turn in range(3):
            bot.chat(f"turn {turn}")
        assert len(store.get_history("request-1")) == 6  # four of them evicted
    with memory_scope("request-2", on_exit="keep"):
        bot.chat("kept")
    fresh = history_backend.open(keep_history=True)  # a new client on the same data
    assert fresh.get_history("request-1") == []
    assert fresh.get_messages("request-1") == []
    assert list(fresh.memory_ids()) == ["request-2"]


def test_an_async_scope_erases_the_same(history_backend: OpenedBackend) -> None:
    store = history_backend.open(keep_history=True)
    bot = ai_service(
        AsyncBot,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=2, store=store),
    )

    async def main() -> None:
        async with memory_scope("request-3"):
            for turn in range(3):
                await bot.chat(f"turn {turn}")
        # A store's async connections belong to this loop: close them before it ends.
        aclose = getattr(store, "aclose", None)
        if aclose is not None:
            await aclose()

    asyncio.run(main())
    fresh = history_backend.open(keep_history=True)
    assert fresh.get_history("request-3") == []
    assert list(fresh.memory_ids()) == []

"""Atomic turns and per-conversation serialisation, for threads and for asyncio tasks."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Collection, Hashable, Sequence
from typing import Annotated, Protocol

import pytest

from aiservices import (
    AiMessage,
    ChatMemoryAccess,
    ChatMessage,
    InMemoryChatMemoryStore,
    MemoryId,
    MessageWindowChatMemory,
    UserMessage,
    ai_service,
)
from aiservices.models import ChatRequest
from aiservices.testing import ScriptedChatModel, tool_call
from aiservices.tools import tool


class Bot(ChatMemoryAccess, Protocol):
    def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...


class ABot(ChatMemoryAccess, Protocol):
    async def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...


def echo(request: ChatRequest) -> str:
    return f"echo:{request.messages[-1].text}"


def test_threads_on_one_memory_id_lose_nothing_and_answers_follow_questions() -> None:
    store = InMemoryChatMemoryStore()
    bot = ai_service(
        Bot,
        model=ScriptedChatModel(default=echo),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=1000, store=store),
    )

    def worker(t: int) -> None:
        for i in range(25):
            bot.chat("shared", f"{t}-{i}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    messages = store.get_messages("shared")
    assert len(messages) == 400
    for question, answer in zip(messages[::2], messages[1::2], strict=True):
        assert isinstance(question, UserMessage)
        assert answer == AiMessage(f"echo:{question.text}")
    for t in range(8):
        mine = [m.text for m in messages[::2] if m.text.startswith(f"{t}-")]
        assert mine == [f"{t}-{i}" for i in range(25)]


async def test_tasks_on_one_memory_id_are_serialised() -> None:
    active = 0
    overlap = False

    class Model:
        async def achat(self, request: ChatRequest):  # type: ignore[no-untyped-def]
            nonlocal active, overlap
            active += 1
            overlap = overlap or active > 1
            await asyncio.sleep(0.001)
            active -= 1
            return ScriptedChatModel(default=echo).chat(request)

        def chat(self, request: ChatRequest):  # type: ignore[no-untyped-def]
            raise AssertionError("async calls use achat")

    bot = ai_service(
        ABot, model=Model(), chat_memory_provider=MessageWindowChatMemory.provider(max_messages=500)
    )
    await asyncio.gather(*(bot.chat("one", f"m{i}") for i in range(50)))
    assert not overlap
    assert len(bot.get_chat_memory("one").messages()) == 100


async def test_distinct_ids_run_in_parallel_with_little_overhead() -> None:
    model = ScriptedChatModel(default=echo, delay=0.05)
    bot = ai_service(
        ABot, model=model, chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10)
    )
    started = time.perf_counter()
    answers = await asyncio.gather(*(bot.chat(f"user{i}", f"q{i}") for i in range(200)))
    elapsed = time.perf_counter() - started
    assert answers[7] == "echo:q7"
    # 200 calls of 50 ms each, in parallel: far below the 10 s they would take in series.
    assert elapsed < 1.0


class Mixed(ChatMemoryAccess, Protocol):
    def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    async def achat(self, user: Annotated[str, MemoryId], text: str) -> str: ...


async def test_sync_and_async_calls_on_one_id_share_the_lock() -> None:
    store = InMemoryChatMemoryStore()
    mixed = ai_service(
        Mixed,
        model=ScriptedChatModel(default=echo, delay=0.002),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=1000, store=store),
    )
    thread = threading.Thread(target=lambda: [mixed.chat("x", f"s{i}") for i in range(20)])
    thread.start()
    await asyncio.gather(*(mixed.achat("x", f"a{i}") for i in range(20)))
    await asyncio.to_thread(thread.join)
    messages = store.get_messages("x")
    assert len(messages) == 80
    for question, answer in zip(messages[::2], messages[1::2], strict=True):
        assert answer.text == f"echo:{question.text}"


class CountingStore(InMemoryChatMemoryStore):
    """Counts reads and writes of the store protocol."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.writes = 0

    def get_messages(self, memory_id: Hashable) -> list[ChatMessage]:
        self.reads += 1
        return super().get_messages(memory_id)

    def update_messages(self, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
        self.writes += 1
        super().update_messages(memory_id, messages)

    def apply_changes(
        self, memory_id: Hashable, *, appended: Sequence[ChatMessage], removed: Collection[str]
    ) -> None:
        self.writes += 1
        super().apply_changes(memory_id, appended=appended, removed=removed)


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order} shipped"


def test_store_traffic_is_one_read_and_one_write_per_turn_even_with_tools() -> None:
    store = CountingStore()
    model = ScriptedChatModel(
        tool_call("lookup", order="1"),
        tool_call("lookup", order="2"),
        "both shipped",
        default="plain",
    )
    bot = ai_service(
        Bot,
        model=model,
        tools=[lookup],
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=4, store=store),
    )
    bot.chat("u", "where are my orders?")
    assert (store.reads, store.writes) == (1, 1)
    for turn in range(5):
        bot.chat("u", f"again {turn}")
        assert store.reads <= 2 + turn
        assert store.writes == 2 + turn


def test_a_failed_turn_writes_nothing_and_leaves_memory_as_it_was() -> None:
    store = CountingStore()
    model = ScriptedChatModel(
        "first", tool_call("lookup", order="9"), RuntimeError("provider down")
    )
    bot = ai_service(
        Bot,
        model=model,
        tools=[lookup],
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10, store=store),
    )
    bot.chat("u", "hello")
    before = [m.model_dump() for m in store.get_messages("u")]
    memory_before = [m.model_dump() for m in bot.get_chat_memory("u").messages()]
    writes = store.writes
    with pytest.raises(RuntimeError, match="provider down"):
        bot.chat("u", "this turn fails after a tool round")
    assert store.writes == writes
    assert [m.model_dump() for m in store.get_messages("u")] == before
    assert [m.model_dump() for m in bot.get_chat_memory("u").messages()] == memory_before


async def test_a_failed_async_turn_leaves_memory_as_it_was() -> None:
    model = ScriptedChatModel("first", ValueError("boom"))
    bot = ai_service(
        ABot, model=model, chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10)
    )
    await bot.chat("u", "hello")
    with pytest.raises(ValueError, match="boom"):
        await bot.chat("u", "fails")
    assert [m.text for m in bot.get_chat_memory("u").messages()] == ["hello", "first"]

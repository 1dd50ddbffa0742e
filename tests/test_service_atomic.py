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
from aiservices.models import ChatRequest, TokenUsage
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


def test_a_cache_of_one_evicting_all_the_time_still_serialises_each_id() -> None:
    # Two ids and room for one: nearly every call evicts the other id's conversation, so
    # callers keep finding the conversation they looked up retired by the time they hold it.
    store = InMemoryChatMemoryStore()
    active: dict[str, int] = {"a": 0, "b": 0}
    overlaps: list[str] = []
    guard = threading.Lock()

    def answer(request: ChatRequest) -> str:
        text = request.messages[-1].text
        key = text[0]
        with guard:
            active[key] += 1
            if active[key] > 1:
                overlaps.append(text)
        time.sleep(0.0005)
        with guard:
            active[key] -= 1
        return f"echo:{text}"

    bot = ai_service(
        Bot,
        model=ScriptedChatModel(default=answer),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=1000, store=store),
        chat_memory_cache_size=1,
    )

    def worker(t: int) -> None:
        for i in range(20):
            key = "ab"[(t + i) % 2]
            bot.chat(key, f"{key}{t}-{i}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == []
    for key in "ab":
        messages = store.get_messages(key)
        assert len(messages) == 120
        for question, reply in zip(messages[::2], messages[1::2], strict=True):
            assert question.text.startswith(key)
            assert reply == AiMessage(f"echo:{question.text}")


class Recording:
    """A chat memory that counts the adds made through it."""

    def __init__(self, inner: MessageWindowChatMemory) -> None:
        self.inner = inner
        self.adds = 0

    @property
    def id(self) -> Hashable:
        return self.inner.id

    def messages(self) -> list[ChatMessage]:
        return self.inner.messages()

    def add(self, *messages: ChatMessage) -> None:
        self.adds += 1
        self.inner.add(*messages)

    def clear(self) -> None:
        self.inner.clear()


def test_a_call_whose_conversation_is_evicted_before_it_holds_it_takes_the_new_one() -> None:
    # The system message provider runs between a call's lookup of its conversation and
    # taking its lock: evicting there retires the conversation the call already has.
    made: list[Recording] = []
    base = MessageWindowChatMemory.provider(max_messages=100)

    def provider(memory_id: Hashable) -> Recording:
        memory = Recording(base(memory_id))
        made.append(memory)
        return memory

    evictions = 0

    def system(memory_id: object) -> str | None:
        nonlocal evictions
        if evictions < 2:
            evictions += 1
            bot.evict_chat_memory(memory_id)
        return None

    bot = ai_service(
        Bot,
        model=ScriptedChatModel(default=echo),
        chat_memory_provider=provider,  # type: ignore[arg-type]
        system_message_provider=system,
    )
    bot.get_chat_memory("a")  # cached, so that the first call finds it before it holds it
    assert bot.chat("a", "one") == "echo:one"
    assert bot.chat("a", "two") == "echo:two"
    assert evictions == 2
    # Each call ran on the conversation that replaced the retired one, never on the latter.
    assert [memory.adds for memory in made] == [0, 1, 1]
    assert bot.get_chat_memory("a") is made[-1]
    assert [m.text for m in made[-1].messages()] == ["one", "echo:one", "two", "echo:two"]


async def test_an_async_call_follows_a_retired_conversation_too() -> None:
    made: list[Recording] = []
    base = MessageWindowChatMemory.provider(max_messages=100)

    def provider(memory_id: Hashable) -> Recording:
        made.append(Recording(base(memory_id)))
        return made[-1]

    def system(memory_id: object) -> str | None:
        if len(made) == 1:
            bot.evict_chat_memory(memory_id)
        return None

    bot = ai_service(
        ABot,
        model=ScriptedChatModel(default=echo),
        chat_memory_provider=provider,  # type: ignore[arg-type]
        system_message_provider=system,
    )
    await bot.aget_chat_memory("a")  # cached, so that the call finds it before it holds it
    assert await bot.chat("a", "one") == "echo:one"
    assert [memory.adds for memory in made] == [0, 1]


def test_a_conversation_in_use_is_not_evicted() -> None:
    entered = threading.Event()
    go_on = threading.Event()

    def slow(request: ChatRequest) -> str:
        if request.messages[-1].text == "wait":
            entered.set()
            assert go_on.wait(5)
        return "ok"

    bot = ai_service(
        Bot,
        model=ScriptedChatModel(default=slow),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=100),
        chat_memory_cache_size=1,
    )
    bot.chat("a", "first")
    memory = bot.get_chat_memory("a")
    running = threading.Thread(target=bot.chat, args=("a", "wait"))
    running.start()
    assert entered.wait(5)
    bot.chat("b", "hello")  # over the cache's size, but "a" is mid-turn: "b" alone can go
    bot.evict_chat_memory("a")  # a no-op while the turn runs
    go_on.set()
    running.join()
    assert bot.get_chat_memory("a") is memory
    assert [m.text for m in memory.messages()] == ["first", "ok", "wait", "ok"]


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


def test_an_async_call_waits_for_a_thread_reading_its_memory_with_a_task_queued() -> None:
    # A store that does no I/O is used directly by async calls. A thread holds the memory (a
    # sync read, held up here), and a task of the call's loop waits for it too: the call
    # waits for the thread, instead of failing as a blocking call behind its loop's task.
    reading = threading.Event()
    go_on = threading.Event()

    class HeldUp(InMemoryChatMemoryStore):
        __slots__ = ()

        def get_messages_since(
            self, memory_id: Hashable, since: object = None
        ) -> tuple[list[ChatMessage], object]:
            if threading.current_thread().name == "reader":
                reading.set()
                go_on.wait(5)
            return super().get_messages_since(memory_id, since)

    class Bot(ChatMemoryAccess, Protocol):
        async def achat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    bot = ai_service(
        Bot,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(20, store=HeldUp()),
    )

    async def scenario() -> tuple[str, int, int]:
        memory = await bot.aget_chat_memory("alice")
        reader = threading.Thread(target=memory.messages, name="reader", daemon=True)
        reader.start()
        assert await asyncio.to_thread(reading.wait, 5)
        queued = asyncio.ensure_future(memory.amessages())
        await asyncio.sleep(0.01)  # the task waits for the memory behind the thread
        threading.Timer(0.05, go_on.set).start()
        answer = await bot.achat("alice", "hi")
        seen = await asyncio.wait_for(queued, 5)
        reader.join(5)
        return answer, len(seen), len(memory.messages())

    answer, seen, stored = asyncio.run(scenario())
    assert answer == "ok"
    assert seen in (0, 2)  # the task read before or after the call's turn
    assert stored == 2


class ObservingMemory:
    """A memory of one's own whose usage observation fails."""

    def __init__(self, memory_id: object) -> None:
        self.id = memory_id
        self.kept: list[ChatMessage] = []

    def messages(self) -> list[ChatMessage]:
        return list(self.kept)

    def add(self, *messages: ChatMessage) -> None:
        self.kept += messages

    def clear(self) -> None:
        self.kept = []

    def set(self, messages: Sequence[ChatMessage]) -> None:
        self.kept = list(messages)

    def observe_usage(self, messages: object, usage: object, request: object = None) -> None:
        raise RuntimeError("the estimator is gone")


@pytest.mark.parametrize("how", ["sync", "async"])
def test_an_observation_that_fails_after_the_commit_does_not_fail_the_recorded_turn(
    how: str, caplog: pytest.LogCaptureFixture
) -> None:
    memory = ObservingMemory("alice")
    model = ScriptedChatModel(default="Hello!", usage=TokenUsage(10, 2))
    if how == "sync":
        bot = ai_service(Bot, model=model, chat_memory_provider=lambda memory_id: memory)
        answer = bot.chat("alice", "hi")
    else:
        abot = ai_service(ABot, model=model, chat_memory_provider=lambda memory_id: memory)
        answer = asyncio.run(abot.chat("alice", "hi"))
    assert answer == "Hello!"
    assert [m.text for m in memory.kept] == ["hi", "Hello!"]
    assert "ObservingMemory.observe_usage raised" in caplog.text
    assert "the estimator is gone" in caplog.text

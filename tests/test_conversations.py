"""A service's conversations: made once per id, keyed as the stores key them, and a turn's
write seen through to its end even when its caller is cancelled."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Collection, Hashable, Sequence
from pathlib import Path
from typing import Annotated, Any, Protocol

import pytest

from aiservices import (
    AiMessage,
    ChatMemory,
    ChatMemoryAccess,
    ChatMessage,
    InMemoryChatMemoryStore,
    MemoryId,
    MessageWindowChatMemory,
    SqliteChatMemoryStore,
    UserMessage,
    ai_service,
)
from aiservices.models import ChatRequest, ChatResponse
from aiservices.testing import ScriptedChatModel


class Bot(ChatMemoryAccess, Protocol):
    def chat(self, user: Annotated[Hashable, MemoryId], text: str) -> str: ...


class AsyncBot(ChatMemoryAccess, Protocol):
    async def chat(self, user: Annotated[Hashable, MemoryId], text: str) -> str: ...


def test_concurrent_first_calls_on_a_new_id_call_the_provider_once() -> None:
    made: list[Hashable] = []
    store = InMemoryChatMemoryStore()

    def provider(memory_id: Hashable) -> ChatMemory:
        made.append(memory_id)
        time.sleep(0.05)  # a provider slow enough for every thread to miss the cache
        return MessageWindowChatMemory(100, id=memory_id, store=store)

    bot = ai_service(Bot, model=ScriptedChatModel(default="ok"), chat_memory_provider=provider)
    start = threading.Barrier(8)

    def call(i: int) -> None:
        start.wait()
        bot.chat("new", f"message {i}")

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert made == ["new"]
    # Every turn went to the one memory: none was lost to a second memory object.
    assert len(bot.get_chat_memory("new").messages()) == 16
    assert len(store.get_messages("new")) == 16


async def test_async_calls_make_memories_without_blocking_the_event_loop() -> None:
    # A provider may do I/O (open a store, read a profile): async calls run it in a thread,
    # once per id however many calls wait for it.
    made: list[Hashable] = []

    def slow_provider(memory_id: Hashable) -> ChatMemory:
        time.sleep(0.5)
        made.append(memory_id)
        return MessageWindowChatMemory(10, id=memory_id)

    bot = ai_service(
        AsyncBot, model=ScriptedChatModel(default="ok"), chat_memory_provider=slow_provider
    )
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.perf_counter()
        for _ in range(60):
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticking = asyncio.create_task(ticker())
    answers = await asyncio.gather(*(bot.chat("new", f"hi {i}") for i in range(3)))
    await ticking
    assert answers == ["ok"] * 3
    assert made == ["new"]
    assert max(gaps) < 0.3, f"the event loop stalled {max(gaps):.2f} s"
    assert len(bot.get_chat_memory("new").messages()) == 6


def test_a_provider_that_fails_lets_the_next_call_try_again() -> None:
    calls = 0

    def provider(memory_id: Hashable) -> ChatMemory:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("store down")
        return MessageWindowChatMemory(10, id=memory_id)

    bot = ai_service(Bot, model=ScriptedChatModel(default="ok"), chat_memory_provider=provider)
    with pytest.raises(ConnectionError):
        bot.chat("alice", "hi")
    assert bot.chat("alice", "hi again") == "ok"
    assert calls == 2


def test_a_provider_that_returns_no_memory_is_a_type_error_before_the_model() -> None:
    model = ScriptedChatModel(default="never")
    bot = ai_service(Bot, model=model, chat_memory_provider=lambda memory_id: [])  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match=r"returned list for the memory id 'alice'"):
        bot.chat("alice", "hi")
    assert model.requests == []


def test_a_stored_memory_made_without_its_id_is_refused_before_users_share_it() -> None:
    store = InMemoryChatMemoryStore()
    model = ScriptedChatModel(default="ok")
    bot = ai_service(
        Bot,
        model=model,
        chat_memory_provider=lambda memory_id: MessageWindowChatMemory(20, store=store),
    )
    with pytest.raises(TypeError, match=r"default id 'default' for the memory id 'alice'"):
        bot.chat("alice", "My card ends in 4242")
    assert model.requests == []
    assert list(store.memory_ids()) == []
    # Made for the default id (a method without MemoryId), it is the right memory.
    shared = ai_service(
        Bot,
        model=model,
        chat_memory_provider=lambda memory_id: MessageWindowChatMemory(20, store=store),
    )
    assert shared.chat("default", "hi") == "ok"


def test_memories_made_without_their_id_each_with_a_store_of_its_own_keep_apart() -> None:
    # `lambda memory_id: MessageWindowChatMemory(20)`: each memory has its own store, so
    # nothing is shared although each keeps the default id.
    model = ScriptedChatModel(default="ok")
    bot = ai_service(
        Bot, model=model, chat_memory_provider=lambda memory_id: MessageWindowChatMemory(20)
    )
    bot.chat("alice", "My card ends in 4242")
    bot.chat("bob", "hi")
    assert [m.text for m in model.requests[-1].messages] == ["hi"]


def test_a_provider_that_returns_none_is_a_type_error_naming_the_id_before_the_model() -> None:
    model = ScriptedChatModel(default="never")
    bot = ai_service(Bot, model=model, chat_memory_provider=lambda memory_id: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match=r"returned None for the memory id 'alice'"):
        bot.chat("alice", "hi")
    assert model.requests == []
    with pytest.raises(TypeError, match="returned None"):
        asyncio.run(
            ai_service(
                AsyncBot,
                model=model,
                chat_memory_provider=lambda memory_id: None,  # type: ignore[arg-type,return-value]
            ).chat("alice", "hi")
        )
    assert model.requests == []


def test_ids_that_compare_equal_are_different_conversations_as_in_the_stores() -> None:
    store = InMemoryChatMemoryStore()
    made: list[Hashable] = []

    def provider(memory_id: Hashable) -> ChatMemory:
        made.append(memory_id)
        return MessageWindowChatMemory(10, id=memory_id, store=store)

    bot = ai_service(Bot, model=ScriptedChatModel(default="ok"), chat_memory_provider=provider)
    ids: list[Hashable] = [1, True, 1.0, "1"]
    for memory_id in ids:
        bot.chat(memory_id, f"I am {memory_id!r} of {type(memory_id).__name__}")
    assert [(type(i), i) for i in made] == [(type(i), i) for i in ids]
    for memory_id in ids:
        texts = [m.text for m in bot.get_chat_memory(memory_id).messages()]
        assert texts == [f"I am {memory_id!r} of {type(memory_id).__name__}", "ok"]
        assert bot.get_chat_memory(memory_id).id is memory_id
        assert [m.text for m in store.get_messages(memory_id)] == texts
    bot.forget(True)
    assert bot.get_chat_memory(True).messages() == []
    assert len(bot.get_chat_memory(1).messages()) == 2


def test_an_unhashable_memory_id_is_a_type_error_naming_the_parameter() -> None:
    bot = ai_service(
        Bot,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10),
    )
    with pytest.raises(TypeError, match=r"Bot.chat\(user\): the memory id \['a'\] is unhashable"):
        bot.chat(["a"], "hi")


# -- a cancelled caller and a write in flight -----------------------------------------


class SlowSqliteStore(SqliteChatMemoryStore):
    """A SQLite store whose writes wait, in the worker thread, until they are let through."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.writing = threading.Event()
        self.go_on = threading.Event()

    def apply_changes(
        self, memory_id: Hashable, *, appended: Sequence[ChatMessage], removed: Collection[str]
    ) -> None:
        self.writing.set()
        assert self.go_on.wait(10)
        super().apply_changes(memory_id, appended=appended, removed=removed)

    def update_messages(self, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
        self.writing.set()
        assert self.go_on.wait(10)
        super().update_messages(memory_id, messages)


async def _cancel_while_writing(bot: AsyncBot, writing: Any, go_on: Any) -> tuple[Any, str]:
    """Cancel a call once its write has begun, then let the write finish; the call's outcome
    and the answer of a second call on the same id, queued behind the first."""
    first = asyncio.ensure_future(bot.chat("alice", "remember 42"))
    # `writing` may be a thread's event, set in a worker thread: poll it.
    while not writing.is_set():  # noqa: ASYNC110
        await asyncio.sleep(0.001)
    second = asyncio.ensure_future(bot.chat("alice", "what did I say?"))
    await asyncio.sleep(0.01)
    first.cancel()
    await asyncio.sleep(0.05)
    # The lock is still held: the second call has not read the memory yet.
    assert not second.done()
    go_on.set()
    try:
        outcome: Any = await first
    except asyncio.CancelledError:
        outcome = "cancelled"
    return outcome, await second


def test_a_call_cancelled_while_sqlite_writes_its_turn_reports_what_the_store_has(
    tmp_path: Path,
) -> None:
    store = SlowSqliteStore(tmp_path / "chat.db")
    model = ScriptedChatModel("Noted: 42.", "You said 42.")
    bot = ai_service(
        AsyncBot,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10, store=store),
    )
    outcome, second = asyncio.run(_cancel_while_writing(bot, store.writing, store.go_on))
    stored = [m.text for m in SqliteChatMemoryStore(tmp_path / "chat.db").get_messages("alice")]
    # The turn landed, so the call says so: no CancelledError for a turn that is stored.
    assert outcome == "Noted: 42."
    assert stored[:2] == ["remember 42", "Noted: 42."]
    # The second call ran after the write: it saw the first turn.
    assert second == "You said 42."
    assert model.requests[1].messages[:2] == [
        UserMessage("remember 42"),
        model.requests[1].messages[1],
    ]
    assert model.requests[1].messages[1].text == "Noted: 42."
    store.close()


class SlowPlainStore:
    """A store of the three methods alone (an async memory runs them in a worker thread),
    whose writes wait until they are let through."""

    def __init__(self) -> None:
        self.inner = InMemoryChatMemoryStore()
        self.writing = threading.Event()
        self.go_on = threading.Event()

    def get_messages(self, memory_id: Hashable) -> list[ChatMessage]:
        return self.inner.get_messages(memory_id)

    def update_messages(self, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
        self.writing.set()
        assert self.go_on.wait(10)
        self.inner.update_messages(memory_id, messages)

    def delete_messages(self, memory_id: Hashable) -> None:
        self.inner.delete_messages(memory_id)


class SlowListMemory:
    """A ChatMemory of the five members alone (an async call runs them in a worker thread),
    whose adds wait until they are let through."""

    def __init__(self, memory_id: Hashable) -> None:
        self.id = memory_id
        self.kept: list[ChatMessage] = []
        self.writing = threading.Event()
        self.go_on = threading.Event()

    def messages(self) -> list[ChatMessage]:
        return list(self.kept)

    def add(self, *messages: ChatMessage) -> None:
        self.writing.set()
        assert self.go_on.wait(10)
        self.kept += messages

    def clear(self) -> None:
        self.kept = []

    def set(self, messages: Any) -> None:
        self.kept = list(messages)


class Ends:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_call_end(self, call: Any, result: Any) -> None:
        self.seen.append("end")

    def on_error(self, call: Any, error: BaseException) -> None:
        self.seen.append(type(error).__name__)


@pytest.mark.parametrize("where", ["sqlite", "plain store", "plain memory"])
def test_a_turn_written_while_the_loop_cancels_every_task_is_reported_as_written(
    tmp_path: Path, where: str
) -> None:
    # asyncio.run() cancels every task left when its main returns, the write's own too; the
    # write in a worker thread lands regardless, so the call must say it did.
    memory: Any = None
    if where == "sqlite":
        store: Any = SlowSqliteStore(tmp_path / "chat.db")
    elif where == "plain store":
        store = SlowPlainStore()
    else:
        store = memory = SlowListMemory("alice")
    provider: Any = (
        (lambda memory_id: memory)
        if memory is not None
        else MessageWindowChatMemory.provider(max_messages=10, store=store)
    )
    ends = Ends()
    bot = ai_service(
        AsyncBot,
        model=ScriptedChatModel("Noted: 42."),
        chat_memory_provider=provider,
        listeners=[ends],
    )
    outcome: list[Any] = []

    async def call() -> None:
        try:
            outcome.append(await bot.chat("alice", "remember 42"))
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise

    async def main() -> None:
        outcome.append(asyncio.ensure_future(call()))
        while not store.writing.is_set():  # noqa: ASYNC110 - set in a worker thread
            await asyncio.sleep(0.001)
        threading.Timer(0.1, store.go_on.set).start()

    asyncio.run(main())
    if where == "plain memory":
        stored = [m.text for m in store.kept]
    elif where == "sqlite":
        stored = [m.text for m in SqliteChatMemoryStore(tmp_path / "chat.db").get_messages("alice")]
    else:
        stored = [m.text for m in store.get_messages("alice")]
    assert stored == ["remember 42", "Noted: 42."]
    assert outcome[1:] == ["Noted: 42."]
    assert ends.seen == ["end"]


class NativeAsyncStore(InMemoryChatMemoryStore):
    """A store with native async methods whose writes wait on an asyncio event."""

    is_blocking = True

    def __init__(self) -> None:
        super().__init__()
        self.writing = asyncio.Event()
        self.go_on = asyncio.Event()

    async def aget_messages(self, memory_id: Hashable) -> list[ChatMessage]:
        return self.get_messages(memory_id)

    async def aupdate_messages(self, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
        self.writing.set()
        await self.go_on.wait()
        self.update_messages(memory_id, messages)

    async def adelete_messages(self, memory_id: Hashable) -> None:
        self.delete_messages(memory_id)

    async def aapply_changes(
        self, memory_id: Hashable, *, appended: Sequence[ChatMessage], removed: Collection[str]
    ) -> None:
        self.writing.set()
        await self.go_on.wait()
        self.apply_changes(memory_id, appended=appended, removed=removed)


def test_a_call_cancelled_while_an_async_store_writes_waits_for_the_write() -> None:
    async def main() -> tuple[Any, str, list[str | None]]:
        store = NativeAsyncStore()
        bot = ai_service(
            AsyncBot,
            model=ScriptedChatModel("Noted: 42.", "You said 42."),
            chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10, store=store),
        )
        outcome, second = await _cancel_while_writing(bot, store.writing, store.go_on)
        return outcome, second, [m.text for m in store.get_messages("alice")]

    outcome, second, stored = asyncio.run(main())
    assert outcome == "Noted: 42."
    assert stored == ["remember 42", "Noted: 42.", "what did I say?", "You said 42."]
    assert second == "You said 42."


def test_a_cancellation_absorbed_by_the_write_leaves_the_task_not_cancelling() -> None:
    # The call returns normally, so the cancellation it absorbed is taken back: an
    # asyncio.timeout around it that expires later raises TimeoutError, not CancelledError.
    async def main() -> list[Any]:
        store = NativeAsyncStore()
        bot = ai_service(
            AsyncBot,
            model=ScriptedChatModel("Noted."),
            chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10, store=store),
        )
        seen: list[Any] = []

        async def worker() -> None:
            try:
                async with asyncio.timeout(0.5):
                    seen.append(await bot.chat("alice", "hi"))
                    current = asyncio.current_task()
                    assert current is not None
                    seen.append(current.cancelling())
                    await asyncio.sleep(5)  # overruns the deadline
            except TimeoutError:
                seen.append("TimeoutError")

        task = asyncio.ensure_future(worker())
        await store.writing.wait()
        task.cancel()  # lands while the turn is being written
        await asyncio.sleep(0.01)
        store.go_on.set()
        try:
            await task
        except asyncio.CancelledError:
            seen.append("CancelledError")
        return seen

    assert asyncio.run(main()) == ["Noted.", 0, "TimeoutError"]


def test_a_call_cancelled_before_its_write_records_nothing() -> None:
    class SlowModel:
        def __init__(self) -> None:
            self.asked = asyncio.Event()

        def chat(self, request: Any) -> Any:
            raise AssertionError("async calls use achat")

        async def achat(self, request: Any) -> Any:
            self.asked.set()
            await asyncio.sleep(10)

    async def main() -> list[ChatMessage]:
        model = SlowModel()
        bot = ai_service(
            AsyncBot,
            model=model,
            chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10),
        )
        call = asyncio.ensure_future(bot.chat("alice", "hi"))
        await model.asked.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        return bot.get_chat_memory("alice").messages()

    assert asyncio.run(main()) == []


@pytest.mark.parametrize("seed", [0, 1])
def test_calls_cancelled_at_random_moments_on_sqlite_report_what_the_store_holds(
    tmp_path: Path, seed: int
) -> None:
    # 40 conversations x 10 turns at once, a third of the calls cancelled at a random moment
    # (waiting for the lock, reading, asking the model, writing): every turn is stored whole
    # or not at all, and a call returns its answer exactly when its turn is stored.
    rng = random.Random(seed)

    class Model:
        def chat(self, request: ChatRequest) -> ChatResponse:
            raise AssertionError("async calls use achat")

        async def achat(self, request: ChatRequest) -> ChatResponse:
            await asyncio.sleep(rng.random() * 0.002)
            return ChatResponse(AiMessage("re: " + (request.messages[-1].text or "")))

    class SlowWrites(SqliteChatMemoryStore):
        # Writes long enough for a good share of the cancellations to land during one.
        def apply_changes(
            self,
            memory_id: Hashable,
            *,
            appended: Sequence[ChatMessage],
            removed: Collection[str],
        ) -> None:
            time.sleep(0.001)
            super().apply_changes(memory_id, appended=appended, removed=removed)

    store = SlowWrites(tmp_path / "chat.db")
    bot = ai_service(
        AsyncBot,
        model=Model(),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=1000, store=store),
    )
    answered: dict[str, bool] = {}

    async def conversation(c: int) -> None:
        for t in range(10):
            text = f"c{c} t{t}"
            call = asyncio.ensure_future(bot.chat(f"u{c}", text))
            if rng.random() < 0.3:
                await asyncio.sleep(rng.random() * 0.003)
                call.cancel()
            try:
                assert await call == "re: " + text
                answered[text] = True
            except asyncio.CancelledError:
                answered[text] = False

    async def main() -> None:
        await asyncio.gather(*(conversation(c) for c in range(40)))
        await store.aclose()

    asyncio.run(main())
    assert 0 < list(answered.values()).count(False) < len(answered)
    with SqliteChatMemoryStore(tmp_path / "chat.db") as check:
        for c in range(40):
            texts = [m.text for m in check.get_messages(f"u{c}")]
            turns = list(zip(texts[::2], texts[1::2], strict=True))
            assert all(answer == f"re: {asked}" for asked, answer in turns)
            stored = {asked for asked, _ in turns}
            for t in range(10):
                text = f"c{c} t{t}"
                assert answered[text] == (text in stored), text


def test_forgetting_an_id_whose_limit_now_fails_erases_its_window_and_history(
    tmp_path: Path,
) -> None:
    # The account is deleted first, then its conversation forgotten: the per-user limit
    # can't be read any more, and must not keep the history alive.
    plans = {"alice": 10}
    store = SqliteChatMemoryStore(tmp_path / "c.db", keep_history=True)
    bot = ai_service(
        Bot,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(
            lambda user: plans[user], store=store
        ),
    )
    bot.chat("alice", "my card number is 1234")
    assert [e.message.text for e in store.get_history("alice")] == [
        "my card number is 1234",
        "ok",
    ]
    del plans["alice"]
    bot.forget("alice")
    assert store.get_messages("alice") == []
    assert list(store.get_history("alice")) == []


def test_the_services_own_memory_is_its_ids_conversation_for_every_method() -> None:
    # With chat_memory= beside a provider, the id of the service's own memory ("default")
    # is one conversation: the methods without a MemoryId, a method given that id, and
    # get_chat_memory / forget all reach the same memory.
    class Bot(ChatMemoryAccess, Protocol):
        def ask(self, text: str) -> str: ...

        def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    own = MessageWindowChatMemory(20)
    made: list[object] = []

    def provider(memory_id: Hashable) -> MessageWindowChatMemory:
        made.append(memory_id)
        return MessageWindowChatMemory(20, id=memory_id)

    bot = ai_service(
        Bot, model=ScriptedChatModel(default="ok"), chat_memory=own, chat_memory_provider=provider
    )
    bot.ask("remember me")
    bot.chat("default", "and me")
    bot.chat("alice", "hi")
    assert [m.text for m in own.messages()] == ["remember me", "ok", "and me", "ok"]
    assert bot.get_chat_memory("default") is own
    assert made == ["alice"]
    bot.forget("default")
    assert own.messages() == []
    assert [m.text for m in bot.get_chat_memory("alice").messages()] == ["hi", "ok"]


def test_a_memory_id_whose_text_is_its_address_is_refused_before_the_model() -> None:
    class Session:  # no __repr__: its text would be its address
        def __init__(self, user: str) -> None:
            self.user = user

    class Bot(Protocol):
        def chat(self, session: Annotated[Any, MemoryId], text: str) -> str: ...

    model = ScriptedChatModel(default="ok")
    bot = ai_service(Bot, model=model, chat_memory_provider=MessageWindowChatMemory.provider())
    with pytest.raises(TypeError, match=r"Bot.chat\(session\): a memory id is filed under"):
        bot.chat(Session("alice"), "hi")
    assert model.requests == []

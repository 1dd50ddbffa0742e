"""Scopes (memory_scope, current_memory_scope), seeded conversations and async memory access."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections.abc import AsyncIterator, Hashable, Iterator
from pathlib import Path
from typing import Annotated, Any, Protocol

import pytest

from aiservices import (
    AiMessage,
    ChatMemoryAccess,
    ChatMessage,
    InMemoryChatMemoryStore,
    MemoryId,
    MemoryScope,
    MessageWindowChatMemory,
    SqliteChatMemoryStore,
    StreamEvent,
    SystemMessage,
    UserMessage,
    ai_service,
    current_memory_scope,
    memory_scope,
)
from aiservices.testing import ScriptedChatModel


class Bot(ChatMemoryAccess, Protocol):
    def chat(self, text: str) -> str: ...

    def chat_as(self, user: Annotated[str, MemoryId], text: str) -> str: ...


class AsyncBot(ChatMemoryAccess, Protocol):
    async def chat(self, text: str) -> str: ...


def _bot(store: Any = None, **options: Any) -> Bot:
    return ai_service(
        Bot,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=50, store=store),
        **options,
    )


def _texts(bot: Any, memory_id: Hashable) -> list[str | None]:
    return [m.text for m in bot.get_chat_memory(memory_id).messages()]


# -- the scope itself -----------------------------------------------------------------


def test_a_scope_has_the_id_given_or_a_new_one_and_is_current_inside() -> None:
    assert current_memory_scope() is None
    with memory_scope("job-7", on_exit="keep") as scope:
        assert isinstance(scope, MemoryScope)
        assert scope.memory_id == "job-7"
        assert current_memory_scope() is scope
        with memory_scope() as inner:
            assert current_memory_scope() is inner
            assert isinstance(inner.memory_id, str)
            assert len(inner.memory_id) == 36  # a uuid4 string
        assert current_memory_scope() is scope
    assert current_memory_scope() is None


def test_a_wrong_on_exit_fails_when_the_scope_is_made() -> None:
    with pytest.raises(ValueError, match="on_exit must be 'forget', 'evict' or 'keep'"):
        memory_scope(on_exit="drop")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be hashable"):
        memory_scope(["a"])  # type: ignore[arg-type]


def test_calls_without_a_memory_id_use_the_scopes_conversation() -> None:
    bot = _bot()
    with memory_scope("ada", on_exit="keep"):
        bot.chat("Hi, I am Ada")
        bot.chat_as("bob", "Hi, I am Bob")  # a MemoryId parameter: unaffected
        with memory_scope("inner", on_exit="keep"):
            bot.chat("nested")
        bot.chat("What is my name?")
    bot.chat("outside")
    assert _texts(bot, "ada") == ["Hi, I am Ada", "ok", "What is my name?", "ok"]
    assert _texts(bot, "inner") == ["nested", "ok"]
    assert _texts(bot, "bob") == ["Hi, I am Bob", "ok"]
    assert _texts(bot, "default") == ["outside", "ok"]


def _scoped_job(bot: Bot, memory_id: str) -> Iterator[None]:
    # A generator holding a scope across a yield: two of them, advanced in turn, enter
    # and leave their scopes out of order in one context.
    with memory_scope(memory_id, on_exit="keep"):
        bot.chat(f"{memory_id} starts")
        yield


def test_scopes_left_out_of_order_restore_no_scope_that_has_ended() -> None:
    bot = _bot()
    first, second = _scoped_job(bot, "first"), _scoped_job(bot, "second")
    next(first)
    next(second)
    next(first, None)  # "first" ends while "second" is still inside its scope
    scope = current_memory_scope()
    assert scope is not None
    assert scope.memory_id == "second"
    bot.chat("while second")
    next(second, None)
    assert current_memory_scope() is None  # not "first", which ended before
    bot.chat("after both")
    assert _texts(bot, "first") == ["first starts", "ok"]
    assert _texts(bot, "second") == ["second starts", "ok", "while second", "ok"]
    assert _texts(bot, "default") == ["after both", "ok"]

    # Inside a scope of their own, they leave it current.
    with memory_scope("outer", on_exit="keep") as outer:
        first, second = _scoped_job(bot, "first"), _scoped_job(bot, "second")
        next(first)
        next(second)
        next(first, None)
        next(second, None)
        assert current_memory_scope() is outer


def test_a_scope_entered_again_after_out_of_order_exits_is_left_without_a_hang() -> None:
    a = memory_scope("a", on_exit="keep")
    b = memory_scope("b", on_exit="keep")
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)  # out of order, as two generators advanced in turn do
    assert current_memory_scope() is b
    done = threading.Event()
    seen: list[object] = []

    def reenter() -> None:
        with a:  # (its outer scope is now b, whose outer was a)
            b.__exit__(None, None, None)
            seen.append(current_memory_scope())
        seen.append(current_memory_scope())
        done.set()

    # Run in a copy of this context, on a thread: a hang fails the test instead of the run.
    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(reenter,), daemon=True).start()
    assert done.wait(10), "leaving the scope looped forever"
    assert seen == [a, None]


def test_a_service_with_one_memory_is_unaffected() -> None:
    class One(Protocol):
        def chat(self, text: str) -> str: ...

    memory = MessageWindowChatMemory(10)
    bot = ai_service(One, model=ScriptedChatModel(default="ok"), chat_memory=memory)
    with memory_scope("job"):
        bot.chat("hi")
    assert [m.text for m in memory.messages()] == ["hi", "ok"]


@pytest.mark.parametrize("raising", [False, True])
def test_forget_on_exit_erases_every_used_services_conversation(raising: bool) -> None:
    store = InMemoryChatMemoryStore()
    first, second, unused = _bot(store), _bot(store), _bot(store)
    expected = pytest.raises(RuntimeError) if raising else contextlib.nullcontext()
    with expected, memory_scope("req") as scope:
        first.chat("to the first")
        second.chat("to the second")
        if raising:
            raise RuntimeError("the request failed")
    assert store.get_messages("req") == []
    assert _texts(first, "req") == []
    assert _texts(second, "req") == []
    assert scope.memory_id == "req"
    del unused


def test_evict_on_exit_keeps_the_stored_conversation_and_drops_the_cached_memory() -> None:
    made: list[Hashable] = []
    store = InMemoryChatMemoryStore()

    def provider(memory_id: Hashable) -> MessageWindowChatMemory:
        made.append(memory_id)
        return MessageWindowChatMemory(10, id=memory_id, store=store)

    bot = ai_service(Bot, model=ScriptedChatModel(default="ok"), chat_memory_provider=provider)
    with memory_scope("s", on_exit="evict"):
        bot.chat("hi")
    assert [m.text for m in store.get_messages("s")] == ["hi", "ok"]
    assert _texts(bot, "s") == ["hi", "ok"]
    assert made == ["s", "s"]  # made again after the eviction


def test_a_late_turn_of_a_forgetting_scope_leaves_no_history(tmp_path: Path) -> None:
    # A turn that ends after its scope forgot (it was starting when the block ended, or a
    # task started inside calls later) erases what it recorded, history included.
    store = SqliteChatMemoryStore(tmp_path / "chat.db", keep_history=True)
    bot = ai_service(
        AsyncBot,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=1, store=store),
    )

    async def main() -> tuple[str, Hashable]:
        ended = asyncio.Event()

        async def later() -> str:
            await ended.wait()
            return await bot.chat("my card number is 4111")

        async with memory_scope() as scope:
            await bot.chat("hi")
            task = asyncio.create_task(later())
        ended.set()
        return await task, scope.memory_id

    answer, memory_id = asyncio.run(main())
    assert answer == "ok"  # the caller gets its answer; nothing of it stays
    assert store.get_messages(memory_id) == []
    assert store.get_history(memory_id) == []
    assert list(store.memory_ids()) == []
    store.close()


def test_a_turn_running_when_its_scope_forgets_is_forgotten_once() -> None:
    # The exit waits for the turn's lock, then finds the conversation the turn erased.
    made: list[Hashable] = []
    store = InMemoryChatMemoryStore()

    def provider(memory_id: Hashable) -> MessageWindowChatMemory:
        made.append(memory_id)
        return MessageWindowChatMemory(10, id=memory_id, store=store)

    class Slow(ScriptedChatModel):
        async def achat(self, request: Any) -> Any:
            await asyncio.sleep(0.2)
            return self.chat(request)

    bot = ai_service(AsyncBot, model=Slow(default="ok"), chat_memory_provider=provider)

    async def main() -> str:
        async with memory_scope("s"):
            task = asyncio.create_task(bot.chat("hi"))
            await asyncio.sleep(0.05)  # the turn holds the conversation, in the model
        return await task

    assert asyncio.run(main()) == "ok"
    assert store.get_messages("s") == []
    assert made == ["s"]
    assert bot.conversation_stats().conversations_forgotten == 1


@pytest.mark.parametrize("on_exit", ["forget", "evict", "keep"])
def test_a_task_started_in_a_scope_that_calls_after_it_ended_follows_its_exit(
    on_exit: Any,
) -> None:
    made: list[Hashable] = []
    store = InMemoryChatMemoryStore()

    def provider(memory_id: Hashable) -> MessageWindowChatMemory:
        made.append(memory_id)
        return MessageWindowChatMemory(10, id=memory_id, store=store)

    bot = ai_service(AsyncBot, model=ScriptedChatModel(default="ok"), chat_memory_provider=provider)

    async def main() -> Hashable:
        ended = asyncio.Event()

        async def later() -> str:
            await ended.wait()
            return await bot.chat("after the block")  # the task's context still has the scope

        async with memory_scope(on_exit=on_exit) as scope:
            task = asyncio.create_task(later())
        ended.set()
        assert await task == "ok"
        return scope.memory_id

    memory_id = asyncio.run(main())
    stored = [m.text for m in store.get_messages(memory_id)]
    assert stored == ([] if on_exit == "forget" else ["after the block", "ok"])
    stats = bot.conversation_stats()
    # Forgotten or evicted, the memory left the cache with the turn; kept, it stays.
    assert stats.cached_conversations == (1 if on_exit == "keep" else 0)
    assert stats.conversations_forgotten == (1 if on_exit == "forget" else 0)
    assert stats.turns_committed == 1
    assert made == [memory_id]


def test_keep_on_exit_leaves_everything() -> None:
    made: list[Hashable] = []

    def provider(memory_id: Hashable) -> MessageWindowChatMemory:
        made.append(memory_id)
        return MessageWindowChatMemory(10, id=memory_id)

    bot = ai_service(Bot, model=ScriptedChatModel(default="ok"), chat_memory_provider=provider)
    with memory_scope("s", on_exit="keep"):
        bot.chat("hi")
    assert _texts(bot, "s") == ["hi", "ok"]
    assert made == ["s"]


def test_forget_on_exit_erases_the_history_too(tmp_path: Path) -> None:
    store = SqliteChatMemoryStore(tmp_path / "chat.db", keep_history=True)
    bot = ai_service(
        Bot,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=2, store=store),
    )
    with memory_scope("req"):
        for i in range(3):
            bot.chat(f"turn {i}")
        assert len(store.get_history("req")) == 6
    fresh = SqliteChatMemoryStore(tmp_path / "chat.db", keep_history=True)
    assert fresh.get_history("req") == []
    assert fresh.get_messages("req") == []
    fresh.close()
    store.close()


def test_tasks_created_inside_see_the_scope_and_threads_do_not() -> None:
    seen: dict[str, Any] = {}

    async def main() -> None:
        with memory_scope("outer", on_exit="keep") as scope:

            async def in_task() -> None:
                seen["task"] = current_memory_scope()

            await asyncio.create_task(in_task())
            thread = threading.Thread(target=lambda: seen.update(thread=current_memory_scope()))
            thread.start()
            thread.join()
            seen["scope"] = scope

    asyncio.run(main())
    assert seen["task"] is seen["scope"]
    assert seen["thread"] is None


def test_a_hundred_tasks_each_in_their_own_scope_stay_isolated() -> None:
    store = InMemoryChatMemoryStore()

    class Echo:
        async def achat(self, request: Any) -> Any:
            from aiservices.models import ChatResponse

            await asyncio.sleep(0)
            said = [m.text for m in request.messages if isinstance(m, UserMessage)]
            return ChatResponse(AiMessage(" | ".join(str(t) for t in said)))

        def chat(self, request: Any) -> Any:
            raise AssertionError("async only")

    bot = ai_service(
        AsyncBot,
        model=Echo(),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=50, store=store),
    )

    async def one(i: int) -> tuple[str, str, str]:
        async with memory_scope(f"task-{i}", on_exit="keep"):
            await bot.chat(f"I am {i}")
            await asyncio.sleep(0)
            answer = await bot.chat(f"who am I, {i}?")
            return f"task-{i}", answer, f"I am {i} | who am I, {i}?"

    async def main() -> list[tuple[str, str, str]]:
        return await asyncio.gather(*(one(i) for i in range(100)))

    for memory_id, answer, expected in asyncio.run(main()):
        assert answer == expected
        assert len(store.get_messages(memory_id)) == 4


class SlowForgetStore(SqliteChatMemoryStore):
    def forget(self, memory_id: Hashable) -> None:
        time.sleep(0.2)
        super().forget(memory_id)


def test_an_async_exit_erases_without_blocking_the_event_loop(tmp_path: Path) -> None:
    store = SlowForgetStore(tmp_path / "chat.db", keep_history=True)
    bot = ai_service(
        AsyncBot,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10, store=store),
    )
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    async def main() -> None:
        running = asyncio.create_task(ticker())
        async with memory_scope("req"):
            await bot.chat("hi")
        running.cancel()

    asyncio.run(main())
    assert ticks >= 5  # the loop ran while the store erased for 0.2 s
    assert store.get_history("req") == []
    store.close()


# -- seeded conversations -------------------------------------------------------------

SEED = [UserMessage("2 + 2?"), AiMessage("4")]


def test_a_new_conversation_starts_with_the_seed_committed_with_its_first_turn() -> None:
    store = InMemoryChatMemoryStore()
    model = ScriptedChatModel(default="6")
    asked: list[Hashable] = []

    def seed(memory_id: Hashable) -> list[ChatMessage]:
        asked.append(memory_id)
        return SEED

    bot = ai_service(
        Bot,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10, store=store),
        seed_memory=seed,
    )
    bot.chat_as("ada", "3 + 3?")
    assert model.requests[0].messages == [*SEED, UserMessage("3 + 3?")]
    stored = store.get_messages("ada")
    assert [m.text for m in stored] == ["2 + 2?", "4", "3 + 3?", "6"]
    assert len({m.turn_id for m in stored}) == 1
    bot.chat_as("ada", "again")
    assert asked == ["ada"]  # only a conversation that starts empty is seeded
    assert [m.text for m in store.get_messages("ada")][-2:] == ["again", "6"]


def test_a_failed_first_turn_leaves_a_seeded_memory_empty() -> None:
    store = InMemoryChatMemoryStore()
    bot = ai_service(
        Bot,
        model=ScriptedChatModel(RuntimeError("model down"), "fine"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10, store=store),
        seed_memory=lambda memory_id: SEED,
    )
    with pytest.raises(RuntimeError, match="model down"):
        bot.chat_as("ada", "hi")
    assert store.get_messages("ada") == []
    bot.chat_as("ada", "hi")
    assert [m.text for m in store.get_messages("ada")] == ["2 + 2?", "4", "hi", "fine"]


def test_a_seed_that_is_not_messages_is_a_type_error() -> None:
    bot = ai_service(
        Bot,
        model=ScriptedChatModel(default="x"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10),
        seed_memory=lambda memory_id: ["hello"],  # type: ignore[list-item,return-value,arg-type]
    )
    with pytest.raises(TypeError, match="each must be a chat message"):
        bot.chat_as("ada", "hi")


def test_a_seed_of_one_message_says_to_return_a_sequence() -> None:
    bot = ai_service(
        Bot,
        model=ScriptedChatModel(default="x"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10),
        seed_memory=lambda memory_id: SystemMessage("Be a pirate."),  # type: ignore[arg-type,return-value]
    )
    with pytest.raises(TypeError, match=r"returned SystemMessage; it returns a sequence"):
        bot.chat_as("ada", "hi")


# -- async access -----------------------------------------------------------------------


def test_async_memory_access_does_what_the_sync_forms_do() -> None:
    store = InMemoryChatMemoryStore()
    bot = ai_service(
        AsyncBot,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10, store=store),
    )

    async def main() -> None:
        async with memory_scope("a", on_exit="keep"):
            await bot.chat("hi")
        memory = await bot.aget_chat_memory("a")
        assert [m.text for m in memory.messages()] == ["hi", "ok"]
        await bot.aevict_chat_memory("a")
        assert await bot.aget_chat_memory("a") is not memory
        await bot.aforget("a")
        assert store.get_messages("a") == []

    asyncio.run(main())


def test_a_scope_left_in_another_context_still_applies_its_exit() -> None:
    store = InMemoryChatMemoryStore()
    bot = ai_service(
        AsyncBot,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10, store=store),
    )
    problems: list[Any] = []

    async def answers() -> Any:
        async with memory_scope():
            yield await bot.chat("a")
            yield await bot.chat("b")

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: problems.append(ctx))

        async def consume() -> None:
            stream = answers()
            await stream.__anext__()  # abandoned after one answer, as by a client gone

        await asyncio.create_task(consume())
        import gc

        gc.collect()
        await asyncio.sleep(0.05)  # the loop finalises the generator in a context of its own

    asyncio.run(main())
    assert problems == []
    assert list(store.memory_ids()) == []


# -- streams left open in a scope -------------------------------------------------------


class StreamingBot(ChatMemoryAccess, Protocol):
    def chat(self, text: str) -> Iterator[str]: ...


class AsyncStreamingBot(ChatMemoryAccess, Protocol):
    def chat(self, text: str) -> AsyncIterator[str]: ...


def test_a_stream_left_unfinished_is_closed_when_its_scope_forgets() -> None:
    # The stream holds its conversation until it ends: forgetting closes it (it records
    # nothing) instead of waiting for it forever.
    store = InMemoryChatMemoryStore()
    bot = ai_service(
        StreamingBot,
        model=ScriptedChatModel(default="Hello there, how are you?"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10, store=store),
    )
    left: list[str] = []

    def user_code() -> None:
        with memory_scope("s"):
            stream = bot.chat("hi")
            left.append(next(iter(stream)))
        left.extend(stream)  # closed: nothing more

    thread = threading.Thread(target=user_code, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), "leaving the scope waited for the open stream"
    assert len(left) == 1
    assert "Hello there, how are you?".startswith(left[0])
    assert store.get_messages("s") == []
    with memory_scope("s", on_exit="keep"):  # the conversation is free
        assert "".join(bot.chat("again")) == "Hello there, how are you?"
    assert [m.text for m in store.get_messages("s")] == ["again", "Hello there, how are you?"]


async def test_an_async_stream_left_unfinished_is_closed_when_its_scope_ends() -> None:
    store = InMemoryChatMemoryStore()
    bot = ai_service(
        AsyncStreamingBot,
        model=ScriptedChatModel(default="Hello there"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10, store=store),
    )

    async def user_code() -> AsyncIterator[str]:
        async with memory_scope("s"):
            stream = bot.chat("hi")
            async for _ in stream:
                break
        return stream

    stream = await asyncio.wait_for(user_code(), 5)
    assert [chunk async for chunk in stream] == []
    assert store.get_messages("s") == []


def _in_a_thread(main: Any) -> list[Any]:
    # A scope that deadlocks its event loop would hang the test: run it where it can't.
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(asyncio.run(main()))
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), "leaving the scope blocked its event loop"
    return outcome


def test_a_plain_with_in_async_code_closes_an_async_stream_left_unfinished() -> None:
    store = InMemoryChatMemoryStore()
    bot = ai_service(
        AsyncStreamingBot,
        model=ScriptedChatModel(default="Hello there, how are you?", chunk_size=2),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10, store=store),
    )

    async def user_code() -> list[str]:
        with memory_scope("s"):  # `with`, not `async with`
            stream = bot.chat("hi")
            first = await stream.__anext__()
        return [first] + [chunk async for chunk in stream]

    (read,) = _in_a_thread(user_code)
    assert read == ["He"]
    assert store.get_messages("s") == []


def test_a_plain_with_in_async_code_says_why_it_cannot_end_a_stream_still_running() -> None:
    # The stream is inside the model's await when the block ends: only this loop can finish
    # it, and the exit would block that loop, so the exit forgets nothing and says why.
    store = InMemoryChatMemoryStore()

    class WaitingModel:
        def __init__(self) -> None:
            self.go: asyncio.Event | None = None
            self.waiting: asyncio.Event | None = None

        def chat(self, request: Any) -> Any:
            raise AssertionError("streamed")

        async def astream(self, request: Any) -> AsyncIterator[Any]:
            from aiservices.models import ChatResponse

            assert self.go is not None
            assert self.waiting is not None
            yield "Hel"
            self.waiting.set()
            await self.go.wait()
            yield "lo"
            yield ChatResponse(AiMessage("Hello"))

    model = WaitingModel()
    bot = ai_service(
        AsyncStreamingBot,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10, store=store),
    )

    async def user_code() -> Any:
        model.go, model.waiting = asyncio.Event(), asyncio.Event()
        chunks: list[str] = []

        async def read(stream: Any) -> None:
            async for chunk in stream:
                chunks.append(chunk)

        try:
            with memory_scope("s"):
                reader = asyncio.ensure_future(read(bot.chat("hi")))
                await model.waiting.wait()
        except RuntimeError as error:
            model.go.set()
            await reader
            return error, chunks
        raise AssertionError("the exit did not say it could not end the stream")

    ((error, chunks),) = _in_a_thread(user_code)
    assert "async with memory_scope" in str(error)
    assert "nothing was forgotten" in str(error)
    assert chunks == ["Hel", "lo"]
    assert [m.text for m in store.get_messages("s")] == ["hi", "Hello"]


def test_a_plain_with_closes_an_async_stream_paused_on_another_threads_loop() -> None:
    # Sync code that drives async calls on a long-lived loop in a background thread.
    store = InMemoryChatMemoryStore()
    bot = ai_service(
        AsyncStreamingBot,
        model=ScriptedChatModel(default="Hello there, how are you?", chunk_size=2),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10, store=store),
    )
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    left: list[str] = []

    def handler() -> None:
        with memory_scope("s"):
            bot.chat("before").__aiter__()  # made, never started
            stream = bot.chat("hi")
            first = asyncio.run_coroutine_threadsafe(anext(stream), loop).result(5)  # type: ignore[arg-type]
            assert first == "He"
        left.append("left")

    try:
        thread = threading.Thread(target=handler, daemon=True)
        thread.start()
        thread.join(5)
        assert not thread.is_alive(), "the exit waited forever for a stream paused elsewhere"
        assert left == ["left"]
        assert store.get_messages("s") == []
        # The conversation is free: a call on the loop runs at once.
        follow = asyncio.run_coroutine_threadsafe(_read(bot.chat("again")), loop)
        assert follow.result(5) == "Hello there, how are you?"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)
        loop.close()


class AsyncEventsBot(Protocol):
    def chat(self, text: str) -> AsyncIterator[StreamEvent]: ...


def test_a_plain_with_forgets_after_an_async_stream_read_to_its_end_by_asyncio_run() -> None:
    store = InMemoryChatMemoryStore()
    bot = ai_service(
        AsyncEventsBot,
        model=ScriptedChatModel(default="Hello there", chunk_size=3),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10, store=store),
    )

    async def read(stream: Any) -> list[str]:
        return [type(event).__name__ async for event in stream]

    with memory_scope("s"):
        stream = bot.chat("my card is 4111")  # still referenced when the block ends
        assert asyncio.run(read(stream))[-1] == "TurnCompleted"
        assert [m.text for m in store.get_messages("s")] == ["my card is 4111", "Hello there"]
    assert store.get_messages("s") == []


async def _read(stream: Any) -> str:
    return "".join([chunk async for chunk in stream])


class _CloseFails:
    """Streams; closing its stream early raises, as an HTTP response's close can, or takes
    a moment (``close_delay``)."""

    def __init__(self, close_delay: float = 0.0) -> None:
        self.close_delay = close_delay

    def chat(self, request: Any) -> Any:
        from aiservices.models import ChatResponse

        return ChatResponse(AiMessage("hello there"))

    async def astream(self, request: Any) -> AsyncIterator[Any]:
        try:
            yield "hello "
            yield "there"
            yield self.chat(request)
        finally:
            if self.close_delay:
                await asyncio.sleep(self.close_delay)
            else:
                raise OSError("connection reset while closing the response")


class ScopedStreams(ChatMemoryAccess, Protocol):
    def stream(self, text: str) -> AsyncIterator[str]: ...

    async def chat(self, text: str) -> str: ...


def test_a_stream_whose_close_fails_does_not_keep_the_scope_from_ending() -> None:
    store = InMemoryChatMemoryStore()
    bot = ai_service(
        ScopedStreams,
        model=_CloseFails(),
        chat_memory_provider=MessageWindowChatMemory.provider(20, store=store),
    )

    async def main() -> None:
        raised: BaseException | None = None
        try:
            async with memory_scope():
                await bot.chat("my card number is 4111")
                await anext(bot.stream("and now a story"))  # type: ignore[arg-type]
        except OSError as error:
            raised = error
        assert "connection reset" in str(raised)
        assert current_memory_scope() is None
        assert list(store.memory_ids()) == []  # forgotten all the same
        await bot.chat("after the block")
        assert list(store.memory_ids()) == ["default"]

    asyncio.run(main())


def test_a_scope_cancelled_while_it_closes_a_stream_still_ends() -> None:
    store = InMemoryChatMemoryStore()
    bot = ai_service(
        ScopedStreams,
        model=_CloseFails(close_delay=0.2),
        chat_memory_provider=MessageWindowChatMemory.provider(20, store=store),
    )
    seen: list[Any] = []

    async def handler() -> None:
        try:
            async with memory_scope():
                await bot.chat("private details")
                await anext(bot.stream("a story"))  # type: ignore[arg-type]
        finally:
            seen.append(current_memory_scope())

    async def main() -> None:
        task = asyncio.create_task(handler())
        await asyncio.sleep(0.1)  # the exit is closing the stream
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()

    asyncio.run(main())
    assert seen == [None]
    assert list(store.memory_ids()) == []


@pytest.mark.parametrize("on_exit", ["keep", "evict"])
def test_a_stream_of_a_scope_that_keeps_its_conversation_may_be_read_after_it(
    on_exit: Any,
) -> None:
    # As a web framework reads a streamed response after the handler's block has ended.
    store = InMemoryChatMemoryStore()
    bot = ai_service(
        StreamingBot,
        model=ScriptedChatModel(default="Hello there"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10, store=store),
    )
    with memory_scope("s", on_exit=on_exit):
        stream = bot.chat("hi")
        first = next(iter(stream))
    assert first + "".join(stream) == "Hello there"
    assert [m.text for m in store.get_messages("s")] == ["hi", "Hello there"]


async def test_a_scope_cancelled_again_while_it_forgets_still_forgets() -> None:
    # A web framework may cancel a request's task again while its scope exits: the exit
    # waits for the turn in flight, forgets, then lets the cancellation go on.
    store = InMemoryChatMemoryStore()
    answering, go = asyncio.Event(), asyncio.Event()

    class Waiting(ScriptedChatModel):
        async def achat(self, request: Any) -> Any:
            answering.set()
            await go.wait()
            return await super().achat(request)

    bot = ai_service(
        AsyncBot,
        model=Waiting(default="ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10, store=store),
    )
    calls: list[asyncio.Task[str]] = []

    async def handler() -> None:
        async with memory_scope("request"):
            calls.append(asyncio.ensure_future(bot.chat("private")))
            await asyncio.sleep(10)

    task = asyncio.ensure_future(handler())
    await answering.wait()
    task.cancel()  # the exit now waits for the turn in flight
    for _ in range(5):
        await asyncio.sleep(0)
    task.cancel()  # and is cancelled again
    for _ in range(5):
        await asyncio.sleep(0)
    go.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert await calls[0] == "ok"
    assert store.get_messages("request") == []


def test_a_plain_with_leaves_a_close_that_must_wait_to_the_loop_and_frees_the_conversation() -> (
    None
):
    # A provider's stream awaits its HTTP response's close: the exit can't wait for it, so
    # it says so, and the loop finishes the close once the exit gives it back.
    store = InMemoryChatMemoryStore()

    class SlowToClose:
        def chat(self, request: Any) -> Any:
            from aiservices.models import ChatResponse

            return ChatResponse(AiMessage("plain"))

        async def astream(self, request: Any) -> AsyncIterator[Any]:
            from aiservices.models import ChatResponse

            try:
                yield "Hel"
                yield "lo"
                yield ChatResponse(AiMessage("Hello"))
            finally:
                await asyncio.sleep(0.01)  # closing a response takes an await

    bot = ai_service(
        AsyncStreamingBot,
        model=SlowToClose(),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10, store=store),
    )

    async def user_code() -> Any:
        try:
            with memory_scope("s"):
                stream = bot.chat("hi")
                await stream.__anext__()
        except RuntimeError as error:
            said = str(error)
        else:
            raise AssertionError("the exit did not say it could not close the stream")
        with memory_scope("s", on_exit="keep"):
            return said, [chunk async for chunk in bot.chat("again")]

    ((said, again),) = _in_a_thread(user_code)
    assert "async with memory_scope" in said
    assert "".join(again) == "Hello"
    assert [m.text for m in store.get_messages("s")] == ["again", "Hello"]


class _Slow(ScriptedChatModel):
    """Streams ten chunks, 100 ms apart."""

    def stream(self, request: Any) -> Iterator[Any]:
        for i in range(10):
            time.sleep(0.1)
            yield f"c{i} "
        yield self.chat(request)

    async def astream(self, request: Any) -> AsyncIterator[Any]:
        for i in range(10):
            await asyncio.sleep(0.1)
            yield f"c{i} "
        yield await self.achat(request)


class _Teller(Protocol):
    def tell(self, topic: str) -> Iterator[str]: ...

    def atell(self, topic: str) -> AsyncIterator[str]: ...


def test_an_async_stream_read_by_another_task_stops_when_its_scope_forgets() -> None:
    # Being read just then, the stream can't be closed from the exit: it stops at its next
    # chunk, recording nothing, and the exit waits for that chunk only (not the second the
    # whole stream takes).
    store = InMemoryChatMemoryStore()
    bot = ai_service(
        _Teller,
        model=_Slow(default="done"),
        chat_memory_provider=MessageWindowChatMemory.provider(20, store=store),
    )

    async def scenario() -> tuple[float, list[str], Hashable]:
        got: list[str] = []
        first = asyncio.Event()

        async def reader(stream: AsyncIterator[str]) -> None:
            async for chunk in stream:
                got.append(chunk)
                first.set()

        async with memory_scope() as scope:
            task = asyncio.create_task(reader(bot.atell("x")))
            await first.wait()  # one chunk read: the reader waits for the next
            began = time.perf_counter()
        took = time.perf_counter() - began
        await asyncio.wait_for(task, 5)
        return took, got, scope.memory_id

    took, got, memory_id = asyncio.run(scenario())
    assert got in (["c0 "], ["c0 ", "c1 "])
    assert took < 0.6
    assert store.get_messages(memory_id) == []


def test_a_sync_stream_read_by_another_thread_stops_when_its_scope_forgets() -> None:
    store = InMemoryChatMemoryStore()
    bot = ai_service(
        _Teller,
        model=_Slow(default="done"),
        chat_memory_provider=MessageWindowChatMemory.provider(20, store=store),
    )
    got: list[str] = []
    with memory_scope() as scope:
        stream = bot.tell("x")
        reader = threading.Thread(target=lambda: got.extend(stream), daemon=True)
        reader.start()
        while not got:
            time.sleep(0.01)
        began = time.perf_counter()
    took = time.perf_counter() - began
    reader.join(5)
    assert not reader.is_alive()
    assert got in (["c0 "], ["c0 ", "c1 "])
    assert took < 0.6
    assert store.get_messages(scope.memory_id) == []

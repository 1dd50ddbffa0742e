"""The retriever and the request transformer: the model sees what they add or change; the
memory keeps only what the user said and the answers."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Hashable, Iterator, Sequence
from typing import Annotated, Protocol

import pytest
from _recorded import StoreUnderTest, store_under_test

from aiservices import (
    ChatMemoryAccess,
    ChatRequest,
    InterfaceError,
    MemoryId,
    MessageWindowChatMemory,
    Result,
    SystemMessage,
    UserMessage,
    ai_service,
)
from aiservices.testing import ScriptedChatModel

__all__ = ["store_under_test"]

DOCS = {
    "refund": "Refunds take 5 days.",
    "shipping": "Shipping is free over 50 EUR.",
}


def retrieve(query: str, memory_id: Hashable) -> list[str]:
    return [text for word, text in DOCS.items() if word in query]


class Bot(ChatMemoryAccess, Protocol):
    def chat(self, user: Annotated[str, MemoryId], text: str) -> Result[str]: ...


class AsyncBot(ChatMemoryAccess, Protocol):
    async def chat(self, user: Annotated[str, MemoryId], text: str) -> Result[str]: ...


def _provider(found: StoreUnderTest) -> MessageWindowChatMemory.provider:  # type: ignore[valid-type]
    return MessageWindowChatMemory.provider(max_messages=20, store=found.store)


def test_retrieved_texts_reach_the_model_and_the_sources_not_the_memory(
    store_under_test: StoreUnderTest,
) -> None:
    model = ScriptedChatModel("5 days, and shipping is free over 50.")
    bot = ai_service(
        Bot, model=model, chat_memory_provider=_provider(store_under_test), retriever=retrieve
    )
    result = bot.chat("u", "refund and shipping?")
    assert result.sources == ("Refunds take 5 days.", "Shipping is free over 50 EUR.")
    sent = model.requests[0].messages[-1]
    assert isinstance(sent, UserMessage)
    assert sent.text.startswith("refund and shipping?\n\n")
    assert "Refunds take 5 days.\n\nShipping is free over 50 EUR." in sent.text
    stored = store_under_test.store.get_messages("u")
    assert [m.text for m in stored] == ["refund and shipping?", result.content]
    # The message sent and the message recorded are the same message: the same id.
    assert sent.message_id == stored[0].message_id


def test_without_a_retriever_sources_are_empty_and_nothing_is_added() -> None:
    model = ScriptedChatModel("ok")
    bot = ai_service(
        Bot, model=model, chat_memory_provider=MessageWindowChatMemory.provider(max_messages=5)
    )
    assert bot.chat("u", "refund?").sources == ()
    assert model.requests[0].messages == [UserMessage("refund?")]


def test_a_retriever_that_finds_nothing_leaves_the_message_as_it_is() -> None:
    model = ScriptedChatModel("ok")
    bot = ai_service(
        Bot,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=5),
        retriever=retrieve,
    )
    assert bot.chat("u", "hello").sources == ()
    assert model.requests[0].messages == [UserMessage("hello")]


def test_a_retriever_that_raises_fails_the_call_with_nothing_recorded(
    store_under_test: StoreUnderTest,
) -> None:
    def broken(query: str, memory_id: Hashable) -> Sequence[str]:
        raise ConnectionError("vector store down")

    model = ScriptedChatModel("one", "two")
    ai_service(Bot, model=model, chat_memory_provider=_provider(store_under_test)).chat("u", "hi")
    before = store_under_test.snapshot()
    bot = ai_service(
        Bot, model=model, chat_memory_provider=_provider(store_under_test), retriever=broken
    )
    with pytest.raises(ConnectionError, match="vector store down"):
        bot.chat("u", "refund?")
    assert store_under_test.snapshot() == before
    assert len(model.requests) == 1


def test_the_retrieved_texts_stay_in_the_requests_of_every_tool_round() -> None:
    from aiservices import AiMessage, ToolExecutionRequest, tool

    @tool
    def order(number: str) -> str:
        """An order's status."""
        return "shipped"

    model = ScriptedChatModel(
        AiMessage(tool_execution_requests=[ToolExecutionRequest("c1", "order", '{"number": "7"}')]),
        "Shipped; refunds take 5 days.",
    )
    bot = ai_service(
        Bot,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
        tools=[order],
        retriever=retrieve,
    )
    bot.chat("u", "order 7 and a refund?")
    for request in model.requests:
        assert "Refunds take 5 days." in (request.messages[0].text or "")
    assert bot.get_chat_memory("u").messages()[0].text == "order 7 and a refund?"


def test_an_async_retriever_is_awaited_in_async_calls() -> None:
    async def aretrieve(query: str, memory_id: Hashable) -> list[str]:
        await asyncio.sleep(0)
        return [f"about {query} for {memory_id}"]

    model = ScriptedChatModel("ok")
    bot = ai_service(
        AsyncBot,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=5),
        retriever=aretrieve,
    )
    result = asyncio.run(bot.chat("alice", "tea"))
    assert result.sources == ("about tea for alice",)
    with pytest.raises(InterfaceError, match=r"the retriever .*aretrieve is async"):
        ai_service(
            Bot,
            model=model,
            chat_memory_provider=MessageWindowChatMemory.provider(max_messages=5),
            retriever=aretrieve,
        )


def test_a_retriever_must_return_texts() -> None:
    bot = ai_service(
        Bot,
        model=ScriptedChatModel("ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=5),
        retriever=lambda query, memory_id: "one text",  # type: ignore[arg-type,return-value]
    )
    with pytest.raises(TypeError, match="returns a sequence of texts"):
        bot.chat("u", "hi")


@pytest.mark.parametrize(
    "found",
    [{"doc-1": "Refunds take 5 days."}, {"Refunds take 5 days.", "Shipping is free."}],
    ids=["dict", "set"],
)
def test_a_retriever_returning_a_mapping_or_a_set_is_refused(found: object) -> None:
    # A mapping would send its keys and a set has no order: neither is the texts in order.
    model = ScriptedChatModel("ok")
    bot = ai_service(
        Bot,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=5),
        retriever=lambda query, memory_id: found,  # type: ignore[arg-type,return-value]
    )
    with pytest.raises(TypeError, match=f"returned {type(found).__name__}"):
        bot.chat("u", "hi")
    assert model.requests == []


def test_plain_retrievers_and_seeds_run_off_the_event_loop_in_async_calls() -> None:
    import threading

    where: dict[str, int] = {}

    def retrieve_here(query: str, memory_id: Hashable) -> list[str]:
        where["retriever"] = threading.get_ident()
        return ["found"]

    def seed(memory_id: Hashable) -> list[SystemMessage]:
        where["seed"] = threading.get_ident()
        return [SystemMessage("Be brief.")]

    bot = ai_service(
        AsyncBot,
        model=ScriptedChatModel("ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=5),
        retriever=retrieve_here,
        seed_memory=seed,
    )

    async def main() -> None:
        where["loop"] = threading.get_ident()
        await bot.chat("alice", "tea")

    asyncio.run(main())
    assert where["retriever"] != where["loop"]
    assert where["seed"] != where["loop"]


def test_a_stop_iteration_in_a_plain_retriever_fails_an_async_call() -> None:
    def retrieve_next(query: str, memory_id: Hashable) -> list[str]:
        return [next(iter([]))]

    bot = ai_service(
        AsyncBot,
        model=ScriptedChatModel("ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=5),
        retriever=retrieve_next,
    )

    async def main() -> None:
        await asyncio.wait_for(bot.chat("alice", "tea"), 10)

    with pytest.raises(RuntimeError, match="StopIteration"):
        asyncio.run(main())


def test_the_request_transformer_changes_every_request_and_never_the_memory(
    store_under_test: StoreUnderTest,
) -> None:
    seen: list[Hashable] = []

    def with_date(request: ChatRequest, memory_id: Hashable) -> ChatRequest:
        seen.append(memory_id)
        return dataclasses.replace(
            request, messages=[SystemMessage("Today is Monday."), *request.messages]
        )

    model = ScriptedChatModel("not a number", "3")

    class Counter(ChatMemoryAccess, Protocol):
        def count(self, user: Annotated[str, MemoryId], text: str) -> int: ...

    bot = ai_service(
        Counter,
        model=model,
        chat_memory_provider=_provider(store_under_test),
        request_transformer=with_date,
    )
    assert bot.count("u", "three things") == 3
    assert seen == ["u", "u"]  # the first request and the retry
    for request in model.requests:
        assert request.messages[0] == SystemMessage("Today is Monday.")
    assert [m.text for m in store_under_test.store.get_messages("u")] == ["three things", "3"]


def test_a_transformer_that_changes_the_request_in_place_changes_only_that_request() -> None:
    def policy(request: ChatRequest, memory_id: Hashable) -> ChatRequest:
        request.messages.insert(0, SystemMessage("POLICY"))  # type: ignore[attr-defined]
        return request

    class Counter(ChatMemoryAccess, Protocol):
        def count(self, user: Annotated[str, MemoryId], text: str) -> int: ...

    model = ScriptedChatModel("not a number", "still not", "3")
    bot = ai_service(
        Counter,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(),
        request_transformer=policy,
        max_output_retries=2,
    )
    assert bot.count("u", "three things") == 3
    for request in model.requests:
        assert [m.text for m in request.messages].count("POLICY") == 1
    assert [m.text for m in bot.get_chat_memory("u").messages()] == ["three things", "3"]


def test_a_request_transformer_must_return_a_request() -> None:
    class Plain(Protocol):
        def chat(self, text: str) -> str: ...

    bot = ai_service(
        Plain,
        model=ScriptedChatModel("x"),
        request_transformer=lambda request, memory_id: None,  # type: ignore[arg-type,return-value]
    )
    with pytest.raises(TypeError, match="returns a ChatRequest"):
        bot.chat("hi")


async def test_a_plain_retriever_written_as_a_generator_runs_off_the_event_loop() -> None:
    import threading

    ran_on: list[str] = []

    def retrieve(query: str, memory_id: object) -> Iterator[str]:
        ran_on.append(threading.current_thread().name)
        yield f"about {query}"

    class Bot(Protocol):
        async def ask(self, text: str) -> str: ...

    model = ScriptedChatModel("ok")
    bot = ai_service(Bot, model=model, retriever=retrieve)
    assert await bot.ask("tides") == "ok"
    assert ran_on != [threading.current_thread().name]
    assert "about tides" in (model.requests[0].messages[-1].text or "")


def test_a_stop_iteration_from_a_guardrail_names_it() -> None:
    def picky(text: str) -> str:
        return next(word for word in ["spam"] if word in text)

    class Bot(Protocol):
        def ask(self, text: str) -> str: ...

    bot = ai_service(Bot, model=ScriptedChatModel("ok"), input_guardrails=[picky])
    with pytest.raises(RuntimeError, match=r"picky' raised StopIteration"):
        bot.ask("hello")


async def test_an_async_generator_retriever_and_seed_are_read_in_async_calls() -> None:
    from collections.abc import AsyncIterator

    async def retrieve(query: str, memory_id: object) -> AsyncIterator[str]:
        await asyncio.sleep(0)
        yield f"about {query}"
        yield "and more"

    async def seed(memory_id: object) -> AsyncIterator[SystemMessage]:
        await asyncio.sleep(0)
        yield SystemMessage("Be brief.")

    model = ScriptedChatModel("ok")
    bot = ai_service(
        AsyncBot,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=5),
        retriever=retrieve,
        seed_memory=seed,
    )
    result = await bot.chat("alice", "tides")
    assert result.sources == ("about tides", "and more")
    assert model.requests[0].messages[0] == SystemMessage("Be brief.")
    assert [m.text for m in (await bot.aget_chat_memory("alice")).messages()] == [
        "Be brief.",
        "tides",
        "ok",
    ]


def test_an_async_generator_retriever_or_seed_on_a_sync_method_fails_the_build() -> None:
    from collections.abc import AsyncIterator

    async def retrieve(query: str, memory_id: object) -> AsyncIterator[str]:
        yield "a text"

    async def seed(memory_id: object) -> AsyncIterator[SystemMessage]:
        yield SystemMessage("Be brief.")

    provider = MessageWindowChatMemory.provider(max_messages=5)
    with pytest.raises(InterfaceError, match=r"the retriever .*retrieve is async"):
        ai_service(
            Bot, model=ScriptedChatModel("ok"), chat_memory_provider=provider, retriever=retrieve
        )
    with pytest.raises(InterfaceError, match=r"the seed_memory .*seed is async"):
        ai_service(
            Bot, model=ScriptedChatModel("ok"), chat_memory_provider=provider, seed_memory=seed
        )


def test_a_plain_retriever_returning_an_async_iterator_in_a_sync_call_names_it() -> None:
    async def texts() -> object:
        yield "a text"

    def retrieve(query: str, memory_id: object) -> object:
        return texts()

    class Plain(Protocol):
        def ask(self, text: str) -> str: ...

    bot = ai_service(Plain, model=ScriptedChatModel("ok"), retriever=retrieve)
    with pytest.raises(TypeError, match=r"retrieve' returned an async iterator in a sync call"):
        bot.ask("hello")


def test_an_async_generator_guardrail_fails_the_build_once() -> None:
    async def shout(text: str) -> object:
        yield text.upper()

    class Both(Protocol):
        def ask(self, text: str) -> str: ...

        async def aask(self, text: str) -> str: ...

    with pytest.raises(InterfaceError) as raised:
        ai_service(Both, model=ScriptedChatModel("ok"), input_guardrails=[shout])
    problems = str(raised.value)
    assert problems.count("is an async generator") == 1, problems
    assert "is async and the method is not" not in problems

"""Several writers on one conversation: each add is planned on what the store holds when it
is written, so the window's rules hold over what every writer stored, on every store."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Protocol

import pytest

from aiservices import MemoryId, MessageWindowChatMemory, TokenWindowChatMemory, ai_service
from aiservices.memory import ChatMemory, SummarizingChatMemory
from aiservices.memory.summarizing import is_summary
from aiservices.messages import (
    AiMessage,
    ChatMessage,
    ToolExecutionRequest,
    ToolExecutionResultMessage,
    UserMessage,
)
from aiservices.models import ChatRequest, ChatResponse
from aiservices.stores import ConcurrentChangeError, InMemoryChatMemoryStore
from aiservices.testing import ScriptedChatModel

from .conftest import OpenedBackend

Make = Callable[[Any], ChatMemory]


def two_stores(backend: OpenedBackend, **options: Any) -> tuple[Any, Any]:
    """Two store objects on the same data, as two processes have (one object for a store
    in memory)."""
    first = backend.open(**options)
    return first, backend.open(**options) if backend.spec.persistent else first


def turn(i: int) -> list[ChatMessage]:
    return [UserMessage(f"q{i}"), AiMessage(f"a{i}")]


def tool_turn(i: int) -> list[ChatMessage]:
    request = ToolExecutionRequest(id=f"call-{i}", name="look", arguments="{}")
    return [
        UserMessage(f"q{i}"),
        AiMessage(tool_execution_requests=[request]),
        ToolExecutionResultMessage(id=f"call-{i}", tool_name="look", text=f"r{i}"),
        AiMessage(f"a{i}"),
    ]


def one_writer(make: Make, *batches: Sequence[ChatMessage]) -> list[ChatMessage]:
    """The window one writer leaves after adding ``batches`` in order."""
    store = InMemoryChatMemoryStore()
    memory = make(store)
    for batch in batches:
        memory.add(*batch)
    return store.get_messages("c")


def race(
    backend: OpenedBackend,
    make: Make,
    before: Sequence[ChatMessage],
    first: Sequence[ChatMessage],
    second: Sequence[ChatMessage],
) -> list[ChatMessage]:
    """Two workers read the conversation; one adds ``first``, then the other, planned on its
    older read, adds ``second``. Returns what the store holds then (a read would show only
    what fits the window)."""
    store_1, store_2 = two_stores(backend)
    make(store_1).add(*before)
    late, early = make(store_1), make(store_2)
    late.messages()
    early.messages()
    early.add(*first)
    late.add(*second)
    stored: list[ChatMessage] = store_2.get_messages("c")
    return stored


SHAPES: dict[str, Make] = {
    "messages": lambda store: MessageWindowChatMemory(3, id="c", store=store),
    "whole turns": lambda store: MessageWindowChatMemory(
        4, id="c", store=store, evict_whole_turns=True
    ),
    "tokens": lambda store: TokenWindowChatMemory(5, Words(), id="c", store=store),
}


class Words:
    """One token per word (a message without text counts 1)."""

    def estimate_token_count_in_text(self, text: str) -> int:
        return len(text.split())

    def estimate_token_count_in_message(self, message: ChatMessage) -> int:
        return len((getattr(message, "text", None) or "").split()) or 1


@pytest.mark.parametrize("shape", SHAPES)
def test_an_add_planned_before_another_writer_added_keeps_the_window(
    backend: OpenedBackend, shape: str
) -> None:
    make = SHAPES[shape]
    found = race(backend, make, turn(0), turn(1), turn(2))
    assert found == one_writer(make, turn(0), turn(1), turn(2))
    if shape == "messages":
        assert [m.text for m in found] == ["a1", "q2", "a2"]  # type: ignore[union-attr]


def test_a_tool_round_added_by_another_writer_leaves_with_its_request(
    backend: OpenedBackend,
) -> None:
    make = SHAPES["whole turns"]
    found = race(backend, make, tool_turn(0), tool_turn(1), tool_turn(2))
    assert found == tool_turn(2)
    assert found == one_writer(make, tool_turn(0), tool_turn(1), tool_turn(2))


async def test_an_async_add_planned_before_another_writer_added(backend: OpenedBackend) -> None:
    make = SHAPES["messages"]
    store_1, store_2 = two_stores(backend)
    try:
        await make(store_1).aadd(*turn(0))
        late, early = make(store_1), make(store_2)
        await late.amessages()
        await early.amessages()
        await early.aadd(*turn(1))
        await late.aadd(*turn(2))
        read = getattr(store_2, "aget_messages", None)
        found = store_2.get_messages("c") if read is None else await read("c")
        assert found == one_writer(make, turn(0), turn(1), turn(2))
    finally:
        for store in {id(store_1): store_1, id(store_2): store_2}.values():
            close = getattr(store, "aclose", None)
            if close is not None:
                await close()  # the async clients belong to this test's event loop


class Summarizer:
    """Summarises into ``covers q0,q1,...``: the questions it was shown."""

    def __init__(self) -> None:
        self.requests: list[ChatRequest] = []

    def chat(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        text = request.messages[-1].text  # type: ignore[union-attr]
        seen = sorted({int(n) for n in re.findall(r"\bq(\d+)\b", text)})
        return ChatResponse(AiMessage("covers " + ",".join(f"q{n}" for n in seen)))


def test_summaries_of_two_writers_stay_within_the_budget(backend: OpenedBackend) -> None:
    def make(store: Any) -> ChatMemory:
        return SummarizingChatMemory(max_messages=4, summarizer=Summarizer(), id="c", store=store)

    found = race(backend, make, turn(0), turn(1), turn(2))
    assert len(found) <= 4
    assert found == one_writer(make, turn(0), turn(1), turn(2))
    summary = next(m for m in found if is_summary(m))
    assert summary.text.endswith("covers q0,q1")  # type: ignore[union-attr]


def test_an_add_planned_before_the_conversation_was_cleared_stores_no_summary_of_it(
    backend: OpenedBackend,
) -> None:
    summarizer = Summarizer()
    store_1, store_2 = two_stores(backend)

    def make(store: Any) -> ChatMemory:
        return SummarizingChatMemory(max_messages=4, summarizer=summarizer, id="c", store=store)

    make(store_1).add(*turn(0), *turn(1))
    in_flight = make(store_1)
    in_flight.messages()
    make(store_2).clear()  # the user erased the conversation while a turn was running
    in_flight.add(*turn(2))
    # The summary folded from the erased turns, planned first, was never stored.
    assert store_2.get_messages("c") == turn(2)


class Chat(Protocol):
    def chat(self, user: Annotated[str, MemoryId], message: str) -> str: ...


def test_two_workers_answering_at_once_keep_the_window(backend: OpenedBackend) -> None:
    # Worker 1 has read the conversation and waits for its model, which answers only once
    # worker 2's whole turn is stored.
    asked, stored = threading.Event(), threading.Event()

    def slow(request: ChatRequest) -> str:
        asked.set()
        assert stored.wait(10)
        return "slow answer"

    def quick(request: ChatRequest) -> str:
        return "re: " + request.messages[-1].text  # type: ignore[union-attr]

    store_1, store_2 = two_stores(backend)
    slow_worker, quick_worker = (
        ai_service(
            Chat,
            model=ScriptedChatModel(default=answer),
            chat_memory_provider=MessageWindowChatMemory.provider(max_messages=3, store=store),
        )
        for answer, store in ((slow, store_1), (quick, store_2))
    )
    quick_worker.chat("ann", "hello")
    first = threading.Thread(target=slow_worker.chat, args=("ann", "slow question"))
    first.start()
    assert asked.wait(10)
    quick_worker.chat("ann", "quick question")
    stored.set()
    first.join(10)
    window = store_1.get_messages("ann")
    assert [getattr(m, "text", None) for m in window] == [
        "re: quick question",
        "slow question",
        "slow answer",
    ]


class Refusing(InMemoryChatMemoryStore):
    """Refuses every checked write, as if other writers always got in first."""

    refusals = 0

    def apply_changes(
        self, memory_id: Any, *, appended: Any, removed: Any, since: Any = None
    ) -> int:
        if since is not None:
            self.refusals += 1
            raise ConcurrentChangeError(memory_id)
        return super().apply_changes(memory_id, appended=appended, removed=removed)


def test_an_add_refused_again_and_again_gives_up_and_stores_nothing() -> None:
    store = Refusing()
    memory = MessageWindowChatMemory(3, id="c", store=store)
    with pytest.raises(ConcurrentChangeError, match="changed by another writer"):
        memory.add(*turn(0))
    assert store.refusals == 101  # the first plan and 100 more
    assert store.get_messages("c") == []

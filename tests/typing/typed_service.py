"""Checked by mypy in CI: a service is typed as its interface, and wrong calls are errors.

Each ``# type: ignore[code]`` below marks a call mypy must reject; with
``warn_unused_ignores`` an accepted wrong call fails the check.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable, Iterator
from typing import Annotated, Protocol, assert_type

from pydantic import BaseModel

from aiservices import (
    AiMessage,
    ChatMemory,
    ChatMemoryAccess,
    ChatMemoryProvider,
    ChatMessage,
    ChatRequest,
    EventStream,
    GuardrailError,
    MemoryId,
    MessageWindowChatMemory,
    Result,
    StreamEvent,
    SystemMessage,
    TextDelta,
    TextStream,
    TurnCompleted,
    UserMessage,
    ai_service,
    guardrails,
    system_message,
    tool,
    user_message,
)
from aiservices.testing import ScriptedChatModel


class Verdict(BaseModel):
    sentiment: str
    score: float


class Assistant(ChatMemoryAccess, Protocol):
    @system_message("You are a support agent for {{product}}.")
    def chat(self, user: Annotated[str, MemoryId], message: str, product: str) -> str: ...

    @user_message("Classify the sentiment of: {{text}}")
    def classify(self, text: str) -> Verdict: ...

    @user_message("Classify: {{text}}")
    def classify_with_usage(self, text: str) -> Result[Verdict]: ...

    async def achat(self, user: Annotated[str, MemoryId], message: str, product: str) -> str: ...

    def stream(self, user: Annotated[str, MemoryId], message: str) -> Iterator[str]: ...

    def stream_with_usage(self, user: Annotated[str, MemoryId], message: str) -> TextStream: ...

    async def astream(self, user: Annotated[str, MemoryId], message: str) -> AsyncIterator[str]: ...

    def events(self, user: Annotated[str, MemoryId], message: str) -> Iterator[StreamEvent]: ...

    def typed_events(self, user: Annotated[str, MemoryId], message: str) -> EventStream: ...

    @guardrails(input=[lambda text: None])
    def guarded(self, text: str) -> str: ...


@tool
def add(a: int, b: int) -> int:
    """Add."""
    return a + b


@tool(name="mul")
async def multiply(a: int, b: int) -> int:
    """Multiply."""
    return a * b


assert_type(add(1, 2), int)


bot = ai_service(
    Assistant,
    model=ScriptedChatModel(default="ok"),
    chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
)
assert_type(bot, Assistant)
assert_type(bot.chat("alice", "Hi", product="Acme"), str)
assert_type(bot.classify("great"), Verdict)
assert_type(bot.classify_with_usage("great").content, Verdict)
assert_type(bot.get_chat_memory("alice"), ChatMemory)


async def use_async() -> str:
    answer = await bot.achat("alice", "Hi", product="Acme")
    assert_type(answer, str)
    assert_type(await multiply(2, 3), int)
    chunks = [chunk async for chunk in await bot.astream("alice", "Hi")]
    assert_type(chunks, list[str])
    return answer


for chunk in bot.stream("alice", "Hi"):
    assert_type(chunk, str)
streamed = bot.stream_with_usage("alice", "Hi")
if streamed.result is not None:
    assert_type(streamed.result.content, str)


for event in bot.events("alice", "Hi"):
    if isinstance(event, TextDelta):
        assert_type(event.text, str)
    elif isinstance(event, TurnCompleted):
        assert_type(event.result, Result[str])
with bot.typed_events("alice", "Hi") as typed_events:
    assert_type(next(typed_events), StreamEvent)
    if typed_events.result is not None:
        assert_type(typed_events.result.content, str)
assert_type(bot.guarded("hi"), str)


def refuse_insults(message: AiMessage) -> str | None:
    if message.text and "stupid" in message.text:
        raise GuardrailError("insult")
    return None


class Plain(Protocol):
    def chat(self, text: str) -> str: ...


guarded_bot = ai_service(
    Plain,
    model=ScriptedChatModel(default="ok"),
    output_guardrails=[refuse_insults],
    retriever=lambda query, memory_id: [f"about {query}"],
)
assert_type(guarded_bot, Plain)

# testing.md's echo: a callable reply may answer with a message's text, which may be None.
echo = ScriptedChatModel(default=lambda request: request.messages[-1].text)
assert_type(ai_service(Plain, model=echo), Plain)

memory_id: Hashable = "alice"
bot.evict_chat_memory(memory_id)


# The options take what runs: functions typed for the interface's own memory ids, a tool
# provider that returns None for no tools, a retriever written as a generator.
def memory_for(user: str) -> ChatMemory:
    return MessageWindowChatMemory(20, id=user)


def system_for(user: str) -> str | None:
    return f"You talk to {user}."


def tools_for(user: str, message: UserMessage) -> list[object] | None:
    return [add] if message.text and "sum" in message.text else None


def search(query: str, user: str) -> Iterator[str]:
    yield f"about {query}"


async def asearch(query: str, user: str) -> list[str]:
    return [f"about {query}"]


def dated(request: ChatRequest, user: str) -> ChatRequest:
    return request


def seed(user: str) -> list[SystemMessage]:
    return [SystemMessage(f"You talk to {user}.")]


async def aseed(user: str) -> list[ChatMessage]:
    return []


assert_type(
    ai_service(
        Assistant,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=memory_for,
        tool_provider=tools_for,
        retriever=search,
        request_transformer=dated,
        seed_memory=seed,
    ),
    Assistant,
)
assert_type(
    ai_service(
        Plain,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=memory_for,
        system_message_provider=system_for,
        retriever=asearch,
        seed_memory=aseed,
    ),
    Plain,
)


provider_alias: ChatMemoryProvider = memory_for  # a provider typed by the ids it is given


def search_by_query(query: str) -> list[str]:
    return [query]


def numbers(query: str, user: str) -> list[int]:
    return [1]


def no_text(user: str) -> int:
    return 1


ai_service(Plain, model=echo, retriever=search_by_query)  # type: ignore[arg-type]
ai_service(Plain, model=echo, retriever=numbers)  # type: ignore[arg-type]
ai_service(Plain, model=echo, system_message_provider=no_text)  # type: ignore[arg-type]
ai_service(Plain, model=echo, tool_provider=memory_for)  # type: ignore[arg-type]

bot.chat("alice", "Hi")  # type: ignore[call-arg]
bot.chat("alice", 42, product="Acme")  # type: ignore[arg-type]
_ = bot.classify("x").nope  # type: ignore[attr-defined]
bot.missing_method()  # type: ignore[attr-defined]

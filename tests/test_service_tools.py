"""Tool-calling services: the loop, what is recorded, recoverable errors, limits, direct returns."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Annotated, Protocol

import pytest
from pydantic import BaseModel

from aiservices import (
    AiMessage,
    ChatMemoryAccess,
    MemoryId,
    MessageWindowChatMemory,
    OutputParseError,
    Result,
    ToolExecutionResultMessage,
    ToolLimitError,
    UserMessage,
    ai_service,
    tool,
)
from aiservices.messages import ToolExecutionRequest
from aiservices.testing import ScriptedChatModel, tool_call, tool_calls
from aiservices.tools import ToolExecutionError


class Bot(ChatMemoryAccess, Protocol):
    def chat(self, user: Annotated[str, MemoryId], text: str) -> Result[str]: ...


class ABot(ChatMemoryAccess, Protocol):
    async def chat(self, user: Annotated[str, MemoryId], text: str) -> Result[str]: ...


class Orders:
    """An object whose @tool methods become tools bound to it."""

    def __init__(self) -> None:
        self.looked_up: list[str] = []

    @tool
    def lookup(self, order_id: str) -> dict[str, str]:
        """Find an order's status."""
        self.looked_up.append(order_id)
        return {"order": order_id, "status": "shipped"}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def divide(a: float, b: float) -> float:
    """Divide a by b."""
    return a / b


def service(model: ScriptedChatModel, tools: list[object], **options: object) -> Bot:
    return ai_service(
        Bot,
        model=model,
        tools=tools,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=50),
        **options,  # type: ignore[arg-type]
    )


def test_two_round_tool_call_records_every_step_in_order() -> None:
    orders = Orders()
    model = ScriptedChatModel(
        tool_call("lookup", order_id="A1"),
        tool_call("add", a=2, b=3),
        "Order A1 shipped; 2 + 3 = 5.",
    )
    bot = service(model, [orders, add])
    result = bot.chat("u", "Where is A1, and what is 2 + 3?")
    assert result.content == "Order A1 shipped; 2 + 3 = 5."
    assert orders.looked_up == ["A1"]
    messages = bot.get_chat_memory("u").messages()
    kinds = [type(m).__name__ for m in messages]
    assert kinds == [
        "UserMessage",
        "AiMessage",
        "ToolExecutionResultMessage",
        "AiMessage",
        "ToolExecutionResultMessage",
        "AiMessage",
    ]
    first_request = messages[1].tool_execution_requests[0]  # type: ignore[union-attr]
    assert messages[2] == ToolExecutionResultMessage(
        first_request.id, "lookup", '{"order":"A1","status":"shipped"}'
    )
    assert messages[4].text == "5"
    assert len({m.turn_id for m in messages}) == 1
    assert [e.result for e in result.tool_executions] == ['{"order":"A1","status":"shipped"}', "5"]
    # the second request showed the model the first round
    assert [type(m).__name__ for m in model.requests[1].messages] == kinds[:3]
    assert [t.name for t in model.requests[0].tools] == ["lookup", "add"]


def test_a_raising_tool_reports_the_error_to_the_model_and_the_loop_goes_on() -> None:
    model = ScriptedChatModel(tool_call("divide", a=1, b=0), "You cannot divide by zero.")
    bot = service(model, [divide])
    result = bot.chat("u", "1/0?")
    assert result.content == "You cannot divide by zero."
    sent = model.requests[1].messages[-1]
    assert isinstance(sent, ToolExecutionResultMessage)
    assert "ZeroDivisionError" in sent.text
    assert "division by zero" in sent.text
    assert isinstance(result.tool_executions[0].error, ToolExecutionError)


def test_malformed_arguments_and_made_up_names_go_back_to_the_model() -> None:
    bad_json = AiMessage(tool_execution_requests=[ToolExecutionRequest("c1", "add", "{not json")])
    model = ScriptedChatModel(
        bad_json,
        tool_call("add", a="one", b=2),
        tool_call("multiply", a=1),
        "giving up",
        check_tools=False,
    )
    bot = service(model, [add, divide])
    bot.chat("u", "compute")
    texts = [r.messages[-1].text for r in model.requests[1:]]
    assert "add" in texts[0]
    assert "JSON" in texts[0]
    assert "a:" in texts[1]
    assert "integer" in texts[1]
    assert "multiply" in texts[2]
    assert "add, divide" in texts[2]


def test_error_handler_can_turn_tool_errors_into_exceptions_and_memory_is_unchanged() -> None:
    class Abort(Exception):
        pass

    def handler(error: ToolExecutionError, request: ToolExecutionRequest) -> str:
        raise Abort(f"{error.kind}: {request.name}")

    model = ScriptedChatModel(tool_call("divide", a=1, b=0))
    bot = service(model, [divide], tool_error_handler=handler)
    with pytest.raises(Abort, match="raised: divide"):
        bot.chat("u", "1/0?")
    assert bot.get_chat_memory("u").messages() == []


def test_tool_limit_raises_without_running_the_tools_and_leaves_memory_unchanged() -> None:
    orders = Orders()
    model = ScriptedChatModel(default=lambda request: tool_call("lookup", order_id="X"))
    bot = service(model, [orders], max_tool_invocations=3)
    with pytest.raises(ToolLimitError) as info:
        bot.chat("u", "loop forever")
    assert info.value.limit == 3
    assert len(orders.looked_up) == 3
    assert len(model.requests) == 4
    assert bot.get_chat_memory("u").messages() == []


def test_zero_tool_invocations_refuses_the_first_tool_answer() -> None:
    orders = Orders()
    bot = service(
        ScriptedChatModel(tool_call("lookup", order_id="X")), [orders], max_tool_invocations=0
    )
    with pytest.raises(ToolLimitError):
        bot.chat("u", "x")
    assert orders.looked_up == []


def test_memory_id_is_injected_into_tools_and_hidden_from_the_model() -> None:
    seen: list[str] = []

    @tool
    def whoami(user: Annotated[str, MemoryId]) -> str:
        """Who is asking."""
        seen.append(user)
        return user

    model = ScriptedChatModel(tool_call("whoami"), "done")
    bot = service(model, [whoami])
    bot.chat("carol", "who am I?")
    assert seen == ["carol"]
    assert model.requests[0].tools[0].parameters["properties"] == {}


class Quote(BaseModel):
    symbol: str
    price: float


def test_return_direct_returns_the_tool_result_without_another_model_round() -> None:
    @tool(return_direct=True)
    def quote(symbol: str) -> Quote:
        """Current price."""
        return Quote(symbol=symbol, price=10.5)

    class Prices(Protocol):
        def price(self, text: str) -> Quote: ...

    model = ScriptedChatModel(tool_call("quote", symbol="ACME"))
    memory = MessageWindowChatMemory(10)
    bot = ai_service(Prices, model=model, tools=[quote], chat_memory=memory)
    assert bot.price("ACME?") == Quote(symbol="ACME", price=10.5)
    assert len(model.requests) == 1
    assert [type(m).__name__ for m in memory.messages()] == [
        "UserMessage",
        "AiMessage",
        "ToolExecutionResultMessage",
    ]


def test_a_direct_return_result_that_does_not_parse_is_an_output_parse_error() -> None:
    # No model wrote the text, so none is asked again: the caller gets the parse error
    # with the tool's text, and the turn is not recorded.
    @tool(return_direct=True)
    def stock(item: str) -> str:
        """Items in stock."""
        return "unknown item"

    class Shop(Protocol):
        def count(self, text: str) -> int: ...

    model = ScriptedChatModel(tool_call("stock", item="bolts"), "never asked")
    memory = MessageWindowChatMemory(10)
    bot = ai_service(Shop, model=model, tools=[stock], chat_memory=memory)
    with pytest.raises(OutputParseError, match=r"tool\(s\) stock .* as int") as raised:
        bot.count("how many bolts?")
    assert raised.value.raw_text == "unknown item"
    assert raised.value.attempts == 1
    assert "Answer again" not in str(raised.value)
    assert len(model.requests) == 1
    assert memory.messages() == []


def test_several_direct_results_are_one_list_or_go_to_the_model() -> None:
    @tool(return_direct=True)
    def quote(symbol: str) -> Quote:
        """Current price."""
        return Quote(symbol=symbol, price=10.5)

    @tool(return_direct=True)
    def note(symbol: str) -> str:
        """A note on a symbol."""
        return f"{symbol} is {{quiet}}"

    class Prices(Protocol):
        def prices(self, text: str) -> list[Quote]: ...

        def notes(self, text: str) -> list[str]: ...

        def price(self, text: str) -> Quote: ...

        def remark(self, text: str) -> str | None: ...

    both = tool_calls(("quote", {"symbol": "A"}), ("quote", {"symbol": "B"}))
    model = ScriptedChatModel(
        both,
        tool_calls(("note", {"symbol": "A"}), ("note", {"symbol": "B"})),
        both,
        '{"symbol": "A", "price": 1}',
    )
    bot = ai_service(Prices, model=model, tools=[quote, note])
    assert bot.prices("A and B?") == [Quote(symbol="A", price=10.5), Quote(symbol="B", price=10.5)]
    assert bot.notes("A and B?") == ["A is {quiet}", "B is {quiet}"]
    assert len(model.requests) == 2
    # Two quotes are not one: no result is dropped, the model answers from both.
    assert bot.price("A or B?") == Quote(symbol="A", price=1)
    assert len(model.requests) == 4
    assert [m.text for m in model.requests[3].messages[-2:]] == [
        '{"symbol":"A","price":10.5}',
        '{"symbol":"B","price":10.5}',
    ]
    # A type that takes any text takes their texts, as a str method does.
    model.add_replies(tool_calls(("note", {"symbol": "A"}), ("note", {"symbol": "B"})))
    assert bot.remark("A and B?") == "A is {quiet}\nB is {quiet}"
    # One result for a list is its one item, as several are its items.
    model.add_replies(tool_call("quote", symbol="C"))
    assert bot.prices("C?") == [Quote(symbol="C", price=10.5)]


def test_tool_provider_adds_tools_per_call() -> None:
    @tool
    def secret(user: Annotated[str, MemoryId]) -> str:
        """The caller's secret."""
        return f"secret of {user}"

    def provider(memory_id: object, message: UserMessage) -> list[object]:
        return [secret] if "secret" in message.text else []

    model = ScriptedChatModel("plain", tool_call("secret"), "told")
    bot = service(model, [add], tool_provider=provider)
    bot.chat("dan", "hello")
    assert [t.name for t in model.requests[0].tools] == ["add"]
    result = bot.chat("dan", "tell me my secret")
    assert [t.name for t in model.requests[1].tools] == ["add", "secret"]
    assert result.tool_executions[0].result == "secret of dan"


def test_a_tool_provider_may_return_none_for_no_tools_and_nothing_else() -> None:
    model = ScriptedChatModel("plain", "again")
    bot = service(model, [add], tool_provider=lambda memory_id, message: None)
    bot.chat("dan", "hello")
    assert [t.name for t in model.requests[0].tools] == ["add"]
    wrong = service(model, [add], tool_provider=lambda memory_id, message: 42)
    with pytest.raises(TypeError, match=r"tool_provider returned int for the memory id 'dan'"):
        wrong.chat("dan", "hello")
    assert len(model.requests) == 1  # refused before the model was called


@pytest.mark.parametrize("given", ["add", b"add", {"add": add}], ids=["str", "bytes", "dict"])
def test_a_tool_provider_returning_text_or_a_mapping_is_refused(given: object) -> None:
    model = ScriptedChatModel("plain")
    bot = service(model, [add], tool_provider=lambda memory_id, message: given)
    with pytest.raises(TypeError, match=r"tool_provider returned"):
        bot.chat("dan", "hello")
    assert model.requests == []


def test_an_async_tool_error_handler_fails_the_build() -> None:
    async def handler(error: Exception, request: object) -> str:
        return "no"

    from aiservices import InterfaceError

    with pytest.raises(InterfaceError, match=r"tool_error_handler=.*handler is async"):
        service(ScriptedChatModel("x"), [add], tool_error_handler=handler)


def test_an_async_generator_is_refused_as_a_tool() -> None:
    from collections.abc import AsyncIterator

    from aiservices import InterfaceError, Tool

    @tool
    async def search(q: str) -> AsyncIterator[str]:
        """Stream hits."""
        yield "hit"

    with pytest.raises(InterfaceError, match=r"an async generator can't be a tool"):
        service(ScriptedChatModel("x"), [search])

    async def raw(**arguments: object) -> AsyncIterator[str]:
        yield "hit"

    with pytest.raises(TypeError, match=r"an async generator can't be a tool"):
        Tool("raw", "", {"type": "object", "properties": {}}, raw)


async def test_parallel_async_tools_run_concurrently_and_are_recorded_in_request_order() -> None:
    @tool
    async def slow(name: str) -> str:
        """Sleep, then answer."""
        await asyncio.sleep(0.1)
        return f"hello {name}"

    model = ScriptedChatModel(tool_calls(("slow", {"name": "a"}), ("slow", {"name": "b"})), "ok")
    bot = ai_service(
        ABot,
        model=model,
        tools=[slow],
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=50),
    )
    started = time.perf_counter()
    result = await bot.chat("u", "greet both")
    elapsed = time.perf_counter() - started
    assert elapsed < 0.18
    assert [e.result for e in result.tool_executions] == ["hello a", "hello b"]
    messages = bot.get_chat_memory("u").messages()
    assert [m.text for m in messages if isinstance(m, ToolExecutionResultMessage)] == [
        "hello a",
        "hello b",
    ]


def test_sync_calls_run_parallel_requests_in_order() -> None:
    calls: list[str] = []

    @tool
    def record(name: str) -> str:
        """Record a name."""
        calls.append(name)
        return name

    model = ScriptedChatModel(
        tool_calls(("record", {"name": "1"}), ("record", {"name": "2"}), ("record", {"name": "3"})),
        "ok",
    )
    service(model, [record]).chat("u", "go")
    assert calls == ["1", "2", "3"]


def _asking(*calls: tuple[str, str, dict[str, object]]) -> AiMessage:
    """An answer asking for tools under the ids given (a compatible server's own)."""
    import json

    return AiMessage(
        tool_execution_requests=[
            ToolExecutionRequest(call_id, name, json.dumps(arguments))
            for call_id, name, arguments in calls
        ]
    )


def test_tool_calls_sharing_an_id_are_told_apart_before_they_run() -> None:
    # Some compatible servers give parallel calls one id, or number the calls of each answer
    # afresh; providers refuse two calls with one id, and a result could not say which call
    # it answers.
    model = ScriptedChatModel(
        _asking(("call_0", "add", {"a": 1, "b": 2}), ("call_0", "add", {"a": 3, "b": 4})),
        "3 and 7.",
        _asking(("call_0", "add", {"a": 5, "b": 6})),
        "11.",
    )
    bot = service(model, [add])
    first = bot.chat("u", "1+2, 3+4?")
    ids = [e.request.id for e in first.tool_executions]
    assert ids[0] == "call_0"
    assert ids[1].startswith("call_0_")
    assert ids[1] != "call_0"
    asked = model.requests[1].messages[1].tool_execution_requests  # type: ignore[union-attr]
    answered = [(m.id, m.text) for m in model.requests[1].messages[2:]]  # type: ignore[union-attr]
    assert [r.id for r in asked] == ids
    assert answered == [(ids[0], "3"), (ids[1], "7")]
    bot.chat("u", "5+6?")
    # An id the conversation holds already is renamed too, in what runs and what is kept.
    stored = bot.get_chat_memory("u").messages()
    all_ids = [r.id for m in stored if isinstance(m, AiMessage) for r in m.tool_execution_requests]
    assert len(all_ids) == len(set(all_ids)) == 3
    results = [m for m in stored if isinstance(m, ToolExecutionResultMessage)]
    assert [m.id for m in results] == all_ids
    assert [m.text for m in results] == ["3", "7", "11"]


def test_duplicate_tool_names_fail_the_build() -> None:
    from aiservices import InterfaceError

    @tool(name="add")
    def other(a: int) -> int:
        """Another add."""
        return a

    with pytest.raises(InterfaceError, match="add"):
        service(ScriptedChatModel(), [add, other])


async def test_a_cancelled_call_holds_its_conversation_until_its_sync_tool_has_ended() -> None:
    # A thread cannot be stopped: the next call on the id must not run its tools beside it.
    started, release = threading.Event(), threading.Event()
    ran: list[int] = []

    @tool
    def transfer(amount: int) -> str:
        """Move money."""
        ran.append(amount)
        started.set()
        release.wait(5)
        return "done"

    class Bank(ChatMemoryAccess, Protocol):
        async def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    model = ScriptedChatModel(
        tool_call("transfer", amount=1), tool_call("transfer", amount=2), "sent"
    )
    bot = ai_service(
        Bank,
        model=model,
        tools=[transfer],
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
    )
    first = asyncio.create_task(bot.chat("alice", "send 1"))
    assert await asyncio.to_thread(started.wait, 5)
    first.cancel()
    second = asyncio.create_task(bot.chat("alice", "send 2"))
    await asyncio.sleep(0.1)
    assert not first.done(), "the cancelled call returned while its tool still ran"
    assert ran == [1]
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await second == "sent"
    assert ran == [1, 2]
    assert bot.get_chat_memory("alice").messages()[0].text == "send 2"


def test_a_tool_call_cut_at_the_token_limit_ends_the_call_at_once() -> None:
    # Its arguments may be cut short: asking again under the same cap would cut them again,
    # one paid round after another, up to the tool limit.
    from aiservices import IncompleteResponseError
    from aiservices.models import ChatResponse

    ran: list[str] = []

    @tool
    def save(text: str) -> str:
        """Save a text."""
        ran.append(text)
        return "saved"

    cut = ChatResponse(
        AiMessage(tool_execution_requests=[ToolExecutionRequest("c1", "save", '{"text": "lo')]),
        finish_reason="length",
    )
    model = ScriptedChatModel(cut, cut, "done")
    bot = service(model, [save])
    with pytest.raises(IncompleteResponseError, match="finish_reason='length'"):
        bot.chat("dan", "save a long text")
    assert len(model.requests) == 1
    assert ran == []
    assert bot.get_chat_memory("dan").messages() == []


def test_a_tool_choice_naming_no_tool_of_the_service_fails_the_build() -> None:
    from aiservices import InterfaceError
    from aiservices.models import ChatRequestParameters

    with pytest.raises(InterfaceError, match=r"tool_choice='wether' names no tool.*'add'"):
        service(
            ScriptedChatModel("x"), [add], parameters=ChatRequestParameters(tool_choice="wether")
        )
    service(ScriptedChatModel("x"), [add], parameters=ChatRequestParameters(tool_choice="add"))
    # Tools a provider gives per call may be the one named.
    service(
        ScriptedChatModel("x"),
        [add],
        parameters=ChatRequestParameters(tool_choice="later"),
        tool_provider=lambda memory_id, message: [],
    )

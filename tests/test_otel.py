"""OpenTelemetry spans, checked with the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Protocol

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import BaseModel

from aiservices import MemoryId, MessageWindowChatMemory, OutputParseError, ai_service, tool
from aiservices.models import TokenUsage
from aiservices.otel import OpenTelemetryListener
from aiservices.testing import ScriptedChatModel, tool_call, tool_calls


class Bot(Protocol):
    def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...


@tool
def double(n: int) -> int:
    """Twice n."""
    return 2 * n


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def make(model: ScriptedChatModel, exporter: InMemorySpanExporter) -> Bot:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return ai_service(
        Bot,
        model=model,
        tools=[double],
        listeners=[OpenTelemetryListener(tracer_provider=provider)],
        chat_memory_provider=MessageWindowChatMemory.provider(),
    )


def test_spans_follow_the_genai_conventions(exporter: InMemorySpanExporter) -> None:
    model = ScriptedChatModel(
        tool_call("double", n=21), "42", usage=TokenUsage(10, 5), model_name="gpt-test"
    )
    make(model, exporter).chat("ann", "double 21")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"invoke_agent Bot.chat", "chat gpt-test", "execute_tool double"}
    call = spans["invoke_agent Bot.chat"]
    assert call.attributes["gen_ai.conversation.id"] == "ann"
    assert call.attributes["gen_ai.usage.input_tokens"] == 20
    assert call.attributes["gen_ai.usage.output_tokens"] == 10
    chats = [s for s in exporter.get_finished_spans() if s.name == "chat gpt-test"]
    assert len(chats) == 2
    assert chats[0].attributes["gen_ai.request.model"] == "gpt-test"
    assert chats[0].attributes["gen_ai.usage.input_tokens"] == 10
    assert chats[0].attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert all(s.parent is not None and s.parent.span_id == call.context.span_id for s in chats)
    tool_span = spans["execute_tool double"]
    assert tool_span.attributes["gen_ai.tool.name"] == "double"


def test_a_failed_call_ends_its_spans_with_an_error(exporter: InMemorySpanExporter) -> None:
    bot = make(ScriptedChatModel(ConnectionError("down")), exporter)
    with pytest.raises(ConnectionError):
        bot.chat("ann", "hi")
    spans = exporter.get_finished_spans()
    assert {s.name for s in spans} == {"invoke_agent Bot.chat", "chat scripted"}
    assert all(s.status.status_code is StatusCode.ERROR for s in spans)


def test_a_failed_call_reports_the_usage_of_the_rounds_it_paid_for(
    exporter: InMemorySpanExporter,
) -> None:
    # A tool round, then an answer that does not parse and one more that does not: three
    # rounds billed, and the call failed.
    class Counter(Protocol):
        def count(self, text: str) -> int: ...

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    model = ScriptedChatModel(tool_call("double", n=21), "many", "lots", usage=TokenUsage(100, 10))
    bot = ai_service(
        Counter,
        model=model,
        tools=[double],
        max_output_retries=1,
        listeners=[OpenTelemetryListener(tracer_provider=provider)],
    )
    with pytest.raises(OutputParseError):
        bot.count("how many?")
    call = next(s for s in exporter.get_finished_spans() if s.name.startswith("invoke_agent"))
    assert call.status.status_code is StatusCode.ERROR
    assert call.attributes is not None
    assert call.attributes["gen_ai.usage.input_tokens"] == 300
    assert call.attributes["gen_ai.usage.output_tokens"] == 30


class Teller(Protocol):
    def tell(self, user: Annotated[str, MemoryId], text: str) -> Iterator[str]: ...

    def atell(self, user: Annotated[str, MemoryId], text: str) -> AsyncIterator[str]: ...


async def _cancelled_while_reading(bot: Teller) -> None:
    # A web client that disconnects: the server cancels the task reading the stream.
    async def read() -> None:
        async for _ in bot.atell("ann", "a story"):
            pass

    task = asyncio.create_task(read())
    await asyncio.sleep(0.05)  # the model is still thinking
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("how", ["closed", "cancelled"])
def test_a_stream_its_reader_stops_is_no_failure(exporter: InMemorySpanExporter, how: str) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    bot = ai_service(
        Teller,
        model=ScriptedChatModel("once upon a time", delay=5 if how == "cancelled" else 0),
        listeners=[OpenTelemetryListener(tracer_provider=provider)],
        chat_memory_provider=MessageWindowChatMemory.provider(),
    )
    if how == "closed":
        stream = bot.tell("ann", "a story")
        next(stream)
        stream.close()  # a "stop" button
        name = "invoke_agent Teller.tell"
    else:
        asyncio.run(_cancelled_while_reading(bot))
        name = "invoke_agent Teller.atell"
    spans = exporter.get_finished_spans()
    assert {s.name for s in spans} == {name, "chat scripted"}
    for span in spans:
        assert span.status.status_code is StatusCode.UNSET
        assert span.attributes is not None
        assert span.attributes["aiservices.stream.closed_early"] is True
        assert "error.type" not in span.attributes
        assert not span.events  # no exception recorded


def test_a_call_that_dies_in_its_tools_marks_their_internal_spans_as_failed_first(
    exporter: InMemorySpanExporter,
) -> None:
    class Fatal(Exception):
        pass

    def give_up(error: Exception, request: object) -> str:
        raise Fatal from error

    @tool
    def boom() -> str:
        """Fails."""
        raise ValueError("no")

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    bot = ai_service(
        Bot,
        model=ScriptedChatModel(tool_calls(("boom", {}), ("double", {"n": 1})), "unreached"),
        tools=[boom, double],
        tool_error_handler=give_up,
        listeners=[OpenTelemetryListener(tracer_provider=provider)],
        chat_memory_provider=MessageWindowChatMemory.provider(),
    )
    with pytest.raises(Fatal):
        bot.chat("ann", "hi")
    spans = exporter.get_finished_spans()
    call = next(s for s in spans if s.name.startswith("invoke_agent"))
    for span in spans:
        if span.name.startswith("execute_tool"):
            assert span.kind is SpanKind.INTERNAL  # (the conventions' kind for a tool)
            assert spans.index(span) < spans.index(call)  # no span ends after its parent
    (tool_span,) = [s for s in exporter.get_finished_spans() if s.name == "execute_tool boom"]
    assert tool_span.status.status_code is StatusCode.ERROR
    assert tool_span.attributes is not None
    assert tool_span.attributes["error.type"] == "Fatal"


def test_a_tool_span_times_its_own_tool(exporter: InMemorySpanExporter) -> None:
    @tool
    def slow() -> str:
        """Takes a while."""
        import time

        time.sleep(0.05)
        return "slow"

    @tool
    def fast() -> str:
        """At once."""
        return "fast"

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    two = tool_calls(("slow", {}), ("fast", {}))
    bot = ai_service(
        Bot,
        model=ScriptedChatModel(two, "done"),
        tools=[slow, fast],
        listeners=[OpenTelemetryListener(tracer_provider=provider)],
        chat_memory_provider=MessageWindowChatMemory.provider(),
    )
    bot.chat("ann", "go")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    slow_span, fast_span = spans["execute_tool slow"], spans["execute_tool fast"]
    assert slow_span.end_time is not None
    assert fast_span.start_time is not None
    # A sync call runs them one after another: each span holds its tool's run only.
    assert slow_span.end_time <= fast_span.start_time


def test_two_tool_requests_with_one_id_each_end_their_span(
    exporter: InMemorySpanExporter,
) -> None:
    from aiservices import AiMessage, ToolExecutionRequest

    twins = AiMessage(
        tool_execution_requests=[
            ToolExecutionRequest("same", "double", '{"n": 1}'),
            ToolExecutionRequest("same", "double", '{"n": 2}'),
        ]
    )

    class ABot(Protocol):
        async def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    bot = ai_service(
        ABot,
        model=ScriptedChatModel(twins, "done"),
        tools=[double],
        listeners=[OpenTelemetryListener(tracer_provider=provider)],
        chat_memory_provider=MessageWindowChatMemory.provider(),
    )
    # An async call runs the two tools at once: both spans are open together.
    asyncio.run(bot.chat("a", "double them"))
    tools = [s for s in exporter.get_finished_spans() if s.name == "execute_tool double"]
    assert len(tools) == 2


class Patient(BaseModel):
    age: int


class Extractor(Protocol):
    def extract(self, text: str) -> Patient: ...


def test_a_failed_call_records_the_exceptions_type_and_no_content(
    exporter: InMemorySpanExporter,
) -> None:
    # An OutputParseError's message quotes the answer: no span may carry it.
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    secret = '{"age": "SECRET diagnosis"}'
    bot = ai_service(
        Extractor,
        model=ScriptedChatModel(secret, secret),
        listeners=[OpenTelemetryListener(tracer_provider=provider)],
        max_output_retries=1,
    )
    with pytest.raises(OutputParseError):
        bot.extract("...")
    spans = exporter.get_finished_spans()
    call = next(s for s in spans if s.name == "invoke_agent Extractor.extract")
    assert call.status.status_code is StatusCode.ERROR
    (event,) = call.events
    assert event.name == "exception"
    assert dict(event.attributes or {}) == {"exception.type": "aiservices.errors.OutputParseError"}
    for span in spans:
        for recorded in (span.attributes, *(e.attributes for e in span.events)):
            assert "SECRET" not in repr(dict(recorded or {}))

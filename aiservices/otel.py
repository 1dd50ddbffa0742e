"""OpenTelemetry spans for service calls, following the GenAI semantic conventions.

```python
from aiservices.otel import OpenTelemetryListener
bot = ai_service(Assistant, model=..., listeners=[OpenTelemetryListener()])
```

Each call is an ``invoke_agent {Interface.method}`` span; inside it, each model round is a
``chat {model}`` span and each tool run an ``execute_tool {name}`` span. Attributes:
``gen_ai.operation.name``, ``gen_ai.agent.name``, ``gen_ai.request.model``,
``gen_ai.conversation.id`` (the memory id), ``gen_ai.usage.input_tokens`` /
``gen_ai.usage.output_tokens``, ``gen_ai.response.finish_reasons``, ``gen_ai.tool.name``,
``gen_ai.tool.call.id``. No message content is recorded. Needs ``opentelemetry-api``
(``pip install "aiservices[otel]"``).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import TYPE_CHECKING, Any, Final

try:
    from opentelemetry import trace
    from opentelemetry.trace import Span, Status, StatusCode
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        'aiservices.otel needs OpenTelemetry: pip install "aiservices[otel]"'
    ) from exc

from .messages import ToolExecutionRequest
from .models import ChatRequest, ChatResponse, TokenUsage
from .observability import CallInfo

if TYPE_CHECKING:
    from .tools import ToolExecution

__all__ = ["OpenTelemetryListener", "observe_conversations"]

_CALL = "aiservices.otel.call"
_CHAT = "aiservices.otel.chat"
_TOOLS = "aiservices.otel.tools"
_USED = "aiservices.otel.usage"  # the usage of the call's rounds so far


def _usage(span: Span, usage: TokenUsage | None) -> None:
    if usage is None:
        return
    if usage.input_tokens is not None:
        span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
    if usage.output_tokens is not None:
        span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)


class OpenTelemetryListener:
    """Records spans for calls, model rounds and tool runs on ``tracer_provider``'s tracer."""

    def __init__(self, tracer_provider: Any = None) -> None:
        self.tracer = trace.get_tracer("aiservices", tracer_provider=tracer_provider)

    def _common(self, call: CallInfo) -> dict[str, Any]:
        attributes: dict[str, Any] = {"gen_ai.agent.name": call.method}
        if call.memory_id is not None:
            attributes["gen_ai.conversation.id"] = str(call.memory_id)
        if call.model_name:
            attributes["gen_ai.request.model"] = call.model_name
        return attributes

    def on_call_start(self, call: CallInfo) -> None:
        span = self.tracer.start_span(
            f"invoke_agent {call.method}",
            kind=trace.SpanKind.INTERNAL,
            attributes={"gen_ai.operation.name": "invoke_agent", **self._common(call)},
        )
        call.attributes[_CALL] = span

    def _child(
        self, call: CallInfo, name: str, attributes: dict[str, Any], kind: trace.SpanKind
    ) -> Span:
        parent = call.attributes.get(_CALL)
        context = trace.set_span_in_context(parent) if parent is not None else None
        return self.tracer.start_span(name, context=context, kind=kind, attributes=attributes)

    def on_request(self, call: CallInfo, request: ChatRequest) -> None:
        model = call.model_name or "model"
        call.attributes[_CHAT] = self._child(
            call,
            f"chat {model}",
            {"gen_ai.operation.name": "chat", **self._common(call)},
            trace.SpanKind.CLIENT,
        )

    def on_response(self, call: CallInfo, request: ChatRequest, response: ChatResponse) -> None:
        used = response.token_usage
        if used is not None:
            # A call that fails later was still billed for its rounds: its span says so.
            so_far: TokenUsage | None = call.attributes.get(_USED)
            call.attributes[_USED] = used if so_far is None else so_far + used
        span: Span | None = call.attributes.pop(_CHAT, None)
        if span is None:
            return
        _usage(span, used)
        if response.finish_reason:
            span.set_attribute("gen_ai.response.finish_reasons", [response.finish_reason])
        span.end()

    def on_tool_start(self, call: CallInfo, request: ToolExecutionRequest) -> None:
        spans = call.attributes.setdefault(_TOOLS, {})
        # By the request object: a model may give two requests one id.
        spans[id(request)] = self._child(
            call,
            f"execute_tool {request.name}",
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": request.name,
                "gen_ai.tool.call.id": request.id,
                **self._common(call),
            },
            trace.SpanKind.INTERNAL,  # (the conventions' kind: the tool runs in-process)
        )

    def on_tool_end(self, call: CallInfo, execution: ToolExecution) -> None:
        span: Span | None = call.attributes.get(_TOOLS, {}).pop(id(execution.request), None)
        if span is None:
            return
        if execution.error is not None:
            span.set_status(Status(StatusCode.ERROR, type(execution.error).__name__))
            span.set_attribute("error.type", type(execution.error).__name__)
        span.end()

    def on_call_end(self, call: CallInfo, result: Any) -> None:
        span: Span | None = call.attributes.pop(_CALL, None)
        used = call.attributes.pop(_USED, None)
        if span is None:
            return
        _usage(span, getattr(result, "token_usage", used))
        span.end()

    def on_error(self, call: CallInfo, error: BaseException) -> None:
        # A stream its reader closed before the end (a "stop" button, a web client gone,
        # whose task is cancelled) did not fail: its spans end without an error, marked as
        # closed early.
        closed = isinstance(error, GeneratorExit) or (
            call.streamed and isinstance(error, asyncio.CancelledError)
        )
        call_span: Span | None = call.attributes.pop(_CALL, None)
        # Innermost first, so that no span ends after its parent: the tools' (the call
        # ended in its tools, an error handler raised or it stopped), the round's, the call's.
        spans: list[Span] = [
            *call.attributes.pop(_TOOLS, {}).values(),
            *(span for span in (call.attributes.pop(_CHAT, None), call_span) if span),
        ]
        if call_span is not None:
            _usage(call_span, call.attributes.pop(_USED, None))
        kind = type(error)
        for span in spans:
            if closed:
                span.set_attribute("aiservices.stream.closed_early", True)
            else:
                # The exception's type only: its message may quote the answer or a tool's
                # arguments (an OutputParseError's does), and no content is recorded.
                span.add_event(
                    "exception", {"exception.type": f"{kind.__module__}.{kind.__qualname__}"}
                )
                span.set_status(Status(StatusCode.ERROR, kind.__name__))
                span.set_attribute("error.type", kind.__name__)
            span.end()


def observe_conversations(
    service: Any, *, meter_provider: Any = None, name: str | None = None
) -> None:
    """Report a service's conversations as OpenTelemetry metrics, read at each collection.

    Instruments (there are no GenAI semantic conventions for these; each carries
    ``gen_ai.agent.name``, the interface's name unless ``name`` is given):
    ``aiservices.conversations.cached`` (an up-down counter: memories cached now),
    ``aiservices.turns.committed``, ``aiservices.messages.evicted`` and
    ``aiservices.conversations.forgotten`` (counters since the service was built). They
    read ``service.conversation_stats()`` only when a reader collects: a call pays nothing.
    """
    from opentelemetry import metrics

    attributes = {"gen_ai.agent.name": name or type(service).__name__.removesuffix("Service")}
    # The global provider is one key whether it is set yet or not: instruments made on it
    # before the SDK is set up report through it after, and made again on the provider set
    # since, they would come back as those first ones, without a later service's callback.
    if meter_provider is None or meter_provider is metrics.get_meter_provider():
        key: Any = _GLOBAL
    else:
        key = meter_provider
    with _OBSERVING:
        observed = _OBSERVED.get(key)
        if observed is None:
            # One set of instruments per provider, reporting every service observed on it.
            observed = _OBSERVED[key] = []
            meter = metrics.get_meter(
                "aiservices", meter_provider=None if key is _GLOBAL else meter_provider
            )
            for kind, instrument, field, unit, description in _CONVERSATION_INSTRUMENTS:
                create = getattr(meter, f"create_observable_{kind}")
                callback = _reading(metrics.Observation, observed, field, kind == "counter")
                create(instrument, callbacks=[callback], unit=unit, description=description)
        # Held weakly: a service that is gone leaves only what its counters counted.
        stats = weakref.WeakMethod(service.conversation_stats)
        if all(stats != seen.stats for seen in observed):  # observed again: reported once
            observed.append(_Observed(stats, attributes))


class _Observed:
    """One service observed: its stats (held weakly), attributes, and last reading."""

    __slots__ = ("attributes", "last", "stats")

    def __init__(self, stats: Any, attributes: dict[str, str]) -> None:
        self.stats = stats
        self.attributes = attributes
        self.last: Any = None


class _Global:
    """The key of the global meter provider, set or not (held for ever by `_GLOBAL`)."""

    __slots__ = ("__weakref__",)


_GLOBAL: Final = _Global()
_OBSERVING: Final = threading.Lock()
# By meter provider, held weakly: a provider that is gone takes its instruments with it.
_OBSERVED: Final[weakref.WeakKeyDictionary[Any, list[_Observed]]] = weakref.WeakKeyDictionary()


def _reading(observation: Any, observed: list[_Observed], field: str, monotonic: bool) -> Any:
    def callback(options: Any) -> Any:
        totals: dict[tuple[tuple[str, str], ...], int] = {}
        for seen in list(observed):
            read = seen.stats()
            if read is not None:
                seen.last = read()
            elif not monotonic or seen.last is None:
                continue  # gone: it caches nothing
            # A counter keeps what a service that is gone had counted: never going down,
            # it is not taken for a reset. Services sharing attributes report one sum.
            key = tuple(sorted(seen.attributes.items()))
            totals[key] = totals.get(key, 0) + getattr(seen.last, field)
        for key, value in totals.items():
            yield observation(value, dict(key))

    return callback


# kind, name, ConversationStats field, unit, description
_CONVERSATION_INSTRUMENTS = (
    (
        "up_down_counter",
        "aiservices.conversations.cached",
        "cached_conversations",
        "{conversation}",
        "Conversations whose memory the service holds",
    ),
    (
        "counter",
        "aiservices.turns.committed",
        "turns_committed",
        "{turn}",
        "Turns recorded in a conversation's memory",
    ),
    (
        "counter",
        "aiservices.messages.evicted",
        "messages_evicted",
        "{message}",
        "Messages window memories removed from their window",
    ),
    (
        "counter",
        "aiservices.conversations.forgotten",
        "conversations_forgotten",
        "{conversation}",
        "Conversations erased (forget, a scope's exit)",
    ),
)

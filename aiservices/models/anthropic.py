"""``AnthropicChatModel``: a ``ChatModel`` on the ``anthropic`` SDK's Messages API.

Errors are the SDK's own (``anthropic.AuthenticationError``, ``anthropic.RateLimitError``,
...); retries and timeouts are the SDK's too. Also exports
`AnthropicTokenCountEstimator`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

try:
    import anthropic
    from anthropic.resources.messages import Messages
    from anthropic.types import Message
except ModuleNotFoundError as exc:  # pragma: no cover - exercised only without the extra
    from ._sdk import sdk_missing

    raise sdk_missing(exc, "anthropic") from exc

from ..errors import IncompleteResponseError
from ..messages import (
    AiMessage,
    ChatMessage,
    Reasoning,
    SystemMessage,
    ToolExecutionRequest,
    ToolExecutionResultMessage,
    UserMessage,
)
from . import ChatRequest, ChatResponse, ResponseFormat, TokenUsage, ToolSpecification
from ._anthropic_tokens import AnthropicTokenCountEstimator
from ._sdk import (
    SdkChatModel,
    Secret,
    cached,
    cached_each,
    check_choice,
    check_clients,
    check_http_package,
    check_model_name,
    check_sampling,
    check_transport,
    client_options,
    create_keywords,
    followed_client,
    merge_extra,
    plain,
    transport_errors_as,
)

if TYPE_CHECKING:
    # The SDK takes httpx or httpx2 clients; neither is imported unless a caller made one.
    import httpx
    import httpx2

__all__ = ["DEFAULT_MAX_TOKENS", "AnthropicChatModel", "AnthropicTokenCountEstimator"]

DEFAULT_MAX_TOKENS: Final = 4096
# Sent as the key to a base_url server when none is given: the SDK sends no request without.
GATEWAY_API_KEY: Final = "not-needed"
"""The answer-length cap sent when neither model nor request sets one (the API needs one)."""

_STOP_REASONS: Final[Mapping[str, str]] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}

# Keys that create() takes as keyword arguments; anything else (temperature, top_k, ... in
# SDK versions without them, or server-specific options) travels in extra_body.
_CREATE_KWARGS: Final = create_keywords(Messages.create)

_SDK: Final = (anthropic.Anthropic, anthropic.AsyncAnthropic)
_STRUCTURED_OUTPUT_MODES: Final = ("tool", "native", "off")
_OUTPUT_TOOL_DESCRIPTION: Final = (
    "Give your final answer by calling this tool; its input is the answer."
)


class AnthropicChatModel(SdkChatModel[anthropic.Anthropic, anthropic.AsyncAnthropic]):
    """A chat model served by Anthropic's Messages API.

    ``api_key`` defaults to ``ANTHROPIC_API_KEY`` (the SDK's own credential lookup applies).
    ``max_tokens`` caps each answer, `DEFAULT_MAX_TOKENS` unless set; a request's
    ``max_output_tokens`` overrides it, as its other parameters override ``temperature``,
    ``top_p`` and ``top_k``. ``extra`` is merged into every request (SDK keyword arguments
    as such, anything else into the request body). ``timeout`` and ``max_retries`` go to the
    SDK client (``None`` keeps the SDK's defaults).

    Typed answers (a request's ``response_format``): with ``structured_output="tool"`` (the
    default, for every Claude model) the schema becomes a tool the model is made to call, and
    that call's input, as JSON, is the answer's text; ``"native"`` uses the API's
    ``output_config.format`` for schemas that fit its strict rules (newer models only) and the
    tool otherwise; ``"off"`` sends nothing.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        timeout: float | httpx.Timeout | httpx2.Timeout | None = None,
        max_retries: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        default_headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
        structured_output: Literal["tool", "native", "off"] = "tool",
        client: anthropic.Anthropic | None = None,
        async_client: anthropic.AsyncAnthropic | None = None,
        http_client: httpx.Client | httpx2.Client | None = None,
        async_http_client: httpx.AsyncClient | httpx2.AsyncClient | None = None,
    ) -> None:
        check_model_name(model, "claude-sonnet-4-6")
        check_sampling(temperature, top_p)
        if top_k is not None and not (isinstance(top_k, int) and top_k > 0):
            raise ValueError(f"top_k must be a positive int, not {top_k!r}")
        if not (
            isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0
        ):
            raise ValueError(
                f"max_tokens must be a positive int (the API requires a cap), not {max_tokens!r}"
            )
        check_transport(max_retries, timeout)
        check_http_package(
            anthropic.DefaultHttpxClient,
            {
                "timeout": timeout,
                "http_client": http_client,
                "async_http_client": async_http_client,
            },
        )
        check_choice("structured_output", structured_output, _STRUCTURED_OUTPUT_MODES)
        check_clients(
            _SDK,
            client,
            async_client,
            {
                "api_key": api_key,
                "base_url": base_url,
                "timeout": timeout,
                "max_retries": max_retries,
                "default_headers": default_headers,
                "http_client": http_client,
                "async_http_client": async_http_client,
            },
        )
        self.model_name = model
        followed = followed_client(client, async_client)
        if base_url is None and followed is not None:
            base_url = str(followed.base_url)
        if api_key is None and followed is not None and followed.api_key:
            api_key = followed.api_key  # the client made follows the one handed in
        keyless = (
            api_key is None
            and (client is None or async_client is None)
            and (followed is None or not (followed.api_key or followed.auth_token))
            and not any(
                os.environ.get(name) for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
            )
        )
        if keyless:
            if base_url is None and not os.environ.get("ANTHROPIC_BASE_URL"):
                # Said now, as OpenAI's adapter says it: the SDK would say it only at the
                # first request, in words that name neither the option nor the variable.
                raise ValueError(
                    "no Anthropic API key: pass api_key=... or set ANTHROPIC_API_KEY (for a "
                    "gateway, pass base_url=... and its key or token)"
                )
            # A gateway or local server that needs no key: the SDK refuses to send a request
            # without one, so a placeholder goes, as OpenAI's adapter sends one.
            api_key = GATEWAY_API_KEY
        options = client_options(
            api_key,
            followed,
            default_headers=default_headers,
            base_url=base_url,
            timeout=timeout,
            max_retries=max_retries,
        )
        if api_key is None and followed is not None and followed.auth_token:
            # A gateway's bearer token instead of a key.
            options["auth_token"] = Secret(followed.auth_token)
        super().__init__(
            _SDK,
            client,
            async_client,
            base_url=base_url,
            options=options,
            http_client=http_client,
            async_http_client=async_http_client,
        )

        defaults: dict[str, Any] = {"max_tokens": max_tokens}
        for name, value in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k)):
            if value is not None:
                _put(defaults, name, value)
        if extra:
            merge_extra(defaults, extra, _CREATE_KWARGS)
        self._defaults = defaults
        self._structured_output = structured_output
        self._tool_cache: dict[int, tuple[ToolSpecification, dict[str, Any]]] = {}
        self._schema_cache: dict[int, tuple[ResponseFormat, dict[str, Any]]] = {}
        self._native_cache: dict[int, tuple[ResponseFormat, dict[str, Any]]] = {}

    # -- the ChatModel protocol ------------------------------------------------------------

    def chat(self, request: ChatRequest) -> ChatResponse:
        """Answer one request with a single Messages call.

        A request the SDK sends only as a stream (a ``max_tokens`` that may take longer than
        its 10-minute limit on a plain call) is streamed, and the answer gathered from it.
        """
        kwargs, output_tool = self._request(request)
        client = self._sync_client()
        try:
            message = client.messages.create(**kwargs)
        except ValueError as exc:
            if not _needs_stream(exc):
                raise
            acc = _StreamAccumulator(output_tool)
            with client.messages.create(**kwargs, stream=True) as events, _sdk_errors(events):
                for event in events:
                    acc.add(event)
            return acc.response()
        return _response(message, output_tool)

    async def achat(self, request: ChatRequest) -> ChatResponse:
        """The async form of `chat`."""
        kwargs, output_tool = self._request(request)
        client = self._async_client()
        try:
            message = await client.messages.create(**kwargs)
        except ValueError as exc:
            if not _needs_stream(exc):
                raise
            acc = _StreamAccumulator(output_tool)
            events = await client.messages.create(**kwargs, stream=True)
            async with events:
                with _sdk_errors(events):
                    async for event in events:
                        acc.add(event)
            return acc.response()
        return _response(message, output_tool)

    def stream(self, request: ChatRequest) -> Iterator[str | ChatResponse]:
        """Yield the answer's text deltas, then one ``ChatResponse`` with the whole answer.

        For a typed answer given through the output tool, the deltas are that tool's JSON.
        """
        kwargs, output_tool = self._request(request)
        kwargs["stream"] = True
        acc = _StreamAccumulator(output_tool)
        with self._sync_client().messages.create(**kwargs) as events, _sdk_errors(events):
            for event in events:
                text = acc.add(event)
                if text:
                    yield text
        yield acc.response()

    async def astream(self, request: ChatRequest) -> AsyncIterator[str | ChatResponse]:
        """The async form of `stream`."""
        kwargs, output_tool = self._request(request)
        kwargs["stream"] = True
        acc = _StreamAccumulator(output_tool)
        events = await self._async_client().messages.create(**kwargs)
        async with events:
            with _sdk_errors(events):
                async for event in events:
                    text = acc.add(event)
                    if text:
                        yield text
        yield acc.response()

    # -- request mapping -------------------------------------------------------------------

    def _request(self, request: ChatRequest) -> tuple[dict[str, Any], str | None]:
        kwargs = dict(self._defaults)  # _put() and merge_extra() copy what they change
        system, messages = _to_anthropic_messages(request.messages)
        kwargs["model"] = self.model_name
        kwargs["messages"] = messages
        if system is not None:
            kwargs["system"] = system
        tools = cached_each(self._tool_cache, request.tools, _to_anthropic_tool)
        output_tool: str | None = None
        native: dict[str, Any] | None = None
        fmt = request.response_format
        if fmt is not None and self._structured_output != "off":
            if self._structured_output == "native" and fmt.strict:
                native = {"type": "json_schema", "schema": self._native_schema(fmt)}
            else:
                output_tool = _output_tool_name(fmt, request.tools)
                tools.append(
                    {
                        "name": output_tool,
                        "description": _OUTPUT_TOOL_DESCRIPTION,
                        "input_schema": self._schema(fmt),
                    }
                )
                # With other tools on offer the model may call those first; "any" still rules
                # out a plain-text answer.
                kwargs["tool_choice"] = (
                    {"type": "any"} if request.tools else {"type": "tool", "name": output_tool}
                )
        p = request.parameters
        choice = p.tool_choice
        if request.tools and choice is not None:
            _check_choice(choice, request.tools)
            if output_tool is None:
                # Anthropic's default is "auto" already: a choice goes only when one was made.
                kwargs["tool_choice"] = _tool_choice(choice)
            elif choice == "none":
                # No tool of the user's, but the answer still comes through the output tool.
                kwargs["tool_choice"] = {"type": "tool", "name": output_tool}
            elif choice not in ("auto", "required"):
                kwargs["tool_choice"] = _tool_choice(choice)  # the named tool first
        if tools:
            kwargs["tools"] = tools
            current = kwargs.get("tool_choice", {"type": "auto"})
            if p.parallel_tool_calls is False and current["type"] != "none":
                kwargs["tool_choice"] = {**current, "disable_parallel_tool_use": True}
        if p.temperature is not None:
            _put(kwargs, "temperature", p.temperature)
        if p.top_p is not None:
            _put(kwargs, "top_p", p.top_p)
        if p.max_output_tokens is not None:
            kwargs["max_tokens"] = p.max_output_tokens
        if p.stop_sequences:
            kwargs["stop_sequences"] = list(p.stop_sequences)
        if p.extra:
            merge_extra(kwargs, p.extra, _CREATE_KWARGS)
        if "tools" not in kwargs and "tools" not in (kwargs.get("extra_body") or {}):
            # (Tools given through extra= define tools too.)
            called = _history_tools(request.messages)
            if called:
                kwargs["tools"] = called
                kwargs.setdefault("tool_choice", {"type": "none"})
        if native is not None:
            # Beside the other settings of output_config (effort, say) given in extra=, on
            # the model or the request; the schema of a typed answer always wins.
            given = _taken(kwargs, "output_config")
            _put(kwargs, "output_config", {**given, "format": native})
        return kwargs, output_tool

    def _schema(self, fmt: ResponseFormat) -> dict[str, Any]:
        return cached(self._schema_cache, fmt, _input_schema)

    def _native_schema(self, fmt: ResponseFormat) -> dict[str, Any]:
        return cached(self._native_cache, fmt, _native_schema)


# -- request mapping helpers -----------------------------------------------------------------


def _to_anthropic_messages(
    messages: Sequence[ChatMessage],
) -> tuple[str | None, list[dict[str, Any]]]:
    """Split chat messages into the top-level system text and alternating user/assistant turns.

    Consecutive messages of one role become one turn (tool results, which travel as user
    content, included), with tool results first in their turn as the API requires.
    """
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, UserMessage):
            role = "user"
            # The API refuses a text block that is empty or only whitespace.
            blocks: list[dict[str, Any]] = (
                [{"type": "text", "text": m.text}] if _has_text(m.text) else []
            )
        elif isinstance(m, ToolExecutionResultMessage):
            role = "user"
            # The API refuses a blank result (with is_error, and as an empty content block):
            # a tool with no output (a write, a silent command) is sent as saying so.
            content = m.text if _has_text(m.text) else _NO_OUTPUT[bool(m.is_error)]
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.id, "content": content}
            if m.is_error:
                block["is_error"] = True  # the model then knows the call failed
            blocks = [block]
        elif isinstance(m, AiMessage):
            role = "assistant"
            # Reasoning first, as returned: with thinking on, a turn that calls tools must
            # start with its thinking block.
            blocks = [_reasoning_block(r) for r in m.reasoning or ()]
            if _has_text(m.text):  # (a blank text beside a tool call would be refused)
                blocks.append({"type": "text", "text": m.text})
            for r in m.tool_execution_requests:
                blocks.append(
                    {"type": "tool_use", "id": r.id, "name": r.name, "input": _tool_input(r)}
                )
            if not blocks:
                continue  # the API rejects an empty assistant turn
        elif isinstance(m, SystemMessage):
            system.append(m.text)
            continue
        else:
            raise TypeError(f"not a chat message: {m!r}")
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    for turn in turns:
        content = turn["content"]
        if not content:
            raise ValueError(
                "Anthropic's API refuses a user message that is empty or only whitespace; "
                "send some text (or check the input before the call)"
            )
        if len(content) == 1 and content[0]["type"] == "text":
            turn["content"] = content[0]["text"]
        elif turn["role"] == "user" and len(content) > 1:
            content.sort(key=_tool_results_first)
    return ("\n\n".join(system) if system else None), turns


def _sdk_errors(events: Any) -> contextlib.AbstractContextManager[None]:
    """A transport failure while reading ``events`` raised as the SDK's
    ``APITimeoutError`` / ``APIConnectionError``."""
    return transport_errors_as(
        anthropic.APITimeoutError, anthropic.APIConnectionError, events.response
    )


def _needs_stream(error: ValueError) -> bool:
    # The SDK's own refusal, made before any request is sent.
    return str(error).startswith("Streaming is required")


_NO_OUTPUT: Final = ("(the tool returned no output)", "(the tool failed without a message)")


def _has_text(text: str | None) -> bool:
    return bool(text and not text.isspace())


def _to_anthropic_tool(spec: ToolSpecification) -> dict[str, Any]:
    param: dict[str, Any] = {"name": spec.name}
    if spec.description:
        param["description"] = spec.description
    param["input_schema"] = plain(spec.parameters)
    return param


def _native_schema(fmt: ResponseFormat) -> dict[str, Any]:
    """The schema as native structured output takes it: the SDK's own transform moves the
    keywords the API refuses (``minimum``, ``pattern``, ``minItems`` above 1...) into the
    descriptions, where the model still reads them; the answer is validated with them."""
    transform = getattr(anthropic, "transform_schema", None)  # anthropic >= 0.72
    schema = _input_schema(fmt)
    return schema if transform is None else transform(schema)


def _input_schema(fmt: ResponseFormat) -> dict[str, Any]:
    schema: dict[str, Any] = plain(fmt.schema)
    return schema


def _tool_results_first(block: Mapping[str, Any]) -> int:
    return 0 if block["type"] == "tool_result" else 1


def _tool_input(request: ToolExecutionRequest) -> Any:
    arguments = request.arguments
    if not arguments or arguments.isspace():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    # Replaying a malformed call (say, one another provider produced) must not make the
    # conversation unsendable; the API needs an object, so the raw text is wrapped in one.
    return {"arguments": arguments}


_NAME_BAD_CHARS = re.compile(r"[^a-zA-Z0-9_-]")


def _check_choice(choice: str, tools: Sequence[ToolSpecification]) -> None:
    if choice in ("auto", "required", "none") or any(t.name == choice for t in tools):
        return
    raise ValueError(
        f"tool_choice={choice!r} names no tool offered in this request; the tools are "
        f"{', '.join(t.name for t in tools)}"
    )


def _history_tools(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """The tools the conversation called, declared for a request that offers none: the API
    refuses tool_use and tool_result blocks in a request that defines no tools (a tool
    provider offered them for an earlier call only, or another service shares the memory).
    They go with tool_choice "none", so the model cannot call them again."""
    names = dict.fromkeys(
        r.name for m in messages if isinstance(m, AiMessage) for r in m.tool_execution_requests
    )
    return [
        {
            "name": name,
            "description": "Called earlier in this conversation; not offered now.",
            "input_schema": {"type": "object"},
        }
        for name in names
    ]


def _tool_choice(choice: str) -> dict[str, Any]:
    if choice == "auto":
        return {"type": "auto"}
    if choice == "required":
        return {"type": "any"}
    if choice == "none":
        return {"type": "none"}
    return {"type": "tool", "name": choice}


def _output_tool_name(fmt: ResponseFormat, tools: Sequence[ToolSpecification]) -> str:
    name = _NAME_BAD_CHARS.sub("_", fmt.name)[:60] or "answer"
    taken = {t.name for t in tools}
    base, n = name, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    return name


def _taken(kwargs: dict[str, Any], key: str) -> dict[str, Any]:
    """The mapping set for ``key`` (as a keyword or in ``extra_body``), or ``{}``."""
    value = kwargs.get(key, (kwargs.get("extra_body") or {}).get(key))
    return dict(value) if isinstance(value, Mapping) else {}


def _put(kwargs: dict[str, Any], key: str, value: Any) -> None:
    if key in _CREATE_KWARGS:
        kwargs[key] = value
    else:
        body = kwargs.get("extra_body")
        kwargs["extra_body"] = {**body, key: value} if body else {key: value}


# -- response mapping ----------------------------------------------------------------------


# The fields of the prompt's token count: input_tokens leaves out cached tokens.
_INPUT_FIELDS: Final = (
    "input_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)


def _usage(usage: Any) -> TokenUsage | None:
    if usage is None:
        return None
    # input_tokens leaves out cached prompt tokens; count them, as other providers do.
    inputs = usage.input_tokens
    if inputs is not None:
        inputs += (usage.cache_creation_input_tokens or 0) + (usage.cache_read_input_tokens or 0)
    return TokenUsage(inputs, usage.output_tokens)


def _response(message: Any, output_tool: str | None) -> ChatResponse:
    if not isinstance(message, Message):
        # The SDK hands back the raw body when a server answers with something else.
        raise ValueError(f"the server did not answer with a message: {str(message)[:200]!r}")
    if message.type != "message" or not isinstance(message.content, list):
        # Built from whatever JSON came with the 200, unchecked: a gateway's error object,
        # or a message without its content.
        raise _not_a_message(message)
    texts: list[str] = []
    requests: list[ToolExecutionRequest] = []
    reasoning: list[Reasoning] = []
    answer: str | None = None
    blocks: list[Any] = message.content  # read by their type tags, not their classes
    for block in blocks:
        kind = block.type
        if kind == "text":
            texts.append(block.text)
        elif kind == "thinking":
            reasoning.append(Reasoning(text=block.thinking, signature=block.signature))
        elif kind == "redacted_thinking":
            reasoning.append(Reasoning(redacted=block.data))
        elif kind == "tool_use":
            if block.name == output_tool:
                answer = json.dumps(block.input, ensure_ascii=False)
            else:
                requests.append(
                    ToolExecutionRequest(
                        block.id, block.name, json.dumps(block.input, ensure_ascii=False)
                    )
                )
    reason = message.stop_reason
    finish = _STOP_REASONS.get(reason, reason) if reason is not None else None
    text = "".join(texts) if texts else None
    if answer is not None and not requests:
        # The forced answer tool is how the model gives a typed answer: that is a stop.
        text = answer
        if finish == "tool_calls":
            finish = "stop"
    return ChatResponse(
        AiMessage(text, requests, reasoning=reasoning or None), _usage(message.usage), finish
    )


def _not_a_message(message: Message) -> ValueError:
    """The error for a 200 answer that is not a whole message, in the server's words if it
    gave any."""
    error: object = (message.model_extra or {}).get("error")
    if error is not None:
        text, kind = error, None
        if isinstance(error, dict):
            text = error.get("message") or error
            kind = error.get("type")
        where = f" ({kind})" if kind is not None else ""
        return ValueError(
            f"the server answered with an error instead of a message{where}: {text}"[:1000]
        )
    return ValueError(
        f"the server answered with a message without its content (type {message.type!r}, "
        f"content {message.content!r:.100})"
    )


def _reasoning_block(reasoning: Reasoning) -> dict[str, Any]:
    if reasoning.redacted is not None:
        return {"type": "redacted_thinking", "data": reasoning.redacted}
    return {"type": "thinking", "thinking": reasoning.text, "signature": reasoning.signature or ""}


class _StreamAccumulator:
    """Folds raw Messages stream events into text deltas and one final response."""

    __slots__ = (
        "_blocks",
        "_finish",
        "_inputs",
        "_output_tokens",
        "_output_tool",
        "_stopped",
    )

    def __init__(self, output_tool: str | None) -> None:
        self._output_tool = output_tool
        self._stopped = False  # message_stop seen: the answer is whole
        # index -> [kind, id, name, parts]; kind is "text", "tool" or "answer"
        self._blocks: dict[int, list[Any]] = {}
        self._finish: str | None = None
        # The prompt's tokens by field (uncached, cache reads, cache writes): a
        # message_delta restates those that changed and may leave the others out.
        self._inputs: dict[str, int] = {}
        self._output_tokens: int | None = None

    def add(self, event: Any) -> str | None:
        """Take one event; return its text delta, if any."""
        kind = event.type
        if kind == "content_block_delta":
            block = self._blocks.get(event.index)
            if block is None:
                return None
            delta = event.delta
            if delta.type == "text_delta":
                if block[0] == "text":
                    block[3].append(delta.text)
                    return str(delta.text)
            elif delta.type == "thinking_delta":
                block[3].append(delta.thinking)
            elif delta.type == "signature_delta":
                block[1] = (block[1] or "") + delta.signature
            elif delta.type == "input_json_delta":
                block[3].append(delta.partial_json)
                if block[0] == "answer":
                    return str(delta.partial_json)
            return None
        if kind == "content_block_start":
            cb = event.content_block
            if cb.type == "text":
                self._blocks[event.index] = ["text", None, None, [cb.text] if cb.text else []]
                return str(cb.text) if cb.text else None
            if cb.type == "tool_use":
                parts = [json.dumps(cb.input, ensure_ascii=False)] if cb.input else []
                role = "answer" if cb.name == self._output_tool else "tool"
                self._blocks[event.index] = [role, cb.id, cb.name, parts]
            elif cb.type == "thinking":
                # [kind, signature, None, thinking parts]
                parts = [cb.thinking] if cb.thinking else []
                self._blocks[event.index] = ["thinking", cb.signature or None, None, parts]
            elif cb.type == "redacted_thinking":
                self._blocks[event.index] = ["redacted", None, cb.data, []]
            return None
        if kind == "message_stop":
            self._stopped = True
        elif kind == "message_start":
            usage = event.message.usage
            if usage is not None:
                self._take_inputs(usage)
                self._output_tokens = usage.output_tokens
        elif kind == "message_delta":
            if event.delta.stop_reason is not None:
                self._finish = event.delta.stop_reason
            usage = event.usage
            if usage is not None:
                # message_delta counts are cumulative for the whole message.
                self._output_tokens = usage.output_tokens
                self._take_inputs(usage)
        return None

    def _take_inputs(self, usage: Any) -> None:
        for field in _INPUT_FIELDS:
            value = getattr(usage, field, None)
            if value is not None:
                self._inputs[field] = value

    def response(self) -> ChatResponse:
        """The whole answer, once the stream has ended with message_stop."""
        if not self._stopped:
            raise IncompleteResponseError(
                "the Anthropic stream ended without message_stop: the answer may be cut "
                "short, so nothing of it is used"
            )
        texts: list[str] = []
        requests: list[ToolExecutionRequest] = []
        reasoning: list[Reasoning] = []
        answer: str | None = None
        for index in sorted(self._blocks):
            kind, block_id, name, parts = self._blocks[index]
            if kind == "text":
                texts.extend(parts)
            elif kind == "thinking":
                reasoning.append(Reasoning(text="".join(parts), signature=block_id))
            elif kind == "redacted":
                reasoning.append(Reasoning(redacted=name))
            elif kind == "tool":
                requests.append(ToolExecutionRequest(block_id, name, "".join(parts) or "{}"))
            else:
                answer = "".join(parts).strip() or "{}"
        reason = self._finish
        finish = _STOP_REASONS.get(reason, reason) if reason is not None else None
        text = "".join(texts) if texts else None
        if answer is not None and not requests:
            text = answer
            if finish == "tool_calls":
                finish = "stop"
        inputs = self._inputs.get("input_tokens")
        if inputs is not None:  # with the cached tokens, as _usage counts them
            inputs += sum(self._inputs.get(f, 0) for f in _INPUT_FIELDS[1:])
        usage = (
            TokenUsage(inputs, self._output_tokens)
            if inputs is not None or self._output_tokens is not None
            else None
        )
        return ChatResponse(AiMessage(text, requests, reasoning=reasoning or None), usage, finish)

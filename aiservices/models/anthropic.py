"""``AnthropicChatModel``: a ``ChatModel`` on the ``anthropic`` SDK's Messages API.

Errors are the SDK's own (``anthropic.AuthenticationError``, ``anthropic.RateLimitError``,
...); retries and timeouts are the SDK's too. Also exports
:class:`AnthropicTokenCountEstimator`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

import anthropic
from anthropic.resources.messages import Messages
from anthropic.types import Message

from ..messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionRequest,
    ToolExecutionResultMessage,
    UserMessage,
)
from . import ChatRequest, ChatResponse, ResponseFormat, TokenUsage, ToolSpecification
from ._anthropic_tokens import AnthropicTokenCountEstimator

if TYPE_CHECKING:
    # The SDK takes httpx or httpx2 clients; neither is imported unless a caller made one.
    import httpx
    import httpx2

__all__ = ["DEFAULT_MAX_TOKENS", "AnthropicChatModel", "AnthropicTokenCountEstimator"]

DEFAULT_MAX_TOKENS: Final = 4096
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
_CREATE_KWARGS: Final = frozenset(inspect.signature(Messages.create).parameters) - {"self"}

_STRUCTURED_OUTPUT_MODES: Final = ("tool", "native", "off")
_OUTPUT_TOOL_DESCRIPTION: Final = (
    "Give your final answer by calling this tool; its input is the answer."
)
_CACHE_LIMIT: Final = 512


class AnthropicChatModel:
    """A chat model served by Anthropic's Messages API.

    ``api_key`` defaults to ``ANTHROPIC_API_KEY`` (the SDK's own credential lookup applies).
    ``max_tokens`` caps each answer, :data:`DEFAULT_MAX_TOKENS` unless set; a request's
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
        if not isinstance(model, str) or not model.strip():
            raise ValueError(
                f"model must be a non-empty model name such as 'claude-sonnet-4-6', not {model!r}"
            )
        _check_options(
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            max_tokens=max_tokens,
            max_retries=max_retries,
            timeout=timeout,
        )
        if structured_output not in _STRUCTURED_OUTPUT_MODES:
            raise ValueError(
                f"structured_output must be one of {_STRUCTURED_OUTPUT_MODES}, "
                f"not {structured_output!r}"
            )
        if client is not None and not isinstance(client, anthropic.Anthropic):
            raise TypeError(f"client must be an anthropic.Anthropic, not {type(client).__name__}")
        if async_client is not None and not isinstance(async_client, anthropic.AsyncAnthropic):
            raise TypeError(
                "async_client must be an anthropic.AsyncAnthropic, "
                f"not {type(async_client).__name__}"
            )
        connection = {
            "api_key": api_key,
            "base_url": base_url,
            "timeout": timeout,
            "max_retries": max_retries,
            "default_headers": default_headers,
            "http_client": http_client,
            "async_http_client": async_http_client,
        }
        if client is not None and async_client is not None:
            unused = [name for name, value in connection.items() if value is not None]
            if unused:
                raise ValueError(
                    f"{', '.join(unused)} would go unused: client= and async_client= are "
                    "both given, so set these on those clients instead"
                )
        self.model_name = model
        if base_url is None and client is not None:
            base_url = str(client.base_url)
        self._base_url = base_url
        options: dict[str, Any] = {}
        if api_key is None and client is not None and client.api_key:
            api_key = client.api_key  # the async client follows a handed-in sync client
        if api_key is not None:
            options["api_key"] = _Secret(api_key)
        for name in ("base_url", "timeout", "max_retries"):
            value = base_url if name == "base_url" else connection[name]
            if value is None and client is not None:
                value = getattr(client, name, None)
            if value is not None:
                options[name] = value
        if default_headers is not None:
            options["default_headers"] = default_headers
        self._client_options = options
        self._http_client: Any = http_client
        self._async_http_client: Any = async_http_client
        self._client = client
        self._owns_client = client is None
        self._given_async_client = async_client
        self._async_clients: dict[asyncio.AbstractEventLoop, anthropic.AsyncAnthropic] = {}
        self._lock = threading.Lock()

        defaults: dict[str, Any] = {"max_tokens": max_tokens}
        for name, value in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k)):
            if value is not None:
                _put(defaults, name, value)
        if extra:
            _merge_extra(defaults, extra)
        self._defaults = defaults
        self._structured_output = structured_output
        self._tool_cache: dict[int, tuple[ToolSpecification, dict[str, Any]]] = {}
        self._schema_cache: dict[int, tuple[ResponseFormat, dict[str, Any]]] = {}

    def __repr__(self) -> str:
        where = f", base_url={_redact_url(self._base_url)!r}" if self._base_url else ""
        return f"{type(self).__name__}(model={self.model_name!r}{where})"

    # -- clients ---------------------------------------------------------------------------

    def _sync_client(self) -> anthropic.Anthropic:
        client = self._client
        if client is None:
            with self._lock:
                client = self._client
                if client is None:
                    client = self._client = anthropic.Anthropic(
                        **self._connection_options(), http_client=self._http_client
                    )
        return client

    def _async_client(self) -> anthropic.AsyncAnthropic:
        if self._given_async_client is not None:
            return self._given_async_client
        # One client per event loop: an async connection pool cannot outlive the loop it was
        # made in, and users do call asyncio.run() more than once. Clients of loops that
        # have closed are dropped (they cannot be closed any more).
        loop = asyncio.get_running_loop()
        client = self._async_clients.get(loop)
        if client is None:
            with self._lock:
                clients = self._async_clients
                for old in [old for old in clients if old.is_closed()]:
                    del clients[old]
                client = clients.get(loop)
                if client is None:
                    client = clients[loop] = anthropic.AsyncAnthropic(
                        **self._connection_options(), http_client=self._async_http_client
                    )
        return client

    def _connection_options(self) -> dict[str, Any]:
        options = dict(self._client_options)
        if "api_key" in options:
            options["api_key"] = options["api_key"].value
        return options

    def close(self) -> None:
        """Close the sync SDK client this model made (one handed in is left open)."""
        client = self._client
        if client is not None and self._owns_client:
            self._client = None
            client.close()

    async def aclose(self) -> None:
        """Close the SDK clients this model made: the sync one and this event loop's async one."""
        self.close()
        client = self._async_clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    def __enter__(self) -> AnthropicChatModel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> AnthropicChatModel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- the ChatModel protocol ------------------------------------------------------------

    def chat(self, request: ChatRequest) -> ChatResponse:
        """Answer one request with a single Messages call."""
        kwargs, output_tool = self._request(request)
        message = self._sync_client().messages.create(**kwargs)
        return _response(message, output_tool)

    async def achat(self, request: ChatRequest) -> ChatResponse:
        """The async form of :meth:`chat`."""
        kwargs, output_tool = self._request(request)
        message = await self._async_client().messages.create(**kwargs)
        return _response(message, output_tool)

    def stream(self, request: ChatRequest) -> Iterator[str | ChatResponse]:
        """Yield the answer's text deltas, then one ``ChatResponse`` with the whole answer.

        For a typed answer given through the output tool, the deltas are that tool's JSON.
        """
        kwargs, output_tool = self._request(request)
        kwargs["stream"] = True
        acc = _StreamAccumulator(output_tool)
        with self._sync_client().messages.create(**kwargs) as events:
            for event in events:
                text = acc.add(event)
                if text:
                    yield text
        yield acc.response()

    async def astream(self, request: ChatRequest) -> AsyncIterator[str | ChatResponse]:
        """The async form of :meth:`stream`."""
        kwargs, output_tool = self._request(request)
        kwargs["stream"] = True
        acc = _StreamAccumulator(output_tool)
        events = await self._async_client().messages.create(**kwargs)
        async with events:
            async for event in events:
                text = acc.add(event)
                if text:
                    yield text
        yield acc.response()

    # -- request mapping -------------------------------------------------------------------

    def _request(self, request: ChatRequest) -> tuple[dict[str, Any], str | None]:
        kwargs = dict(self._defaults)  # _put() and _merge_extra() copy what they change
        system, messages = _to_anthropic_messages(request.messages)
        kwargs["model"] = self.model_name
        kwargs["messages"] = messages
        if system is not None:
            kwargs["system"] = system
        tools = [self._tool(spec) for spec in request.tools]
        output_tool: str | None = None
        fmt = request.response_format
        if fmt is not None and self._structured_output != "off":
            if self._structured_output == "native" and fmt.strict:
                _put(
                    kwargs,
                    "output_config",
                    {"format": {"type": "json_schema", "schema": self._schema(fmt)}},
                )
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
        if tools:
            kwargs["tools"] = tools
        p = request.parameters
        if p.temperature is not None:
            _put(kwargs, "temperature", p.temperature)
        if p.top_p is not None:
            _put(kwargs, "top_p", p.top_p)
        if p.max_output_tokens is not None:
            kwargs["max_tokens"] = p.max_output_tokens
        if p.stop_sequences:
            kwargs["stop_sequences"] = list(p.stop_sequences)
        if p.extra:
            _merge_extra(kwargs, p.extra)
        return kwargs, output_tool

    def _tool(self, spec: ToolSpecification) -> dict[str, Any]:
        # Services hand the same specification objects on every call: convert each once.
        cached = self._tool_cache.get(id(spec))
        if cached is not None and cached[0] is spec:
            return cached[1]
        param: dict[str, Any] = {"name": spec.name}
        if spec.description:
            param["description"] = spec.description
        param["input_schema"] = _plain(spec.parameters)
        if len(self._tool_cache) >= _CACHE_LIMIT:
            self._tool_cache.clear()
        self._tool_cache[id(spec)] = (spec, param)
        return param

    def _schema(self, fmt: ResponseFormat) -> dict[str, Any]:
        cached = self._schema_cache.get(id(fmt))
        if cached is not None and cached[0] is fmt:
            return cached[1]
        schema: dict[str, Any] = _plain(fmt.schema)
        if len(self._schema_cache) >= _CACHE_LIMIT:
            self._schema_cache.clear()
        self._schema_cache[id(fmt)] = (fmt, schema)
        return schema


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
            blocks: list[dict[str, Any]] = [{"type": "text", "text": m.text}]
        elif isinstance(m, ToolExecutionResultMessage):
            role = "user"
            blocks = [{"type": "tool_result", "tool_use_id": m.id, "content": m.text}]
        elif isinstance(m, AiMessage):
            role = "assistant"
            blocks = [{"type": "text", "text": m.text}] if m.text else []
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
        if len(content) == 1 and content[0]["type"] == "text":
            turn["content"] = content[0]["text"]
        elif turn["role"] == "user" and len(content) > 1:
            content.sort(key=_tool_results_first)
    return ("\n\n".join(system) if system else None), turns


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


def _output_tool_name(fmt: ResponseFormat, tools: Sequence[ToolSpecification]) -> str:
    name = _NAME_BAD_CHARS.sub("_", fmt.name)[:60] or "answer"
    taken = {t.name for t in tools}
    base, n = name, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    return name


def _plain(value: Any) -> Any:
    # Schemas may arrive as read-only mappings; the SDK serialises plain dicts and lists.
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _put(kwargs: dict[str, Any], key: str, value: Any) -> None:
    if key in _CREATE_KWARGS:
        kwargs[key] = value
    else:
        body = kwargs.get("extra_body")
        kwargs["extra_body"] = {**body, key: value} if body else {key: value}


def _merge_extra(kwargs: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if key == "extra_body":
            kwargs["extra_body"] = {**(kwargs.get("extra_body") or {}), **value}
        else:
            _put(kwargs, key, value)


# -- response mapping ----------------------------------------------------------------------


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
    texts: list[str] = []
    requests: list[ToolExecutionRequest] = []
    answer: str | None = None
    blocks: list[Any] = message.content  # read by their type tags, not their classes
    for block in blocks:
        kind = block.type
        if kind == "text":
            texts.append(block.text)
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
    return ChatResponse(AiMessage(text, requests), _usage(message.usage), finish)


class _StreamAccumulator:
    """Folds raw Messages stream events into text deltas and one final response."""

    __slots__ = ("_blocks", "_finish", "_input_tokens", "_output_tokens", "_output_tool")

    def __init__(self, output_tool: str | None) -> None:
        self._output_tool = output_tool
        # index -> [kind, id, name, parts]; kind is "text", "tool" or "answer"
        self._blocks: dict[int, list[Any]] = {}
        self._finish: str | None = None
        self._input_tokens: int | None = None
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
            return None
        if kind == "message_start":
            usage = event.message.usage
            if usage is not None:
                self._input_tokens = _usage(usage).input_tokens  # type: ignore[union-attr]
                self._output_tokens = usage.output_tokens
        elif kind == "message_delta":
            if event.delta.stop_reason is not None:
                self._finish = event.delta.stop_reason
            usage = event.usage
            if usage is not None:
                # message_delta counts are cumulative for the whole message.
                self._output_tokens = usage.output_tokens
                if usage.input_tokens is not None:
                    self._input_tokens = _usage(usage).input_tokens  # type: ignore[union-attr]
        return None

    def response(self) -> ChatResponse:
        """The whole answer, once the stream has ended."""
        texts: list[str] = []
        requests: list[ToolExecutionRequest] = []
        answer: str | None = None
        for index in sorted(self._blocks):
            kind, block_id, name, parts = self._blocks[index]
            if kind == "text":
                texts.extend(parts)
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
        usage = (
            TokenUsage(self._input_tokens, self._output_tokens)
            if self._input_tokens is not None or self._output_tokens is not None
            else None
        )
        return ChatResponse(AiMessage(text, requests), usage, finish)


# -- small helpers ---------------------------------------------------------------------------


class _Secret:
    """Holds a key so that no repr, log line or traceback of ours shows it."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "'**********'"


def _redact_url(url: str) -> str:
    # A base URL may carry credentials (https://user:secret@host).
    return re.sub(r"//[^/@]*@", "//***@", url)


def _check_options(
    *,
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    max_tokens: int,
    max_retries: int | None,
    timeout: object,
) -> None:
    if temperature is not None and not (isinstance(temperature, int | float) and temperature >= 0):
        raise ValueError(f"temperature must be a number >= 0, not {temperature!r}")
    if top_p is not None and not (isinstance(top_p, int | float) and 0 <= top_p <= 1):
        raise ValueError(f"top_p must be a number between 0 and 1, not {top_p!r}")
    if top_k is not None and not (isinstance(top_k, int) and top_k > 0):
        raise ValueError(f"top_k must be a positive int, not {top_k!r}")
    if not (isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0):
        raise ValueError(
            f"max_tokens must be a positive int (the API requires a cap), not {max_tokens!r}"
        )
    if max_retries is not None and not (
        isinstance(max_retries, int) and not isinstance(max_retries, bool) and max_retries >= 0
    ):
        raise ValueError(f"max_retries must be an int >= 0, not {max_retries!r}")
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")

"""``OpenAIChatModel``: a ``ChatModel`` on the ``openai`` SDK's Chat Completions API.

It serves OpenAI itself and any server that speaks the same API (Ollama, vLLM, LM Studio,
...) through ``base_url=``. Errors are the SDK's own (``openai.AuthenticationError``,
``openai.RateLimitError``, ...); retries and timeouts are the SDK's too.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import re
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

try:
    import openai
    from openai.resources.chat.completions import Completions
    from openai.types.chat import ChatCompletion
except ModuleNotFoundError as exc:  # pragma: no cover - exercised only without the extra
    from ._sdk import sdk_missing

    raise sdk_missing(exc, "openai") from exc

from ..errors import IncompleteResponseError
from ..messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionRequest,
    ToolExecutionResultMessage,
    UserMessage,
)
from . import ChatRequest, ChatResponse, ResponseFormat, TokenUsage, ToolSpecification
from ._sdk import (
    SdkChatModel,
    cached,
    cached_each,
    check_choice,
    check_clients,
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
from ._strict import is_strict_schema

if TYPE_CHECKING:
    # The SDK takes httpx or httpx2 clients; neither is imported unless a caller made one.
    import httpx
    import httpx2

__all__ = ["OpenAIChatModel"]

LOCAL_SERVER_API_KEY: Final = "not-needed"
"""The key sent to a ``base_url`` server when no key is configured (local servers want none)."""

_FINISH_REASONS: Final[Mapping[str, str]] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
}

# Keys of ChatRequestParameters.extra that create() takes as keyword arguments; every other
# key goes into the request body through extra_body, so server-specific options (vLLM's
# top_k, Ollama's options) work without the SDK knowing them.
_CREATE_KWARGS: Final = create_keywords(Completions.create)

_SDK: Final = (openai.OpenAI, openai.AsyncOpenAI)
_STRUCTURED_OUTPUT_MODES: Final = ("json_schema", "json_object", "off")


def _read_errors(chunks: Any) -> contextlib.AbstractContextManager[None]:
    """What breaks while a stream's events are read, said plainly (`transport_errors_as`)."""
    return transport_errors_as(openai.APITimeoutError, openai.APIConnectionError, chunks.response)


@contextlib.contextmanager
def _format_refusal_noted(kwargs: Mapping[str, Any]) -> Iterator[None]:
    """Add the fix to a server's refusal of a JSON-schema response format (llama.cpp's
    server takes only ``json_object``); the error stays the SDK's own."""
    try:
        yield
    except openai.APIStatusError as exc:
        fmt = kwargs.get("response_format")
        if (
            isinstance(fmt, Mapping)
            and fmt.get("type") == "json_schema"
            and ("json_object" in str(exc))
        ):
            exc.add_note(
                "The server refused the JSON-schema response format for a typed answer: make "
                'the model with structured_output="json_object" (the schema then goes in a '
                "json_object format, as llama.cpp's server takes it)."
            )
        raise


def _azure_options(options: dict[str, Any], client: Any) -> None:
    """Make ``options`` (as `client_options` made them from an Azure ``client``) those of
    the Azure SDK's constructors."""
    query = dict(options.pop("default_query", None) or {})
    options["api_version"] = query.pop("api-version", None)
    if query:
        options["default_query"] = query
    provider = getattr(client, "_azure_ad_token_provider", None)
    token = getattr(client, "_azure_ad_token", None)
    if provider is not None or token is not None:
        options.pop("api_key", None)  # the SDK takes one kind of credential
        if provider is not None and inspect.iscoroutinefunction(provider):
            # Only an async client awaits it: the sync client made beside it can't use it.
            provider = _async_provider_refused
        if provider is not None:
            options["azure_ad_token_provider"] = provider
        else:
            options["azure_ad_token"] = token


def _async_provider_refused() -> str:
    raise TypeError(
        "the AsyncAzureOpenAI client given as async_client= has an async "
        "azure_ad_token_provider, which the sync client made for chat() and stream() can't "
        "await: pass client=AzureOpenAI(...) with a sync provider too"
    )


class OpenAIChatModel(SdkChatModel[openai.OpenAI, openai.AsyncOpenAI]):
    """A chat model served by OpenAI's Chat Completions API or an OpenAI-compatible server.

    ``api_key`` defaults to ``OPENAI_API_KEY``; with ``base_url`` set and no key anywhere, a
    placeholder key is sent, since local servers need none. ``timeout`` and ``max_retries``
    go to the SDK client (``None`` keeps the SDK's defaults). ``temperature``, ``top_p`` and
    ``max_tokens`` are defaults that a request's own parameters override; ``extra`` is merged
    into every request (SDK keyword arguments as such, anything else into the request body).
    ``max_tokens`` is sent as ``max_completion_tokens`` to OpenAI and as ``max_tokens`` to a
    ``base_url`` server. ``structured_output="json_object"`` sends the schema in a
    ``json_object`` response format (llama.cpp's server takes that, not ``json_schema``);
    ``"off"`` sends no ``response_format`` (for servers without JSON-schema support).
    ``stream_usage=False`` omits ``stream_options`` from streamed requests. ``client`` /
    ``async_client`` replace the SDK clients this model would make (they are then never
    closed by it); ``http_client`` / ``async_http_client`` are handed to the clients it
    makes.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float | httpx2.Timeout | None = None,
        max_retries: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        max_tokens: int | None = None,
        organization: str | None = None,
        project: str | None = None,
        default_headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
        structured_output: Literal["json_schema", "json_object", "off"] = "json_schema",
        stream_usage: bool = True,
        client: openai.OpenAI | None = None,
        async_client: openai.AsyncOpenAI | None = None,
        http_client: httpx.Client | httpx2.Client | None = None,
        async_http_client: httpx.AsyncClient | httpx2.AsyncClient | None = None,
    ) -> None:
        check_model_name(model, "gpt-4o-mini")
        check_sampling(temperature, top_p)
        if max_tokens is not None and not (
            isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0
        ):
            raise ValueError(f"max_tokens must be a positive int, not {max_tokens!r}")
        check_transport(max_retries, timeout)
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
                "organization": organization,
                "project": project,
                "default_headers": default_headers,
                "http_client": http_client,
                "async_http_client": async_http_client,
            },
        )
        self.model_name = model
        # The URL requests go to: ours, else a handed-in client's, else the SDK's default.
        followed = followed_client(client, async_client)
        if base_url is None and followed is not None:
            base_url = str(followed.base_url)
        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        options: dict[str, Any] = {}  # with both clients handed in, none is ever made
        if async_client is None or client is None:
            key = api_key
            if key is None and followed is not None and isinstance(followed.api_key, str):
                key = followed.api_key  # the client made follows the one handed in
            key = key or os.environ.get("OPENAI_API_KEY") or None
            if key is None:
                if base_url is None:
                    raise ValueError(
                        "no OpenAI API key: pass api_key=... or set OPENAI_API_KEY "
                        "(for a local OpenAI-compatible server, pass base_url=...)"
                    )
                key = LOCAL_SERVER_API_KEY
            options = client_options(
                key,
                followed,
                default_headers=default_headers,
                base_url=base_url,
                timeout=timeout,
                max_retries=max_retries,
                organization=organization,
                project=project,
            )
        sdk: tuple[type[Any], type[Any]] = _SDK
        if isinstance(followed, openai.AzureOpenAI | openai.AsyncAzureOpenAI):
            # The client made beside an Azure one is an Azure one: its api-version, and its
            # key in the api-key header (or its Entra token), as the one handed in.
            sdk = (openai.AzureOpenAI, openai.AsyncAzureOpenAI)
            if options:
                _azure_options(options, followed)
        super().__init__(
            sdk,
            client,
            async_client,
            base_url=base_url,
            options=options,
            http_client=http_client,
            async_http_client=async_http_client,
        )

        defaults: dict[str, Any] = {}
        if temperature is not None:
            defaults["temperature"] = temperature
        if top_p is not None:
            defaults["top_p"] = top_p
        # OpenAI's own API and Azure OpenAI take max_completion_tokens (reasoning models
        # refuse max_tokens); other compatible servers know max_tokens.
        uses_openai = base_url is None or any(host in base_url for host in _OPENAI_HOSTS)
        self._max_tokens_key = "max_completion_tokens" if uses_openai else "max_tokens"
        if max_tokens is not None:
            defaults[self._max_tokens_key] = max_tokens
        if extra:
            merge_extra(defaults, extra, _CREATE_KWARGS)
        self._defaults = defaults
        self._structured_output = structured_output != "off"
        self._format_of = (
            _to_openai_response_format if structured_output == "json_schema" else _to_json_object
        )
        self._stream_options = {"include_usage": True} if stream_usage else None
        self._tool_cache: dict[int, tuple[ToolSpecification, dict[str, Any]]] = {}
        self._format_cache: dict[int, tuple[ResponseFormat, dict[str, Any]]] = {}

    # -- the ChatModel protocol ------------------------------------------------------------

    def chat(self, request: ChatRequest) -> ChatResponse:
        """Answer one request with a single Chat Completions call."""
        kwargs = self._request(request)
        with _format_refusal_noted(kwargs):
            completion = self._sync_client().chat.completions.create(**kwargs)
        return _response(completion)

    async def achat(self, request: ChatRequest) -> ChatResponse:
        """The async form of `chat`."""
        kwargs = self._request(request)
        with _format_refusal_noted(kwargs):
            completion = await self._async_client().chat.completions.create(**kwargs)
        return _response(completion)

    def stream(self, request: ChatRequest) -> Iterator[str | ChatResponse]:
        """Yield the answer's text deltas, then one ``ChatResponse`` with the whole answer."""
        kwargs = self._request(request, stream=True)
        acc = _StreamAccumulator()
        with _format_refusal_noted(kwargs):
            made = self._sync_client().chat.completions.create(**kwargs)
        with made as chunks, _read_errors(chunks):
            for chunk in chunks:
                text = acc.add(chunk)
                if text:
                    yield text
        yield acc.response()

    async def astream(self, request: ChatRequest) -> AsyncIterator[str | ChatResponse]:
        """The async form of `stream`."""
        kwargs = self._request(request, stream=True)
        acc = _StreamAccumulator()
        with _format_refusal_noted(kwargs):
            chunks = await self._async_client().chat.completions.create(**kwargs)
        async with chunks:
            with _read_errors(chunks):
                async for chunk in chunks:
                    text = acc.add(chunk)
                    if text:
                        yield text
        yield acc.response()

    # -- request mapping -------------------------------------------------------------------

    def _request(self, request: ChatRequest, *, stream: bool = False) -> dict[str, Any]:
        kwargs = dict(self._defaults)
        kwargs["model"] = self.model_name
        kwargs["messages"] = _to_openai_messages(request.messages)
        p = request.parameters
        if request.tools:
            kwargs["tools"] = cached_each(self._tool_cache, request.tools, _to_openai_tool)
            kwargs["tool_choice"] = _tool_choice(p.tool_choice, request.tools)
            if p.parallel_tool_calls is not None:
                kwargs["parallel_tool_calls"] = p.parallel_tool_calls
        if request.response_format is not None and self._structured_output:
            kwargs["response_format"] = cached(
                self._format_cache, request.response_format, self._format_of
            )
        if p.temperature is not None:
            kwargs["temperature"] = p.temperature
        if p.top_p is not None:
            kwargs["top_p"] = p.top_p
        if p.max_output_tokens is not None:
            kwargs[self._max_tokens_key] = p.max_output_tokens
        if p.stop_sequences:
            kwargs["stop"] = list(p.stop_sequences)
        if stream:
            kwargs["stream"] = True
            if self._stream_options is not None:
                kwargs["stream_options"] = self._stream_options
        if p.extra:
            merge_extra(kwargs, p.extra, _CREATE_KWARGS)
        return kwargs


# -- request mapping helpers -----------------------------------------------------------------


def _tool_choice(choice: str | None, tools: Sequence[ToolSpecification]) -> str | dict[str, Any]:
    if choice is None or choice in ("auto", "required", "none"):
        return choice or "auto"
    if not any(t.name == choice for t in tools):
        raise ValueError(
            f"tool_choice={choice!r} names no tool offered in this request; the tools are "
            f"{', '.join(t.name for t in tools)}"
        )
    return {"type": "function", "function": {"name": choice}}


def _to_openai_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Map chat messages to Chat Completions message dicts."""
    out: list[dict[str, Any]] = []
    append = out.append
    for m in messages:
        if isinstance(m, UserMessage):
            item: dict[str, Any] = {"role": "user", "content": m.text}
            if m.name:
                item["name"] = _participant_name(m.name)
            append(item)
        elif isinstance(m, AiMessage):
            requests = m.tool_execution_requests
            if requests:
                append(
                    {
                        "role": "assistant",
                        # "" rather than null: llama.cpp's server refuses a null content.
                        "content": m.text or "",
                        "tool_calls": [
                            {
                                "id": r.id,
                                "type": "function",
                                "function": {"name": r.name, "arguments": r.arguments},
                            }
                            for r in requests
                        ],
                    }
                )
            else:
                append({"role": "assistant", "content": m.text or ""})
        elif isinstance(m, ToolExecutionResultMessage):
            append({"role": "tool", "tool_call_id": m.id, "content": m.text})
        elif isinstance(m, SystemMessage):
            append({"role": "system", "content": m.text})
        else:
            raise TypeError(f"not a chat message: {m!r}")
    return out


_NAME_BAD_CHARS = re.compile(r"[^a-zA-Z0-9_-]")
_OPENAI_HOSTS: Final = (
    "api.openai.com",
    ".openai.azure.com",
    ".cognitiveservices.azure.com",
    ".services.ai.azure.com",
)


def _participant_name(name: str) -> str:
    # The API rejects names outside [a-zA-Z0-9_-]{1,64}; "Ada Lovelace" becomes "Ada_Lovelace".
    return _NAME_BAD_CHARS.sub("_", name)[:64]


def _to_openai_tool(spec: ToolSpecification) -> dict[str, Any]:
    """A function tool; ``strict`` is set when the schema meets the strict-mode rules."""
    parameters = plain(spec.parameters)
    function: dict[str, Any] = {"name": spec.name}
    if spec.description:
        function["description"] = spec.description
    function["parameters"] = parameters
    if is_strict_schema(parameters):
        function["strict"] = True
    return {"type": "function", "function": function}


def _to_openai_response_format(fmt: ResponseFormat) -> dict[str, Any]:
    """A ``json_schema`` response format; non-strict schemas go as a best-effort schema."""
    return {
        "type": "json_schema",
        "json_schema": {
            "name": _schema_name(fmt.name),
            "schema": plain(fmt.schema),
            "strict": bool(fmt.strict),
        },
    }


def _to_json_object(fmt: ResponseFormat) -> dict[str, Any]:
    """A ``json_object`` response format carrying the schema, as llama.cpp's server takes it
    (it refuses ``json_schema``) and constrains its output to."""
    return {"type": "json_object", "schema": plain(fmt.schema)}


def _schema_name(name: str) -> str:
    return _NAME_BAD_CHARS.sub("_", name)[:64] or "response"


# -- response mapping ----------------------------------------------------------------------


def _error_in_body(completion: Any, error: object) -> ValueError:
    """The error a server reported in the body of a successful answer, in its own words."""
    message, code = error, None
    if isinstance(error, dict):
        message = error.get("message") or error
        code = error.get("code") or error.get("type")
    where = f" (code {code})" if code is not None else ""
    return ValueError(
        f"the server answered with an error instead of a completion{where}: {message}"[:1000]
    )


def _flat_error(body: Any) -> dict[str, Any] | None:
    """An error sent as the body itself, as some compatible servers (vLLM before 0.6) do:
    ``{"object": "error", "message": ..., "code": ...}`` rather than ``{"error": {...}}``."""
    if getattr(body, "object", None) != "error":
        return None
    extra = body.model_extra or {}
    return {"message": extra.get("message"), "code": extra.get("code"), "type": extra.get("type")}


def _text_of(content: object) -> str | None:
    """A message's text: some compatible servers send a list of parts (``{"type": "text",
    "text": ...}``, beside others such as reasoning) where OpenAI sends a string."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
            for part in content
            if (part.get("type") if isinstance(part, dict) else getattr(part, "type", None))
            == "text"
        ]
        return "".join(p for p in parts if isinstance(p, str))
    raise ValueError(f"the server sent a message whose content is not text: {content!r:.200}")


def _response(completion: Any) -> ChatResponse:
    if not isinstance(completion, ChatCompletion):
        # The SDK hands back the raw body when a server answers with something else.
        raise ValueError(
            f"the server did not answer with a chat completion: {str(completion)[:200]!r}"
        )
    choices = completion.choices
    if not choices:
        error = (completion.model_extra or {}).get("error") or _flat_error(completion)
        if error is not None:
            # A failure after the server had begun (an upstream model behind a gateway),
            # reported in a 200 answer's body: the server's own words are the news.
            raise _error_in_body(completion, error)
        raise ValueError(
            f"the server answered with no choices (completion id {completion.id!r}); "
            "an OpenAI-compatible server must return at least one"
        )
    choice = choices[0]
    message = choice.message
    if message is None:
        # Built from whatever JSON came with the 200, unchecked: a gateway's failure may
        # leave the choice without its message, saying why beside it or not at all.
        error = (choice.model_extra or {}).get("error") or (completion.model_extra or {}).get(
            "error"
        )
        if error is not None:
            raise _error_in_body(completion, error)
        raise ValueError(
            f"the server answered with a choice without a message (finish_reason "
            f"{choice.finish_reason!r}, completion id {completion.id!r})"
        )
    text = _text_of(message.content)
    reason = choice.finish_reason
    if text is None:
        text = getattr(message, "refusal", None)
        if text is not None:
            reason = "content_filter"  # a refusal: no answer to parse or ask again for
    requests = [
        ToolExecutionRequest(
            call.id or _new_call_id(), call.function.name, _arguments(call.function.arguments)
        )
        for call in message.tool_calls or ()
        # Some compatible servers leave "type" out (or null): a function is still a function,
        # as the stream's deltas are read.
        if call.type in ("function", None) and getattr(call, "function", None) is not None
    ]
    legacy = getattr(message, "function_call", None)
    if not requests and legacy is not None and legacy.name:
        # The deprecated single-call form, which some compatible servers still answer with.
        requests = [ToolExecutionRequest(_new_call_id(), legacy.name, _arguments(legacy.arguments))]
    usage = completion.usage
    return ChatResponse(
        AiMessage(text, requests),
        TokenUsage(usage.prompt_tokens, usage.completion_tokens) if usage is not None else None,
        _FINISH_REASONS.get(reason, reason) if reason is not None else None,
    )


class _LegacyCall:
    """A deprecated ``function_call`` delta, read as the first tool call's piece."""

    __slots__ = ("function",)

    index = 0
    id = None

    def __init__(self, function: Any) -> None:
        self.function = function


def _arguments(given: object) -> str:
    """A call's arguments as JSON text; some compatible servers send the object itself."""
    if isinstance(given, str):
        return given or "{}"
    return "{}" if given is None else json.dumps(given)


def _new_call_id() -> str:
    # Some compatible servers send tool calls without ids; results must still point at one.
    return f"call_{uuid.uuid4().hex[:24]}"


def _another_call(entry: list[Any], function: Any) -> bool:
    """Whether a named piece without an id, at an index whose call has a name, starts
    another call: some compatible servers send several whole calls, all at index 0 and
    without ids. Another name says so, and so does the same name after whole arguments."""
    name = getattr(function, "name", None)
    if not name or not entry[1]:
        return False
    if name != entry[1]:
        return True
    if not getattr(function, "arguments", None):
        return False  # a trailing piece that only repeats the name
    try:
        return isinstance(json.loads("".join(entry[2])), dict)
    except ValueError:
        return False


class _StreamAccumulator:
    """Folds ``ChatCompletionChunk`` objects into text deltas and one final response."""

    __slots__ = ("_by_index", "_calls", "_finish", "_refusal", "_text", "_usage")

    def __init__(self) -> None:
        self._calls: list[list[Any]] = []  # [id, name, [argument parts]]
        self._by_index: dict[int, list[Any]] = {}
        self._text: list[str] = []
        self._refusal: list[str] = []
        self._finish: str | None = None
        self._usage: Any = None

    def add(self, chunk: Any) -> str | None:
        """Take one chunk; return its text delta, if any."""
        usage = chunk.usage
        if usage is not None:
            self._usage = usage
        choices = chunk.choices
        if not choices:
            error = _flat_error(chunk)
            if error is not None:
                raise _error_in_body(chunk, error)
            return None  # the usage chunk, or a keep-alive
        choice = choices[0]
        if choice.index:
            # Another candidate's piece (n > 1): the answer is the first's, as chat() takes.
            choice = next((c for c in choices if not c.index), None)
            if choice is None:
                return None
        if choice.finish_reason is not None:
            self._finish = choice.finish_reason
        delta = choice.delta
        if delta is None:
            return None
        if delta.tool_calls:
            for position, call in enumerate(delta.tool_calls):
                self._add_call(position, call)
        elif getattr(delta, "function_call", None) is not None:
            # The deprecated single-call form: one call, its pieces as a tool call's.
            self._add_call(0, _LegacyCall(delta.function_call))
        text = _text_of(delta.content)
        if text:
            self._text.append(text)
        refusal: str | None = getattr(delta, "refusal", None)
        if refusal:
            self._refusal.append(refusal)
            if not self._text:
                return refusal  # the answer's text, as response() makes it: streamed as such
        return text

    def _add_call(self, position: int, call: Any) -> None:
        index = call.index if call.index is not None else position
        entry = self._by_index.get(index)
        # A new id at a known index is a new call: some compatible servers number every
        # call 0 when they send several whole calls.
        function = call.function
        if (
            entry is None
            or (call.id and entry[0] and call.id != entry[0])
            or (not call.id and _another_call(entry, function))
        ):
            entry = [call.id, None, []]
            self._calls.append(entry)
            self._by_index[index] = entry
        elif call.id and not entry[0]:
            entry[0] = call.id
        if function is not None:
            if function.name:
                entry[1] = function.name
            if function.arguments:
                entry[2].append(_arguments(function.arguments))

    def response(self) -> ChatResponse:
        """The whole answer, once the stream has ended with its finish reason."""
        if self._finish is None:
            raise IncompleteResponseError(
                "the OpenAI stream ended without a finish_reason: the answer may be cut short, "
                "so nothing of it is used"
            )
        requests = [
            ToolExecutionRequest(call_id or _new_call_id(), name or "", "".join(parts) or "{}")
            for call_id, name, parts in self._calls
        ]
        text = "".join(self._text) if self._text else None
        reason = self._finish
        if text is None and self._refusal:
            text = "".join(self._refusal)
            reason = "content_filter"
        usage = self._usage
        return ChatResponse(
            AiMessage(text, requests),
            TokenUsage(usage.prompt_tokens, usage.completion_tokens) if usage is not None else None,
            _FINISH_REASONS.get(reason, reason) if reason is not None else None,
        )

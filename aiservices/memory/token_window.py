"""``TokenWindowChatMemory``: keeps the newest messages that fit in a number of tokens."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import ClassVar

from ..messages import ChatMessage
from ..stores._base import ChatMemoryStore
from ._window import Limit, WindowChatMemory, WindowChatMemoryProvider, check_limit
from .tokens import TokenCountEstimator

__all__ = ["TokenWindowChatMemory"]


class TokenWindowChatMemory(WindowChatMemory):
    """Keeps the newest messages whose token counts sum to at most ``max_tokens``.

    The rules are those of ``MessageWindowChatMemory``, counted in tokens. A message is
    never split: one larger than the whole window is kept alone. Each message is counted
    once by ``token_count_estimator``, however many adds and reads follow.
    """

    _limit_name: ClassVar[str] = "max_tokens"

    def __init__(
        self,
        max_tokens: Limit,
        token_count_estimator: TokenCountEstimator,
        *,
        id: Hashable = "default",  # noqa: A002
        store: ChatMemoryStore | None = None,
        always_keep_system_message_first: bool = False,
        evict_whole_turns: bool = False,
    ) -> None:
        self._estimate = _estimate_method(token_count_estimator)
        self._estimator = token_count_estimator
        super().__init__(
            max_tokens,
            id=id,
            store=store,
            always_keep_system_message_first=always_keep_system_message_first,
            evict_whole_turns=evict_whole_turns,
        )

    @property
    def token_count_estimator(self) -> TokenCountEstimator:
        """The estimator that counts each message's tokens."""
        return self._estimator

    def _cost(self, message: ChatMessage) -> int:
        count = self._estimate(message)
        if type(count) is int and count >= 0:
            return count
        raise ValueError(
            f"{type(self._estimator).__name__}.estimate_token_count_in_message returned "
            f"{count!r} for a {type(message).__name__}; it must return an int >= 0"
        )

    @classmethod
    def provider(
        cls,
        max_tokens: Limit,
        token_count_estimator: TokenCountEstimator,
        *,
        store: ChatMemoryStore | None = None,
        always_keep_system_message_first: bool = False,
        evict_whole_turns: bool = False,
    ) -> WindowChatMemoryProvider[TokenWindowChatMemory]:
        """A ``ChatMemoryProvider`` giving each memory id its own memory on one store.

        ``store`` defaults to one new ``InMemoryChatMemoryStore`` shared by every id.
        """
        if not callable(max_tokens):
            check_limit(max_tokens, cls._limit_name)
        _estimate_method(token_count_estimator)

        def make(memory_id: Hashable, shared: ChatMemoryStore) -> TokenWindowChatMemory:
            return cls(
                max_tokens,
                token_count_estimator,
                id=memory_id,
                store=shared,
                always_keep_system_message_first=always_keep_system_message_first,
                evict_whole_turns=evict_whole_turns,
            )

        return WindowChatMemoryProvider.create(cls, make, store, f"max_tokens={max_tokens!r}")


def _estimate_method(estimator: object) -> Callable[[ChatMessage], object]:
    if isinstance(estimator, type):
        raise TypeError(
            f"token_count_estimator must be an estimator object, got the class "
            f"{estimator.__name__}; pass an instance: {estimator.__name__}(...)"
        )
    method = getattr(estimator, "estimate_token_count_in_message", None)
    if not callable(method):
        raise TypeError(
            "token_count_estimator must be a TokenCountEstimator (with "
            f"estimate_token_count_in_message), got {type(estimator).__name__}; "
            "for OpenAI models use OpenAiTokenCountEstimator(model_name)"
        )
    return method  # type: ignore[no-any-return]

"""``TokenWindowChatMemory``: keeps the newest messages that fit in a number of tokens."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from ..messages import ChatMessage
from ..stores._base import ChatMemoryStore
from ._window import Limit, check_limit
from ._window_memory import ReportedUsage, WindowChatMemory, WindowChatMemoryProvider
from .tokens import TokenCountEstimator, counting_waits

__all__ = ["TokenWindowChatMemory"]


class TokenWindowChatMemory(WindowChatMemory):
    """Keeps the newest messages whose token counts sum to at most ``max_tokens``.

    The rules are those of ``MessageWindowChatMemory``, counted in tokens. A message is
    never split: one larger than the whole window is kept alone. Each message is counted
    once by ``token_count_estimator``, however many adds and reads follow.

    With ``calibrate=True`` the memory corrects its estimate with the input tokens the
    provider reported for the last request of a turn (see `observe_usage`), so that
    the window stays within ``max_tokens`` as the model counts them.
    """

    _limit_name = "max_tokens"

    def __init__(
        self,
        max_tokens: Limit,
        token_count_estimator: TokenCountEstimator,
        *,
        id: Hashable = "default",  # noqa: A002
        store: ChatMemoryStore | None = None,
        always_keep_system_message_first: bool = False,
        evict_whole_turns: bool = False,
        calibrate: bool = False,
    ) -> None:
        self._estimate = estimate_method(token_count_estimator)
        self._estimator = token_count_estimator
        super().__init__(
            max_tokens,
            id=id,
            store=store,
            always_keep_system_message_first=always_keep_system_message_first,
            evict_whole_turns=evict_whole_turns,
            count=self._counted,
            calibrate=calibrate,
            count_text=text_method(token_count_estimator),
            counting_waits=counting_waits(token_count_estimator),
        )

    @property
    def token_count_estimator(self) -> TokenCountEstimator:
        """The estimator that counts each message's tokens."""
        return self._estimator

    @property
    def calibration(self) -> float:
        """Provider tokens per estimated token that the window's limit is divided by.

        ``1.0`` until a calibrating memory has observed a turn's usage.
        """
        return self._factor

    def observe_usage(
        self, messages: Sequence[ChatMessage], usage: ReportedUsage, request: object = None
    ) -> None:
        """Learn from the provider's ``usage.input_tokens`` for a request of ``messages``.

        A service calls this after each turn with the turn's last request (``request``, a
        ``ChatRequest``). With ``calibrate=True`` the ratio of the reported count to the
        estimate of the request divides ``max_tokens`` from now on, and what the request
        carries beside its messages (tool definitions, a response schema, estimated as
        text) is left out of the window's share; the window is trimmed to it at the next
        add, in that add's one write, never at a read. Otherwise it does nothing.
        """
        self._observe_usage(messages, usage, request)

    def _counted(self, message: ChatMessage) -> int:
        count = self._estimate(message)
        if type(count) is int and count >= 0:
            return count
        raise count_error(self._estimator, message, count)

    @classmethod
    def provider(
        cls,
        max_tokens: Limit,
        token_count_estimator: TokenCountEstimator,
        *,
        store: ChatMemoryStore | None = None,
        always_keep_system_message_first: bool = False,
        evict_whole_turns: bool = False,
        calibrate: bool = False,
    ) -> WindowChatMemoryProvider[TokenWindowChatMemory]:
        """A ``ChatMemoryProvider`` giving each memory id its own memory on one store.

        ``store`` defaults to one new ``InMemoryChatMemoryStore`` shared by every id.
        """
        if not callable(max_tokens):
            check_limit(max_tokens, cls._limit_name)
        estimate_method(token_count_estimator)

        def make(memory_id: Hashable, shared: ChatMemoryStore) -> TokenWindowChatMemory:
            return cls(
                max_tokens,
                token_count_estimator,
                id=memory_id,
                store=shared,
                always_keep_system_message_first=always_keep_system_message_first,
                evict_whole_turns=evict_whole_turns,
                calibrate=calibrate,
            )

        return WindowChatMemoryProvider.create(cls, make, store, f"max_tokens={max_tokens!r}")


def count_error(estimator: object, message: ChatMessage, count: object) -> ValueError:
    """The error for an estimator that returned ``count``, which is not an int >= 0."""
    return ValueError(
        f"{type(estimator).__name__}.estimate_token_count_in_message returned "
        f"{count!r} for a {type(message).__name__}; it must return an int >= 0"
    )


def text_method(estimator: object) -> Callable[[str], int] | None:
    """The estimator's ``estimate_token_count_in_text``, which only calibration uses: an
    estimator without it counts messages all the same (a request's tools then cost 0)."""
    method = getattr(estimator, "estimate_token_count_in_text", None)
    return method if callable(method) else None


def estimate_method(estimator: object) -> Callable[[ChatMessage], object]:
    """The estimator's ``estimate_token_count_in_message``, or a ``TypeError`` saying why not."""
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

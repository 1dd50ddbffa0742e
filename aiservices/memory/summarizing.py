"""``SummarizingChatMemory``: folds the oldest turns into one summary that a model writes.

The memory is a window memory whose overflow policy, `Summarize`, never evicts: an
add that leaves the window over budget folds the oldest whole turns, with the previous
summary, into a new summary message before its one store write. The summary is an ordinary
``UserMessage`` whose ``message_id`` starts with ``summary-``; it is stored like any message
and shown right after the system message (the window's lead).

Summarising happens inside the add (a service's commit), not at the next read, so that one
write carries the turn, the removal of the folded turns and the new summary, and a read
never has to write. A summariser that fails leaves the fold out of that write: the turn is
stored, the overflow stays in the window, and the next add tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Hashable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from ..messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionResultMessage,
    UserMessage,
    new_message_id,
)
from ..models._base import ChatModel, ChatRequest
from ..stores._base import ChatMemoryStore
from ._window import Limit, Window, check_limit
from ._window_memory import ASK, ReportedUsage, WindowChatMemory, WindowChatMemoryProvider
from .token_window import count_error, estimate_method, text_method
from .tokens import TokenCountEstimator, counting_waits

__all__ = [
    "DEFAULT_SUMMARY_PREFIX",
    "DEFAULT_SUMMARY_PROMPT",
    "SUMMARY_ID_PREFIX",
    "Summarize",
    "SummarizingChatMemory",
    "is_summary",
]
SUMMARY_ID_PREFIX: Final = "summary-"
"""How a summary's ``message_id`` starts: what marks a stored message as the summary."""

DEFAULT_SUMMARY_PROMPT: Final = (
    "You keep a running summary of a conversation between a user and an AI assistant, so "
    "that the assistant can go on without the older messages. Fold the new messages into "
    "the previous summary, if there is one. Keep every fact, name, number, preference, "
    "decision, tool result and open request the assistant may need; leave out greetings and "
    "repetition. Be brief, and answer with the summary only."
)
"""The summariser's instructions (its system message) unless ``prompt=`` is given."""

DEFAULT_SUMMARY_PREFIX: Final = "Summary of the earlier conversation:\n"
"""The text before the summary in the summary message, so the model knows what it reads."""

# Summariser calls one add may make: a summary too long to fit beside the turns kept is
# folded again with the next turns, a bounded number of times.
_MAX_SUMMARIES: Final = 3

_log = logging.getLogger("aiservices.memory")


def is_summary(message: ChatMessage) -> bool:
    """Whether ``message`` is a summary written by a ``SummarizingChatMemory``."""
    mid = message.message_id
    return (
        isinstance(message, UserMessage) and mid is not None and mid.startswith(SUMMARY_ID_PREFIX)
    )


class Summarize:
    """The overflow policy that folds the oldest whole turns into a summary a model writes."""

    evicts_on_read = False  # nothing leaves the window without being summarised

    def __init__(
        self,
        summarizer: ChatModel,
        *,
        down_to: float,
        prompt: str,
        prefix: str,
        counts_tokens: bool,
        label: str,
    ) -> None:
        self.summarizer = summarizer
        self.down_to = down_to
        self.prompt = prompt
        self.prefix = prefix
        self.counts_tokens = counts_tokens
        self.label = label  # names the memory in the log
        self.last_error: Exception | None = None

    def is_lead(self, message: ChatMessage) -> bool:
        return is_summary(message)

    def overflow(
        self, window: Window, limit: int, added: Sequence[ChatMessage]
    ) -> Generator[Any, Any, tuple[list[ChatMessage], list[ChatMessage]]]:
        """Fold the oldest turns (never this add's) until the window fits; the fold's
        messages leave the window and the new summary comes in."""
        msgs = window.msgs
        lead = window.lead
        batch = sum(1 for m in added if not isinstance(m, SystemMessage) and m is not lead)
        base = len(msgs) - batch  # where this add's messages start
        folded = 0  # msgs[:folded] go into `summary`
        summary: ChatMessage | None = None
        summary_cost = window.lead_cost
        guess = summary_cost if lead is not None or self.counts_tokens else 1
        previous = lead
        for _ in range(_MAX_SUMMARIES):
            cut = self._cut(window, limit, base, folded, summary_cost, guess)
            if cut == folded:
                break
            request = self._request(previous, msgs[folded:cut])
            response = yield ASK, (self.summarizer, request)
            try:
                if isinstance(response, Exception):
                    raise response
                made = self._summary_message(response)
                made_cost = window.cost(made)
            except Exception as error:
                self.last_error = error
                _log.warning(
                    "%s: the summariser failed (%s); the turn is stored without a "
                    "summary, and the next add tries again",
                    self.label,
                    type(error).__name__,
                )
                break
            self.last_error = None
            summary, summary_cost, folded, previous = made, made_cost, cut, made
            guess = made_cost
        if summary is None:
            return [], []
        gone = window.drop_front(folded)
        old = window.set_lead(summary, summary_cost)
        if old is not None:
            gone.append(old)
        return gone, [summary]

    def _cut(  # noqa: PLR0917 - private, one caller
        self,
        window: Window,
        limit: int,
        base: int,
        start: int,
        summary_cost: int,
        guess: int,
    ) -> int:
        """Where to fold up to, from ``start``: ``start`` when the window fits.

        A cut falls on a ``UserMessage`` (whole turns), never past the newest one nor into
        the messages this add brings (``base`` on); the first cut that brings the window
        down to ``summarize_down_to`` of ``limit`` wins, else the last allowed one.
        """
        msgs, costs = window.msgs, window.costs
        rest = window.total - sum(costs[:start])
        if window.system_cost + summary_cost + rest <= limit:
            return start
        newest = len(msgs) - 1
        while newest > start and not isinstance(msgs[newest], UserMessage):
            newest -= 1
        stop = min(base, newest)
        target = int(limit * self.down_to)
        fixed = window.system_cost + guess
        best = start
        for i in range(start, stop + 1):
            if i > start and isinstance(msgs[i], UserMessage):
                best = i
                if fixed + rest <= target:
                    break
            rest -= costs[i]
        return best

    def _request(
        self, previous: ChatMessage | None, messages: Sequence[ChatMessage]
    ) -> ChatRequest:
        parts = []
        if previous is not None:
            text = getattr(previous, "text", "") or ""
            parts.append(f"Previous summary:\n{text.removeprefix(self.prefix)}")
        parts.append("New messages:\n" + "\n".join(_transcript(messages)))
        return ChatRequest([SystemMessage(self.prompt), UserMessage("\n\n".join(parts))])

    def _summary_message(self, response: Any) -> UserMessage:
        text = getattr(getattr(response, "ai_message", None), "text", None)
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"the summariser answered with no text: {response!r:.200}")
        return UserMessage(
            self.prefix + text.strip(),
            message_id=SUMMARY_ID_PREFIX + new_message_id(),
            created_at=datetime.now(UTC),
        )


class SummarizingChatMemory(WindowChatMemory):
    """Keeps the newest turns within a budget and a summary of the older ones.

    Give exactly one budget: ``max_messages`` or ``max_tokens`` (with a
    ``token_count_estimator``); either may be a callable taking the memory id. The budget
    covers the system message, the summary and the turns kept. When an add leaves the
    window over it, the oldest whole turns (a ``UserMessage`` and everything that answered
    it) and the previous summary are sent to ``summarizer`` (any ``ChatModel``), whose answer
    becomes the new summary: a ``UserMessage`` reading ``summary_prefix`` + the summary,
    shown right after the system message. Enough turns are folded for the window to drop
    to ``summarize_down_to`` of the budget, so that the next summary is some turns away.

    The newest turn, and any message the same add brings, is never folded: every message
    is stored (and so reaches a store's history) before it is summarised. A summariser that
    raises, or answers with no text, folds nothing: the add stores its messages without the
    fold, the window stays over budget, `last_summary_error` keeps the error, and the
    next add tries again. The system message is always shown first. The summariser is
    called inside the add (a service's commit), under the memory's lock; async callers'
    adds await its ``achat`` when it has one.
    """

    def __init__(
        self,
        *,
        summarizer: ChatModel,
        max_messages: Limit | None = None,
        max_tokens: Limit | None = None,
        token_count_estimator: TokenCountEstimator | None = None,
        id: Hashable = "default",  # noqa: A002
        store: ChatMemoryStore | None = None,
        summarize_down_to: float = 0.5,
        prompt: str = DEFAULT_SUMMARY_PROMPT,
        summary_prefix: str = DEFAULT_SUMMARY_PREFIX,
        calibrate: bool = False,
    ) -> None:
        limit, self._limit_name = _check_options(
            summarizer,
            max_messages,
            max_tokens,
            token_count_estimator,
            summarize_down_to,
            prompt,
            summary_prefix,
            calibrate,
        )
        self._estimator = token_count_estimator
        self._estimate = (
            None if token_count_estimator is None else estimate_method(token_count_estimator)
        )
        self._summarize = Summarize(
            summarizer,
            down_to=float(summarize_down_to),
            prompt=prompt,
            prefix=summary_prefix,
            counts_tokens=token_count_estimator is not None,
            label=f"{type(self).__name__}(id={id!r})",
        )
        super().__init__(
            limit,
            id=id,
            store=store,
            always_keep_system_message_first=True,
            evict_whole_turns=True,
            count=None if self._estimate is None else self._counted,
            calibrate=calibrate,
            policy=self._summarize,
            count_text=text_method(token_count_estimator),
            counting_waits=(
                None if token_count_estimator is None else counting_waits(token_count_estimator)
            ),
        )

    @property
    def summarizer(self) -> ChatModel:
        """The model that writes the summaries."""
        return self._summarize.summarizer

    @property
    def last_summary_error(self) -> Exception | None:
        """The error of the last summariser call that failed; ``None`` after one succeeds."""
        return self._summarize.last_error

    @property
    def token_count_estimator(self) -> TokenCountEstimator | None:
        """The estimator that counts tokens (``None`` for a budget in messages)."""
        return self._estimator

    @property
    def is_blocking(self) -> bool:
        """Always: an add may ask the summarizer, so async callers use `aadd`."""
        return True

    @property
    def calibration(self) -> float:
        """Provider tokens per estimated token that the budget is divided by now."""
        return self._factor

    def observe_usage(
        self, messages: Sequence[ChatMessage], usage: ReportedUsage, request: object = None
    ) -> None:
        """With ``calibrate=True``, learn from the provider's input count for ``messages``.

        As ``TokenWindowChatMemory.observe_usage``: the ratio of ``usage.input_tokens`` to
        the estimate of the request divides ``max_tokens``, less what the request carries
        beside its messages; the next add folds to it.
        """
        self._observe_usage(messages, usage, request)

    def _counted(self, message: ChatMessage) -> int:
        estimate = self._estimate
        assert estimate is not None
        count = estimate(message)
        if type(count) is int and count >= 0:
            return count
        raise count_error(self._estimator, message, count)

    @classmethod
    def provider(
        cls,
        *,
        summarizer: ChatModel,
        max_messages: Limit | None = None,
        max_tokens: Limit | None = None,
        token_count_estimator: TokenCountEstimator | None = None,
        store: ChatMemoryStore | None = None,
        summarize_down_to: float = 0.5,
        prompt: str = DEFAULT_SUMMARY_PROMPT,
        summary_prefix: str = DEFAULT_SUMMARY_PREFIX,
        calibrate: bool = False,
    ) -> WindowChatMemoryProvider[SummarizingChatMemory]:
        """A ``ChatMemoryProvider`` giving each memory id its own memory on one store.

        ``store`` defaults to one new ``InMemoryChatMemoryStore`` shared by every id. The
        options are checked here, once.
        """
        _check_options(
            summarizer,
            max_messages,
            max_tokens,
            token_count_estimator,
            summarize_down_to,
            prompt,
            summary_prefix,
            calibrate,
        )

        def make(memory_id: Hashable, shared: ChatMemoryStore) -> SummarizingChatMemory:
            return cls(
                summarizer=summarizer,
                max_messages=max_messages,
                max_tokens=max_tokens,
                token_count_estimator=token_count_estimator,
                id=memory_id,
                store=shared,
                summarize_down_to=summarize_down_to,
                prompt=prompt,
                summary_prefix=summary_prefix,
                calibrate=calibrate,
            )

        name = "max_tokens" if max_messages is None else "max_messages"
        spec = max_tokens if max_messages is None else max_messages
        return WindowChatMemoryProvider.create(cls, make, store, f"{name}={spec!r}")


def _check_options(  # noqa: PLR0917 - the constructor's options, checked in one place
    summarizer: object,
    max_messages: Limit | None,
    max_tokens: Limit | None,
    estimator: object,
    down_to: object,
    prompt: object,
    prefix: object,
    calibrate: bool,
) -> tuple[Limit, str]:
    """Check a summarising memory's options; return its limit and the limit's name."""
    if isinstance(summarizer, type) or not callable(getattr(summarizer, "chat", None)):
        what = (
            f"the class {summarizer.__name__}"
            if isinstance(summarizer, type)
            else type(summarizer).__name__
        )
        raise TypeError(f"summarizer must be a ChatModel object (with chat(request)), got {what}")
    if isinstance(down_to, bool) or not isinstance(down_to, int | float):
        raise TypeError(f"summarize_down_to must be a number, got {type(down_to).__name__}")
    if not 0 < down_to <= 1:
        raise ValueError(
            f"summarize_down_to must be > 0 and <= 1 (a share of the budget), got {down_to!r}"
        )
    for name, text in (("prompt", prompt), ("summary_prefix", prefix)):
        if not isinstance(text, str):
            raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    if not str(prompt).strip():
        raise ValueError("prompt must not be empty: it tells the summariser what to write")
    if (max_messages is None) == (max_tokens is None):
        raise TypeError(
            "SummarizingChatMemory needs one budget: max_messages=... or max_tokens=... "
            f"(got {'both' if max_messages is not None else 'neither'})"
        )
    if max_messages is not None:
        if estimator is not None:
            raise TypeError(
                "token_count_estimator counts tokens: pass it with max_tokens, not max_messages"
            )
        if calibrate:
            raise TypeError("calibrate=True corrects token counts: it needs max_tokens")
        if not callable(max_messages):
            check_limit(max_messages, "max_messages")
        return max_messages, "max_messages"
    assert max_tokens is not None
    if estimator is None:
        raise TypeError(
            "max_tokens needs a token_count_estimator (for OpenAI models "
            "OpenAiTokenCountEstimator(model_name))"
        )
    estimate_method(estimator)
    if not callable(max_tokens):
        check_limit(max_tokens, "max_tokens")
    return max_tokens, "max_tokens"


def _transcript(messages: Iterable[ChatMessage]) -> list[str]:
    lines: list[str] = []
    for m in messages:
        if isinstance(m, UserMessage):
            who = "User" if m.name is None else f"User ({m.name})"
            lines.append(f"{who}: {m.text}")
        elif isinstance(m, AiMessage):
            if m.text:
                lines.append(f"Assistant: {m.text}")
            lines.extend(
                f"Assistant called tool {r.name} with {r.arguments}"
                for r in m.tool_execution_requests
            )
        elif isinstance(m, ToolExecutionResultMessage):
            lines.append(f"Tool {m.tool_name} returned: {m.text}")
        else:
            lines.append(f"System: {m.text}")
    return lines

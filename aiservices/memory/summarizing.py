"""``SummarizingChatMemory``: folds the oldest turns into one summary that a model writes.

The memory is the window engine with two changes: it never evicts on its own (its ``_trim``
evicts nothing), and an add that leaves the window over budget folds the oldest whole turns,
with the previous summary, into a new summary message before its one store write. The
summary is an ordinary ``UserMessage`` whose ``message_id`` starts with ``summary-``; it is
stored like any message and shown right after the system message.

Summarising happens inside the add (a service's commit), not at the next read, so that one
write carries the turn, the removal of the folded turns and the new summary, and a read
never has to write. A summariser that fails leaves the fold out of that write: the turn is
stored, the overflow stays in the window, and the next add tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Hashable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Final, cast

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
from ._window import (
    AsyncMode,
    Limit,
    ReportedUsage,
    StoreWrite,
    WindowChatMemory,
    WindowChatMemoryProvider,
    WindowState,
    acquire_polling,
    check_limit,
    check_messages,
    decrement,
    holds,
    message_key,
)
from .token_window import count_error, estimate_method
from .tokens import TokenCountEstimator

__all__ = [
    "DEFAULT_SUMMARY_PREFIX",
    "DEFAULT_SUMMARY_PROMPT",
    "SUMMARY_ID_PREFIX",
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

_READ: Final = 0
_SUMMARIZE: Final = 1
_WRITE: Final = 2

_log = logging.getLogger("aiservices.memory")


class _SummaryState(WindowState):
    """A window's state with a summary, shown right after the system message."""

    __slots__ = ("summary", "summary_cost")

    def __init__(self) -> None:
        super().__init__()
        self.summary: ChatMessage | None = None
        self.summary_cost = 0

    def snapshot(self) -> list[ChatMessage]:
        out = super().snapshot()
        if self.summary is not None:
            out.insert(0 if self.system is None else self.system_pos + 1, self.summary)
        return out


def is_summary(message: ChatMessage) -> bool:
    """Whether ``message`` is a summary written by a ``SummarizingChatMemory``."""
    mid = message.message_id
    return (
        isinstance(message, UserMessage) and mid is not None and mid.startswith(SUMMARY_ID_PREFIX)
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
    fold, the window stays over budget, :attr:`last_summary_error` keeps the error, and the
    next add tries again. The system message is always shown first.
    """

    _state_type = _SummaryState

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
        self._summarizer = summarizer
        self._down_to = float(summarize_down_to)
        self._prompt = prompt
        self._prefix = summary_prefix
        self.last_summary_error: Exception | None = None
        """The error of the last summariser call that failed; ``None`` after one succeeds."""
        super().__init__(
            limit,
            id=id,
            store=store,
            always_keep_system_message_first=True,
            evict_whole_turns=True,
            calibrate=calibrate,
        )

    @property
    def summarizer(self) -> ChatModel:
        """The model that writes the summaries."""
        return self._summarizer

    @property
    def token_count_estimator(self) -> TokenCountEstimator | None:
        """The estimator that counts tokens (``None`` for a budget in messages)."""
        return self._estimator

    @property
    def is_blocking(self) -> bool:
        """Always: an add may ask the summarizer, so async callers use :meth:`aadd`."""
        return True

    @property
    def calibration(self) -> float:
        """Provider tokens per estimated token that the budget is divided by now."""
        return self._factor

    def observe_usage(self, messages: Sequence[ChatMessage], usage: ReportedUsage) -> None:
        """With ``calibrate=True``, learn from the provider's input count for ``messages``.

        As ``TokenWindowChatMemory.observe_usage``: the ratio of ``usage.input_tokens`` to
        the estimate of ``messages`` divides ``max_tokens``; the next add folds to it.
        """
        self._observe_usage(messages, usage)

    # The ChatMemory protocol: messages(), set() and clear() are the engine's.

    def add(self, *messages: ChatMessage) -> None:
        """Add messages in order with one store write, folding old turns if over budget.

        The summariser, when needed, is called here, under the memory's lock.
        """
        if not messages:
            return
        check_messages(messages, "add")
        with self._lock:
            steps = self._adding(messages)
            value: Any = None
            try:
                while True:
                    op, argument = steps.send(value)
                    if op == _READ:
                        value = self._get(self._id)
                    elif op == _SUMMARIZE:
                        try:
                            value = self._summarizer.chat(argument)
                        except Exception as error:  # handed to the add, which keeps the turn
                            value = error
                    else:
                        self._write(argument)
                        value = None
            except StopIteration:
                return
            except BaseException:
                self._state = None
                raise

    async def aadd(self, *messages: ChatMessage) -> None:
        """:meth:`add` for async callers: awaits the summariser's ``achat`` when it has one."""
        if not messages:
            return
        check_messages(messages, "add")
        await acquire_polling(self._lock)
        try:
            steps = self._adding(messages)
            value: Any = None
            try:
                while True:
                    op, argument = steps.send(value)
                    if op == _READ:
                        value = await self._aread()
                    elif op == _SUMMARIZE:
                        value = await self._asummarize(argument)
                    else:
                        await self._awrite(argument)
                        value = None
            except StopIteration:
                return
            except BaseException:
                self._state = None
                raise
        finally:
            self._lock.release()

    # The engine's hooks.

    def _cost(self, message: ChatMessage) -> int:
        estimate = self._estimate
        if estimate is None:
            return 1
        count = estimate(message)
        if type(count) is int and count >= 0:
            return count
        raise count_error(self._estimator, message, count)

    def _trim(self, state: WindowState, limit: int) -> list[ChatMessage]:
        # Nothing leaves the window without being summarised: folding is the add's job.
        state.limit = limit
        return []

    def _build(
        self, messages: Sequence[ChatMessage], limit: int, *, from_store: bool
    ) -> _SummaryState:
        summary: ChatMessage | None = None
        extra: list[str] = []
        others: list[ChatMessage] = []
        for m in messages:
            if is_summary(m):
                if summary is not None and summary.message_id is not None:
                    extra.append(summary.message_id)  # several writers: the last one wins
                summary = m
            else:
                others.append(m)
        if summary is None:
            return cast(_SummaryState, super()._build(messages, limit, from_store=from_store))
        state = cast(_SummaryState, super()._build(others, limit, from_store=from_store))
        key = message_key(summary)
        old = self._state
        cost = old.known.get(key) if old is not None else None
        if cost is None:
            cost = self._cost(summary)
        state.known[key] = cost
        state.summary = summary
        state.summary_cost = cost
        if from_store:
            state.pending += extra
        return state

    def _refresh(self, stored: Sequence[ChatMessage], limit: int) -> WindowState:
        state = cast(_SummaryState | None, self._state)
        if state is not None and state.limit == limit and not state.pending and not state.rewrite:
            summary = state.summary
            if summary is None:
                if holds(state, stored):
                    return state
            else:
                sid = summary.message_id
                others = [m for m in stored if m is not summary and m.message_id != sid]
                if len(others) == len(stored) - 1 and holds(state, others):
                    return state
        return self._build(stored, limit, from_store=True)

    # An add, as steps: yields (_READ, None) for the stored messages, (_SUMMARIZE, request)
    # for the summariser's response (or the exception it raised), and (_WRITE, write).

    def _adding(self, messages: Sequence[ChatMessage]) -> Generator[tuple[int, Any], Any, None]:
        limit = self._read_limit()
        state = cast(_SummaryState | None, self._state)
        if state is None:
            stored = yield _READ, None
            state = self._state = self._build(stored, limit, from_store=True)
        incoming: ChatMessage | None = None
        if any(is_summary(m) for m in messages):
            # A copied conversation (``add(*other.messages())``): its summary is the summary.
            for m in messages:
                if is_summary(m):
                    incoming = m
            messages = [m for m in messages if not is_summary(m)]
        base = len(state.msgs)
        write = self._stage(messages, state, limit)
        if incoming is not None and (
            state.summary is None or incoming.message_id != state.summary.message_id
        ):
            write = write or StoreWrite(None, [], [])
            self._replace_summary(state, incoming, self._cost(incoming), write)
        if write is None:
            return

        folded = 0  # state.msgs[:folded] go into `summary`
        summary: ChatMessage | None = None
        summary_cost = state.summary_cost
        guess = summary_cost if state.summary is not None or self._estimate is not None else 1
        previous = state.summary
        for _ in range(_MAX_SUMMARIES):
            cut = self._cut(state, limit, base, folded, summary_cost, guess)
            if cut == folded:
                break
            response = yield _SUMMARIZE, self._request(previous, state.msgs[folded:cut])
            try:
                if isinstance(response, Exception):
                    raise response
                made = self._summary_message(response)
                made_cost = self._cost(made)
            except Exception as error:
                self.last_summary_error = error
                _log.warning(
                    "%s(id=%r): the summariser failed (%s); the turn is stored without a "
                    "summary, and the next add tries again",
                    type(self).__name__,
                    self._id,
                    type(error).__name__,
                )
                break
            self.last_summary_error = None
            summary, summary_cost, folded, previous = made, made_cost, cut, made
            guess = made_cost
        if summary is not None:
            write = self._fold(state, folded, summary, summary_cost, write)
        yield _WRITE, write

    def _cut(  # noqa: PLR0917 - private, one caller
        self,
        state: _SummaryState,
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
        msgs, costs = state.msgs, state.costs
        rest = state.total - sum(costs[:start])
        if state.system_cost + summary_cost + rest <= limit:
            return start
        newest = len(msgs) - 1
        while newest > start and not isinstance(msgs[newest], UserMessage):
            newest -= 1
        stop = min(base, newest)
        target = int(limit * self._down_to)
        fixed = state.system_cost + guess
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
            parts.append(f"Previous summary:\n{text.removeprefix(self._prefix)}")
        parts.append("New messages:\n" + "\n".join(_transcript(messages)))
        return ChatRequest([SystemMessage(self._prompt), UserMessage("\n\n".join(parts))])

    def _summary_message(self, response: Any) -> UserMessage:
        text = getattr(getattr(response, "ai_message", None), "text", None)
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"the summariser answered with no text: {response!r:.200}")
        return UserMessage(
            self._prefix + text.strip(),
            message_id=SUMMARY_ID_PREFIX + new_message_id(),
            created_at=datetime.now(UTC),
        )

    def _fold(
        self, state: _SummaryState, k: int, summary: ChatMessage, cost: int, write: StoreWrite
    ) -> StoreWrite:
        """Replace ``state.msgs[:k]`` and the old summary with ``summary``; the write for it."""
        msgs, costs, known = state.msgs, state.costs, state.known
        folded = msgs[:k]
        state.total -= sum(costs[:k])
        del msgs[:k], costs[:k]
        gone = self._gone
        removed: list[str] = []
        whole = write.full is not None or self._apply is None
        for m in folded:
            if isinstance(m, ToolExecutionResultMessage):
                decrement(state.answered, m.id)
            elif isinstance(m, AiMessage):
                for r in m.tool_execution_requests:
                    decrement(state.open, r.id)
            key = message_key(m)
            folded_cost = known.pop(key, None)
            if gone is not None and folded_cost is not None:
                gone[key] = folded_cost
            if m.message_id is None:
                whole = True
            else:
                removed.append(m.message_id)
        self._replace_summary(state, summary, cost, write)
        if whole:
            return StoreWrite(state.snapshot(), [], [])
        write.removed = [*write.removed, *removed]
        return write

    def _replace_summary(
        self, state: _SummaryState, summary: ChatMessage, cost: int, write: StoreWrite
    ) -> None:
        old = state.summary
        if old is not None:
            state.known.pop(message_key(old), None)
            if any(m is old for m in write.appended):
                # Brought by this very add: it never reaches the store.
                write.appended = [m for m in write.appended if m is not old]
            elif old.message_id is not None:
                write.removed = [*write.removed, old.message_id]
        state.summary = summary
        state.summary_cost = cost
        state.known[message_key(summary)] = cost
        if write.full is not None:
            write.full = state.snapshot()
        else:
            write.appended = [*write.appended, summary]

    # Store I/O.

    def _write(self, write: StoreWrite) -> None:
        if write.full is None and self._apply is not None:
            self._apply(self._id, appended=write.appended, removed=write.removed)
        else:
            self._update(self._id, write.full or [])

    async def _aread(self) -> list[ChatMessage]:
        import asyncio

        if self._async is AsyncMode.DIRECT:
            return self._get(self._id)
        if self._async is AsyncMode.THREAD:
            return await asyncio.to_thread(self._get, self._id)
        stored: list[ChatMessage] = await self._store.aget_messages(  # type: ignore[attr-defined]
            self._id
        )
        return stored

    async def _awrite(self, write: StoreWrite) -> None:
        import asyncio

        if self._async is AsyncMode.DIRECT:
            return self._write(write)
        if self._async is AsyncMode.THREAD:
            return await asyncio.to_thread(self._write, write)
        store: Any = self._store
        if write.full is None:
            await store.aapply_changes(self._id, appended=write.appended, removed=write.removed)
        else:
            await store.aupdate_messages(self._id, write.full)
        return None

    async def _asummarize(self, request: Any) -> Any:
        import asyncio

        try:
            achat = getattr(self._summarizer, "achat", None)
            if achat is not None:
                return await achat(request)
            return await asyncio.to_thread(self._summarizer.chat, request)
        except Exception as error:  # handed to the add, which keeps the turn
            return error

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

"""What stores share beyond the protocol: history entries, store errors, message-id checks."""

from __future__ import annotations

import contextlib
import math
import operator
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ParamSpec, Protocol, TypeVar, cast, runtime_checkable

from .._threads import in_thread
from ..errors import AiServiceError
from ..messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionResultMessage,
    UserMessage,
    message_from_json,
    message_to_json,
    messages_from_texts,
    new_message_id,
)
from ._base import ChatMemoryStore

__all__ = [
    "ChatHistoryStore",
    "CorruptMessageError",
    "HistoryEntry",
    "MessageCache",
    "StoreSchemaError",
    "UpdatePlan",
    "WindowRead",
    "appended_ids",
    "check_appended",
    "check_retention",
    "check_seconds",
    "check_unique_ids",
    "duplicate_id_error",
    "parse_messages",
    "plan_update",
    "purge_interval",
    "thread_call",
    "window_since",
    "with_message_ids",
]


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One recorded message and when it left the memory's window (``None``: it is still in)."""

    message: ChatMessage
    evicted_at: datetime | None = None

    @property
    def evicted(self) -> bool:
        """Whether the message has left the window."""
        return self.evicted_at is not None


@runtime_checkable
class ChatHistoryStore(ChatMemoryStore, Protocol):
    """A store that can keep the whole transcript beside the window."""

    def get_history(self, memory_id: Hashable) -> list[HistoryEntry]:
        """Every message recorded for ``memory_id`` and kept, in order, evicted ones marked."""
        ...

    def forget(self, memory_id: Hashable) -> None:
        """Erase the conversation's window and history."""
        ...


_P = ParamSpec("_P")
_T = TypeVar("_T")


async def thread_call(function: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """``function(*args, **kwargs)`` in a worker thread, for a store's async methods.

    A caller cancelled meanwhile gets its ``CancelledError`` only once the function has
    ended: a thread can't be stopped, and a memory that heard of the cancellation at once
    would let the next turn run while this write still lands.
    """
    return cast("_T", await in_thread(function, *args, **kwargs))


def check_retention(retention: object) -> timedelta | None:
    """``retention`` as a store's retention period, or a clear error."""
    if retention is None:
        return None
    if not isinstance(retention, timedelta):
        raise TypeError(
            f"retention must be a datetime.timedelta (e.g. timedelta(days=30)) or None, got "
            f"{type(retention).__name__}"
        )
    if retention <= timedelta(0):
        raise ValueError(f"retention must be a positive period, got {retention!r}")
    return retention


def check_seconds(
    name: str, value: object, *, zero: bool = False, none: str | None = None
) -> float | None:
    """``value`` of the option ``name`` as seconds, or a clear error.

    ``zero``: 0 is allowed; ``none``: what ``None`` means for the option, where it is allowed.
    """
    if value is None and none is not None:
        return None
    wanted = f"a finite number of seconds {'>= 0' if zero else '> 0'}"
    if none is not None:
        wanted += f", or None ({none})"
    if isinstance(value, bool) or not isinstance(value, int | float):
        hint = ""
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                hint = f"; pass it as a number: {name}={float(value)!r}"
        raise TypeError(f"{name} must be {wanted}, not {type(value).__name__} {value!r}{hint}")
    # NaN fails both comparisons; infinity would overflow the waits it is given to.
    if not (math.isfinite(value) and (value >= 0 if zero else value > 0)):
        raise ValueError(f"{name} must be {wanted}, got {value!r}")
    return float(value)


def purge_interval(retention: timedelta) -> float:
    """Seconds between purges for a retention period: a tenth of it, at most an hour."""
    return min(retention.total_seconds() / 10, 3600.0)


class CorruptMessageError(AiServiceError, ValueError):
    """A stored message could not be read back; nothing of the conversation was returned.

    ``memory_id`` is the conversation and ``row`` where the bad message is kept (for SQLite,
    the ``seq`` of its row), so that it can be repaired or deleted by hand; ``hint`` says how.
    """

    def __init__(self, memory_id: Hashable, row: object, reason: str, *, hint: str = "") -> None:
        message = f"stored message at row {row} of conversation {memory_id!r} is corrupt: {reason}"
        super().__init__(f"{message}; {hint}" if hint else message)
        self.memory_id = memory_id
        self.row = row
        self.reason = reason


class StoreSchemaError(AiServiceError, RuntimeError):
    """The store's tables were written by another version of aiservices, or by someone else."""


_ONE_MESSAGE = SystemMessage | UserMessage | AiMessage | ToolExecutionResultMessage


def not_a_list_error(name: str, value: object, items: str) -> TypeError:
    """The error for a text or a single message passed where a list of ``items`` is wanted.

    A str is a sequence of its characters, and a message one of its fields: taken as a list,
    either would become items that were never meant.
    """
    shown = repr(value)
    shown = shown if len(shown) <= 60 else f"{shown[:57]}..."
    what = "one message" if isinstance(value, _ONE_MESSAGE) else type(value).__name__
    return TypeError(
        f"{name} must be a list of {items}, not {what} {shown}; put it in a list ([...]) "
        "if it is one of them"
    )


def with_message_ids(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """``messages`` as a new list, each message without a ``message_id`` given a fresh one."""
    if isinstance(messages, str | bytes | _ONE_MESSAGE):
        raise not_a_list_error("messages", messages, "chat messages")
    return [
        m if m.message_id is not None else m.with_metadata(message_id=new_message_id())
        for m in messages
    ]


def check_appended(appended: Sequence[ChatMessage]) -> None:
    """Raise ``ValueError`` unless every appended message has its own ``message_id``."""
    for i, m in enumerate(appended):
        if m.message_id is None:
            raise ValueError(
                f"apply_changes needs a message_id on every appended message; appended[{i}] "
                f"({type(m).__name__}) has none. Give it one with "
                "message.with_metadata(message_id=new_message_id())"
            )
    if len(appended) > 1:
        check_unique_ids(appended)


_message_id = operator.attrgetter("message_id")


def appended_ids(
    appended: Sequence[ChatMessage], removed: Collection[str] | None = None
) -> list[str]:
    """The ``message_id`` of each appended message, checked as `check_appended` does;
    ``removed``, if given, is checked to be ids rather than one text."""
    if type(removed) is str:  # one type test: this runs on every turn
        raise not_a_list_error("removed", removed, "message ids")
    try:
        new_ids = list(map(_message_id, appended))
    except AttributeError:
        if isinstance(appended, str | bytes | _ONE_MESSAGE):
            raise not_a_list_error("appended", appended, "chat messages") from None
        raise
    # The common case, every id present and distinct, is told apart without a loop in Python.
    n = len(new_ids)
    if None in new_ids or (
        n > 1 and (new_ids[0] == new_ids[1] if n == 2 else len(set(new_ids)) < n)
    ):
        check_appended(appended)  # raises, saying which message is wrong
    return cast("list[str]", new_ids)


def check_unique_ids(messages: Sequence[ChatMessage]) -> None:
    """Raise ``ValueError`` if two of ``messages`` share a ``message_id``."""
    seen: set[str | None] = set()
    for m in messages:
        mid = m.message_id
        if mid in seen:
            raise duplicate_id_error(mid)
        seen.add(mid)


def duplicate_id_error(message_id: str | None, memory_id: Hashable | None = None) -> ValueError:
    """The error for a ``message_id`` that would appear twice in one conversation."""
    where = "the same messages" if memory_id is None else f"conversation {memory_id!r}"
    return ValueError(
        f"message_id {message_id!r} appears twice in {where}; each message of a conversation "
        "needs its own id (a copy can get a new one with "
        "message.with_metadata(message_id=new_message_id()))"
    )


class MessageCache:
    """Messages parsed from stored JSON, looked up by that JSON text.

    Messages are immutable, so equal text always gives an equal message: a cached one is
    never stale, whoever wrote the row. A turn reads back the window the last turn read (or
    wrote), so nearly every row is found here and only new ones are parsed. Two generations
    bound the memory: a lookup moves an entry into the young one, and when the young one
    holds ``max_entries`` messages or ``max_chars`` characters of JSON, the old one is
    dropped and the young one becomes old.
    """

    __slots__ = ("_chars", "_old", "_young", "max_chars", "max_entries")

    def __init__(self, max_entries: int = 10_000, max_chars: int = 2_000_000) -> None:
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._young: dict[object, ChatMessage] = {}
        self._old: dict[object, ChatMessage] = {}
        self._chars = 0

    def parse(
        self, texts: Sequence[object], corrupt: Callable[[int, str], Exception]
    ) -> list[ChatMessage]:
        """The messages of ``texts``; a text that does not parse raises ``corrupt(i, why)``."""
        get = self._young.get
        found = [get(text) for text in texts]
        if None not in found:
            return found  # type: ignore[return-value]
        missing: list[int] = []
        old = self._old
        for i, hit in enumerate(found):
            if hit is None:
                message = old.get(texts[i])
                if message is None:
                    missing.append(i)
                else:
                    found[i] = message
                    self._add(texts[i], message)
        if missing:
            parsed = parse_messages([texts[i] for i in missing], corrupt, missing)
            for i, message in zip(missing, parsed, strict=True):
                found[i] = message
                self._add(texts[i], message)
        return found  # type: ignore[return-value]

    def remember(self, texts: Sequence[str], messages: Sequence[ChatMessage]) -> None:
        """Keep messages just written, so that reading them back parses nothing."""
        for text, message in zip(texts, messages, strict=True):
            self._add(text, message)

    def _add(self, text: object, message: ChatMessage) -> None:
        self._young[text] = message
        self._chars += len(text) if isinstance(text, str | bytes) else 1
        if self._chars >= self.max_chars or len(self._young) >= self.max_entries:
            self._old, self._young, self._chars = self._young, {}, 0


def parse_messages(
    texts: Sequence[object],
    corrupt: Callable[[int, str], Exception],
    positions: Sequence[int] | None = None,
) -> list[ChatMessage]:
    """Parse one stored message per text; a bad one raises ``corrupt(position, why)``.

    ``positions`` maps each text to the position reported (its index, by default).
    """
    # One call parses every text, each on its own (so one holding part of a message, or
    # two, fails whatever its neighbours hold), as fast as one parse of the texts joined.
    # On failure, text by text finds the bad one and says why.
    try:
        return messages_from_texts(texts)
    except ValueError:
        pass
    result = []
    for i, text in enumerate(texts):
        at = i if positions is None else positions[i]
        if not isinstance(text, str | bytes):
            raise corrupt(at, f"not text but {text!r}")
        try:
            result.append(message_from_json(text))
        except ValueError as exc:
            raise corrupt(at, str(exc)) from None
    return result


class WindowRead:
    """What a store's read of a window keeps for the next read of the same conversation.

    ``after`` is the highest sequence number read; ``marks`` tell the rows apart (message
    ids, or sequence numbers where those are never reused) in step with ``messages``.
    ``version`` is what a checked write compares with the conversation as it is then: the
    number of the window's newest row (-1: none) unless the store says otherwise.
    """

    __slots__ = ("after", "marks", "messages", "version")

    def __init__(
        self, after: int, marks: list[object], messages: list[ChatMessage], version: int
    ) -> None:
        self.after = after
        self.marks = marks
        self.messages = messages
        self.version = version

    def at(self, version: int) -> WindowRead:
        """The same read, as of ``version``: what a checked write returns."""
        return (
            self
            if version == self.version
            else WindowRead(self.after, self.marks, self.messages, version)
        )


def window_since(
    rows: Sequence[tuple[int, object, object]],
    since: object,
    parse: Callable[[list[int]], list[ChatMessage]],
    version: int | None = None,
) -> tuple[list[ChatMessage], WindowRead] | None:
    """The window from ``rows`` of ``(seq, mark, text)``, oldest first, reusing ``since``.

    A row's text is ``None`` at or below ``since.after``: its message is the one ``since``
    holds under the same mark. ``parse(indexes)`` parses the texts of those rows that have
    one. ``None`` when a row below the mark is not held (another writer numbered it lower):
    the caller reads the window whole. ``version`` is the read's (by default the newest
    row's number).
    """
    held = since if isinstance(since, WindowRead) else None
    marks = [row[1] for row in rows]
    floor = -1 if held is None else held.after
    if version is None:
        version = rows[-1][0] if rows else -1
    if not rows:
        return [], WindowRead(floor, marks, [], version)
    last = rows[-1][0]
    if held is not None and last <= floor and marks == held.marks:
        return held.messages.copy(), held.at(version)
    by_mark = {} if held is None else dict(zip(held.marks, held.messages, strict=True))
    out: list[ChatMessage | None] = []
    todo: list[int] = []
    for i, (_, mark, text) in enumerate(rows):
        if text is None:
            message = by_mark.get(mark)
            if message is None:
                return None
            out.append(message)
        else:
            todo.append(i)
            out.append(None)
    if todo:
        for i, message in zip(todo, parse(todo), strict=True):
            out[i] = message
    messages: list[ChatMessage] = out  # type: ignore[assignment]
    return messages.copy(), WindowRead(max(last, floor), marks, messages, version)


@dataclass(frozen=True, slots=True)
class UpdatePlan:
    """What ``update_messages`` changes in a stored window to make it the wanted one.

    ``removed`` leave the window (to history, where kept); ``changed`` are stored under an
    id wanted with another text (the stored text goes to history); the stored messages
    wanted unchanged stay where they are when they lead the wanted ones in order
    (``rewrite`` false), else every wanted message is written again in the wanted order
    (``rewrite`` true; a staying message goes to history neither way). ``fresh`` is where
    the wanted messages to write begin: after the staying ones, or 0 with ``rewrite``.
    """

    removed: list[str]
    changed: list[str]
    staying: list[str]
    rewrite: bool
    fresh: int


def plan_update(stored: Sequence[tuple[Any, Any]], wanted: Sequence[tuple[Any, Any]]) -> UpdatePlan:
    """Plan an update from the stored ``(message_id, text)`` rows to the wanted ones."""
    want = dict(wanted)
    removed: list[str] = []
    changed: list[str] = []
    staying: list[str] = []
    for mid, text in stored:
        if mid not in want:
            removed.append(mid)
        elif want[mid] != text and not _same_message(text, want[mid]):
            changed.append(mid)
        else:
            staying.append(mid)
    lead = [mid for mid, _ in wanted[: len(staying)]] == staying
    return UpdatePlan(removed, changed, staying, not lead, len(staying) if lead else 0)


def _same_message(stored: object, wanted: object) -> bool:
    """Whether a stored text holds the wanted message in another form (written by an
    earlier version that ordered its keys otherwise)."""
    if not isinstance(stored, str):
        return False
    try:
        return message_to_json(message_from_json(stored)) == wanted
    except ValueError:
        return False

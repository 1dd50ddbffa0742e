"""The window: a conversation's kept messages under the rules, knowing nothing of stores.

A window holds the system message apart (with the number of messages before it), an
optional *lead* message shown right after it (a summary), and the other messages in order,
each with its cost: 1 in a message window, its tokens in a token window. Eviction takes
whole *units* from the front: a message; an ``AiMessage`` with tool requests together with
the tool results that follow it; or, with whole turns, a ``UserMessage`` and everything up
to the next one. What happens to the units that no longer fit is an overflow policy's
choice: `Evict` drops them; a summarising memory folds them into its lead.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from operator import is_
from typing import Any, Protocol, TypeAlias

from ..messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionResultMessage,
    UserMessage,
    new_message_id,
)

__all__ = [
    "Evict",
    "Limit",
    "OverflowPolicy",
    "Window",
    "check_limit",
    "check_messages",
    "message_key",
]

Limit: TypeAlias = int | Callable[[Any], int]
"""A window's size: a number, or a callable taking the memory id, read at every add and read."""

_MESSAGE_TYPES = (SystemMessage, UserMessage, AiMessage, ToolExecutionResultMessage)
_KINDS = frozenset(_MESSAGE_TYPES)

# A message's kind, looked up by its exact type (a subclass is found by isinstance).
_SYSTEM, _USER, _AI, _RESULT = "system", "user", "ai", "result"
_KIND: dict[type, str] = {
    SystemMessage: _SYSTEM,
    UserMessage: _USER,
    AiMessage: _AI,
    ToolExecutionResultMessage: _RESULT,
}


def _kind(message: ChatMessage) -> str:
    for kind, name in _KIND.items():
        if isinstance(message, kind):
            return name
    raise TypeError(f"not a chat message: {type(message).__name__}")


def check_limit(value: object, name: str, *, source: str | None = None) -> int:
    """``value`` as a window size, or a clear error; ``source`` names the callable it came from."""
    number: int
    if type(value) is int:
        number = value
    else:
        index: Any = getattr(type(value), "__index__", None)
        if index is None or isinstance(value, bool):
            where = f"{source} returned" if source else f"{name} must be an int or a callable, got"
            unit = "tokens" if name == "max_tokens" else "messages"
            raise TypeError(
                f"{where} {value!r} ({type(value).__name__}); {name} is a whole number of {unit}"
            )
        number = index(value)
    if number < 1:
        where = f"{source} returned {number}" if source else f"got {number}"
        raise ValueError(
            f"{name} must be at least 1 ({where}): a window needs room for one message; "
            "for a conversation without memory, give the service no memory"
        )
    return number


def check_messages(messages: Sequence[object], method: str) -> None:
    """Raise ``TypeError`` unless every item is a chat message."""
    if _KINDS.issuperset(map(type, messages)):
        return
    for i, m in enumerate(messages):
        if not isinstance(m, _MESSAGE_TYPES):
            hint = " (wrap text in UserMessage(...))" if isinstance(m, str) else ""
            raise TypeError(
                f"{method}() takes chat messages; item {i} is a {type(m).__name__}: {m!r:.60}{hint}"
            )


def message_key(message: ChatMessage) -> object:
    """What a window files a message's cost under: its id, or the message when it has none."""
    mid = message.message_id
    return message if mid is None else mid


class Window:
    """The messages a conversation's model is shown, and the rules that keep them in a limit.

    ``count`` gives a message's cost (``None``: every message costs 1); ``costs`` is the
    memory's record of costs by `message_key`, so a message is counted once however
    often the window is rebuilt. ``is_lead`` tells which stored message is the lead.
    """

    __slots__ = (
        "answered",
        "costs",
        "count",
        "keep_system_first",
        "known",
        "lead",
        "lead_cost",
        "limit",
        "msgs",
        "opened",
        "system",
        "system_cost",
        "system_pos",
        "total",
        "whole_turns",
    )

    def __init__(
        self,
        count: Callable[[ChatMessage], int] | None,
        known: dict[object, int],
        *,
        keep_system_first: bool,
        whole_turns: bool,
    ) -> None:
        self.count = count
        self.known = known  # cost by message_key of every message in the window
        self.keep_system_first = keep_system_first
        self.whole_turns = whole_turns
        self.msgs: list[ChatMessage] = []  # the units' messages, oldest first
        self.costs: list[int] = []  # in step with msgs
        self.total = 0  # sum(costs)
        self.system: SystemMessage | None = None
        self.system_cost = 0
        self.system_pos = 0  # how many of msgs come before the system message
        self.lead: ChatMessage | None = None
        self.lead_cost = 0
        self.opened: dict[str, int] = {}  # tool request id -> AiMessages in msgs asking it
        self.answered: dict[str, int] = {}  # tool request id -> tool results in msgs
        self.limit = 0  # the limit the window was last trimmed to

    def cost(self, message: ChatMessage) -> int:
        """The message's cost, counted at most once."""
        count = self.count
        if count is None:
            return 1
        key = message_key(message)
        cost = self.known.get(key)
        return count(message) if cost is None else cost

    def snapshot(self) -> list[ChatMessage]:
        """The window's messages in the order the model sees them."""
        out = self.msgs.copy()
        system, lead = self.system, self.lead
        if system is not None:
            out.insert(self.system_pos, system)
            if lead is not None:
                out.insert(self.system_pos + 1, lead)
        elif lead is not None:
            out.insert(0, lead)
        return out

    def holds(self, stored: Sequence[ChatMessage]) -> bool:
        """Whether ``stored`` is this window, message for message (the same objects)."""
        mine = self.msgs if self.system is None and self.lead is None else self.snapshot()
        if len(stored) != len(mine):
            return False
        if all(map(is_, stored, mine)) or all(map(_same, stored, mine)):
            return True
        # A store keeps the system message and the lead where they were appended; a window
        # shows the lead after the system message, and the system message first when kept
        # first. Only those may stand elsewhere (any other order is a rewrite by another
        # writer, which the window must show).
        moved = [m for m in (self.system if self.keep_system_first else None, self.lead) if m]
        if not moved or not all(any(m is x for m in stored) for x in moved):
            return False  # (so that both sides below are as much shorter)
        return all(map(is_, _without(stored, moved), _without(mine, moved)))

    def load(
        self,
        messages: Sequence[ChatMessage],
        is_lead: Callable[[ChatMessage], bool] | None,
        previous: Sequence[ChatMessage] = (),
    ) -> list[ChatMessage]:
        """Fill an empty window with ``messages``; return those the rules leave out.

        ``previous`` is what the memory showed before: a message rewritten under its id
        since (by ``set``, or by another writer) is counted again.

        Left out: all but the last system message, and tool results whose request is not
        before them. Of several leads the last is the lead and the others stay as plain
        messages where they are (two writers each folded a summary: dropping one would lose
        what only it covers; the next fold takes it in). Costs are counted before anything
        changes.
        """
        if previous and self.count is not None:
            shown = {message_key(m): m for m in previous}
            for m in messages:
                old = shown.get(message_key(m))
                if old is not None and old is not m and old != m:
                    self.known.pop(message_key(m), None)
        costs = [self.cost(m) for m in messages]
        dropped: list[ChatMessage] = []
        msgs, kept_costs, opened, answered = self.msgs, self.costs, self.opened, self.answered
        known: dict[object, int] = {}
        total = 0
        lead_at = system_seen = lead_seen = 0  # the lead's place in msgs; when each was met
        for seen, (m, cost) in enumerate(zip(messages, costs, strict=True)):
            if isinstance(m, SystemMessage):
                if self.system is not None and self.system == m:
                    # The same text again is ignored, as an add ignores it: the first stays.
                    dropped.append(m)
                    continue
                if self.system is not None:
                    dropped.append(self.system)
                    known.pop(message_key(self.system), None)
                self.system, self.system_cost, self.system_pos = m, cost, len(msgs)
                system_seen = seen
            elif is_lead is not None and is_lead(m):
                if self.lead is not None:
                    msgs.insert(lead_at, self.lead)
                    kept_costs.insert(lead_at, self.lead_cost)
                    total += self.lead_cost
                    if self.system is not None and system_seen > lead_seen:
                        self.system_pos += 1
                self.lead, self.lead_cost = m, cost
                lead_at, lead_seen = len(msgs), seen
            elif isinstance(m, ToolExecutionResultMessage) and not opened.get(m.id):
                dropped.append(m)
                continue
            else:
                if isinstance(m, ToolExecutionResultMessage):
                    answered[m.id] = answered.get(m.id, 0) + 1
                elif isinstance(m, AiMessage):
                    for r in m.tool_execution_requests:
                        opened[r.id] = opened.get(r.id, 0) + 1
                msgs.append(m)
                kept_costs.append(cost)
                total += cost
            known[message_key(m)] = cost
        self.total = total
        if self.keep_system_first:
            self.system_pos = 0
        self.known.clear()
        self.known.update(known)
        return dropped

    def add(self, messages: Sequence[ChatMessage]) -> tuple[list[ChatMessage], list[ChatMessage]]:
        """Add ``messages`` in order; return those added and those they displaced.

        A system message equal to the window's is skipped, a different one replaces it; a
        tool result whose request is in neither the window nor the batch is skipped. A
        message without an id, or with one already in the window or the batch, is added as
        a copy with a new id. Nothing changes if counting a message raises. Does not trim.
        """
        known = self.known
        system = self.system
        new_system: SystemMessage | None = None
        batch_open: dict[str, int] | None = None
        kept: list[ChatMessage] = []
        ids: list[str] = []
        # A batch's own ids are looked up in a list while it is short, else in a set.
        seen: list[str] | set[str] = ids if len(messages) <= 16 else set()
        tools = False  # whether the batch holds tool requests or results
        for given in messages:
            m = given
            kind = _KIND.get(type(m)) or _kind(m)
            if kind is _USER:
                pass
            elif kind is _SYSTEM:
                current = new_system if new_system is not None else system
                if current is not None and current == m:
                    continue
                if new_system is not None:  # replaced within the batch: never stored
                    at = kept.index(new_system)
                    del kept[at], ids[at]
            elif kind is _RESULT:
                if not self.opened.get(m.id) and not (  # type: ignore[union-attr]
                    batch_open and batch_open.get(m.id)  # type: ignore[union-attr]
                ):
                    continue
                tools = True
            elif m.tool_execution_requests:  # type: ignore[union-attr]
                if batch_open is None:
                    batch_open = {}
                for r in m.tool_execution_requests:  # type: ignore[union-attr]
                    batch_open[r.id] = batch_open.get(r.id, 0) + 1
                tools = True
            mid = m.message_id
            if mid is None or mid in known or mid in seen:
                mid = new_message_id()
                m = m.with_metadata(message_id=mid)
            if kind is _SYSTEM:
                new_system = m  # type: ignore[assignment]
            if seen is not ids:
                seen.add(mid)  # type: ignore[union-attr]
            ids.append(mid)
            kept.append(m)
        count = self.count
        # Every message is counted before the window changes: a count that raises leaves it
        # as it was.
        if count is None:
            kept_costs = [1] * len(kept)
            for mid in ids:
                known[mid] = 1
        else:
            kept_costs = [count(m) for m in kept]
            for mid, cost in zip(ids, kept_costs, strict=True):
                known[mid] = cost
        displaced: list[ChatMessage] = []
        msgs = self.msgs
        base = len(msgs)
        if new_system is None:
            msgs += kept
            self.costs += kept_costs
            self.total += sum(kept_costs)
        else:
            at = kept.index(new_system)
            if system is not None:
                known.pop(message_key(system), None)
                displaced.append(system)
            self.system, self.system_cost = new_system, kept_costs[at]
            # Where it was added: after the window and the batch's messages before it.
            self.system_pos = 0 if self.keep_system_first else base + at
            msgs += kept[:at] + kept[at + 1 :]
            others = kept_costs[:at] + kept_costs[at + 1 :]
            self.costs += others
            self.total += sum(others)
        if tools:
            opened, answered = self.opened, self.answered
            for m in kept:
                if isinstance(m, ToolExecutionResultMessage):
                    answered[m.id] = answered.get(m.id, 0) + 1
                elif isinstance(m, AiMessage):
                    for r in m.tool_execution_requests:
                        opened[r.id] = opened.get(r.id, 0) + 1
        return kept, displaced

    def forget(
        self, messages: Sequence[ChatMessage], into: dict[object, int] | None = None
    ) -> None:
        """Drop the costs of messages that left the window (into ``into``, when given)."""
        pop = self.known.pop
        if into is None:
            for m in messages:
                pop(m.message_id or m, None)
            return
        for m in messages:
            key = m.message_id or m
            cost = pop(key, None)
            if cost is not None:
                into[key] = cost

    def set_lead(self, lead: ChatMessage | None, cost: int) -> ChatMessage | None:
        """Show ``lead`` right after the system message; return the lead it replaces.

        The replaced lead's cost stays known until the caller forgets it with what else
        left the window (a calibrating memory keeps the costs of what left).
        """
        old = self.lead
        self.lead, self.lead_cost = lead, cost if lead is not None else 0
        if lead is not None:
            self.known[message_key(lead)] = cost
        return old

    def trim(self, limit: int) -> list[ChatMessage]:
        """Evict whole units from the front until the window fits ``limit``; return them.

        Only the newest unit may stay over the limit, beside the system message: when it
        holds a message larger than the limit by itself (a message is never split, and its
        tool results stay with it), or, with whole turns, when it is the newest turn.
        """
        self.limit = limit
        evicted: list[ChatMessage] = []
        while True:
            over = self.total + self.system_cost + self.lead_cost - limit
            if over <= 0:
                break
            k, stale = self._front(over, limit)
            if k:
                front = self.drop_front(k)
                if evicted:
                    evicted += front
                else:
                    evicted = front
            if not stale:
                break
            # Tool results further on lost their request: drop them, then count again.
            evicted += self._drop_orphans()
        return evicted

    def drop_front(self, k: int) -> list[ChatMessage]:
        """Remove the ``k`` oldest messages (whole units), keeping the tool counts."""
        msgs, costs = self.msgs, self.costs
        front = msgs[:k]
        del msgs[:k]
        self.total -= sum(costs[:k])
        del costs[:k]
        if self.system_pos:
            self.system_pos = max(0, self.system_pos - k)
        opened, answered = self.opened, self.answered
        if opened or answered:
            for m in front:
                if isinstance(m, ToolExecutionResultMessage):
                    _decrement(answered, m.id)
                elif isinstance(m, AiMessage):
                    for r in m.tool_execution_requests:
                        _decrement(opened, r.id)
        return front

    def _front(self, over: int, limit: int) -> tuple[int, bool]:
        """How many front messages to evict for ``over`` less; and whether that leaves
        tool results further on without their request (then they go first, and the window
        is counted again)."""
        msgs, costs = self.msgs, self.costs
        opened, answered = self.opened, self.answered
        # Without tool requests in the window every unit but a whole turn is one message.
        tools = bool(opened or answered)
        whole_turns = self.whole_turns
        n = len(msgs)
        k = 0
        if tools:
            asks: dict[str, int] = {}  # requests of the units evicted so far
            answers: dict[str, int] = {}  # results evicted so far
        while over > 0 and k < n:
            # The unit starting at k ends before j.
            j = k + 1
            if whole_turns:
                while j < n and not isinstance(msgs[j], UserMessage):
                    j += 1
            elif tools:
                first = msgs[k]
                if isinstance(first, AiMessage) and first.tool_execution_requests:
                    while j < n and isinstance(msgs[j], ToolExecutionResultMessage):
                        j += 1
            unit = costs[k] if j == k + 1 else sum(costs[k:j])
            if j == n and unit > limit and (whole_turns or max(costs[k:j]) > limit):
                # The newest unit holds a message larger than the window (never split), or
                # is the newest whole turn: it stays alone.
                break
            over -= unit
            if not tools:
                k = j
                continue
            asked: list[str] = []
            for m in msgs[k:j]:
                if isinstance(m, ToolExecutionResultMessage):
                    answers[m.id] = answers.get(m.id, 0) + 1
                elif isinstance(m, AiMessage) and m.tool_execution_requests:
                    for r in m.tool_execution_requests:
                        asks[r.id] = asks.get(r.id, 0) + 1
                        asked.append(r.id)
            k = j
            # Results of an evicted request left further on (another request with the same
            # id may follow them, but a result answers a request before it).
            if asked and any(answered.get(r, 0) > answers.get(r, 0) for r in asked):
                return k, True
        return k, False

    def _drop_orphans(self) -> list[ChatMessage]:
        """Drop tool results with no request before them in the window (rare: results not
        right after their request), as `load` leaves them out."""
        answered = self.answered
        asked: set[str] = set()
        msgs: list[ChatMessage] = []
        costs: list[int] = []
        dropped: list[ChatMessage] = []
        before_system = 0
        for i, (m, cost) in enumerate(zip(self.msgs, self.costs, strict=True)):
            if isinstance(m, AiMessage):
                asked.update(r.id for r in m.tool_execution_requests)
            elif isinstance(m, ToolExecutionResultMessage) and m.id not in asked:
                dropped.append(m)
                _decrement(answered, m.id)
                self.total -= cost
                if i < self.system_pos:
                    before_system += 1
                continue
            msgs.append(m)
            costs.append(cost)
        self.msgs, self.costs = msgs, costs
        self.system_pos -= before_system
        return dropped


def _same(a: ChatMessage, b: ChatMessage) -> bool:
    # A store that builds new message objects at each read still holds the same messages
    # when the ids and the contents match (a store may rewrite a message under its id).
    return a is b or (a.message_id is not None and a.message_id == b.message_id and a == b)


def _without(messages: Sequence[ChatMessage], left: list[ChatMessage]) -> Iterator[ChatMessage]:
    return (m for m in messages if not any(m is x for x in left))


def _decrement(counts: dict[str, int], key: str) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


_Outcome: TypeAlias = tuple[list[ChatMessage], list[ChatMessage]]


class OverflowPolicy(Protocol):
    """What a memory does with the units that no longer fit its window.

    ``overflow`` runs after every add and returns the messages it removed from the window
    and those it added; or, when it needs a model first (a summary), a generator that
    yields ``(ASK, (model, request))``, is sent back the response (or the exception the
    call raised), and returns them.
    """

    evicts_on_read: bool
    """Whether a window read from the store is trimmed to the limit (else only an add
    changes what the window holds)."""

    def is_lead(self, message: ChatMessage) -> bool: ...

    def overflow(
        self, window: Window, limit: int, added: Sequence[ChatMessage]
    ) -> _Outcome | Generator[Any, Any, _Outcome]: ...


class Evict:
    """The usual policy: the oldest units leave the window."""

    __slots__ = ()

    evicts_on_read = True

    def is_lead(self, message: ChatMessage) -> bool:
        return False

    def overflow(self, window: Window, limit: int, added: Sequence[ChatMessage]) -> _Outcome:
        evicted = window.trim(limit)
        return (evicted, []) if evicted else _NOTHING


_NOTHING: _Outcome = ([], [])
EVICT = Evict()

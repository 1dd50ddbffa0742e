"""A slow, plain model of the window memories' rules, to check the engine against.

It keeps the window as the last add left it, which is what the store holds, and recomputes
the window from scratch at every add and read, with none of the engine's bookkeeping (cached
costs, tool counters, delta writes).
"""

from __future__ import annotations

from collections.abc import Callable

from aiservices.messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionResultMessage,
    UserMessage,
)

Cost = Callable[[ChatMessage], int]


class WindowOracle:
    """The window rules of a message window (``cost=None``) or a token window."""

    def __init__(
        self,
        limit: int,
        cost: Cost | None = None,
        *,
        keep_system_first: bool = False,
        whole_turns: bool = False,
    ) -> None:
        self.limit = limit
        self.cost: Cost = cost or (lambda _: 1)
        self.keep_system_first = keep_system_first
        self.whole_turns = whole_turns
        self.stored: list[ChatMessage] = []

    def add(self, *messages: ChatMessage) -> None:
        window = self.stored.copy()
        for m in messages:
            window = self._place(window, m)
        self.stored = self.trim(window)

    def messages(self) -> list[ChatMessage]:
        # A lowered limit shows a smaller window at once, though the store keeps the rest
        # until the next add.
        return self.trim(self.stored)

    def _place(self, window: list[ChatMessage], m: ChatMessage) -> list[ChatMessage]:
        if isinstance(m, SystemMessage):
            current = [s for s in window if isinstance(s, SystemMessage)]
            if current == [m]:
                return window
            rest = [s for s in window if not isinstance(s, SystemMessage)]
            return [m, *rest] if self.keep_system_first else [*rest, m]
        if isinstance(m, ToolExecutionResultMessage) and m.id not in requested(window):
            return window
        return [*window, m]

    def units(self, window: list[ChatMessage]) -> list[list[int]]:
        """The eviction units, as indices into ``window``; the system message is in none."""
        out: list[list[int]] = []
        for i, m in enumerate(window):
            if isinstance(m, SystemMessage):
                continue
            if self.whole_turns:
                starts = isinstance(m, UserMessage)
            else:
                starts = not isinstance(m, ToolExecutionResultMessage)
            if starts or not out:
                out.append([i])
            else:
                out[-1].append(i)
        return out

    def trim(self, window: list[ChatMessage]) -> list[ChatMessage]:
        window = drop_orphans(window)
        while sum(map(self.cost, window)) > self.limit:
            units = self.units(window)
            if not units:
                return window  # the system message alone: never evicted
            first = units[0]
            if len(units) == 1 and self.stays_over([window[i] for i in first]):
                return window
            window = drop_orphans([m for i, m in enumerate(window) if i not in first])
        return window

    def stays_over(self, unit: list[ChatMessage]) -> bool:
        """Whether ``unit``, the only one left, stays though the window is over its limit."""
        if sum(map(self.cost, unit)) <= self.limit:
            return False
        # A message is never split, so one larger than the whole window stays, with the tool
        # results of its unit; and the newest whole turn stays, so that the question just
        # asked keeps its answers. Any other unit goes, as in LangChain4j, even when that
        # leaves the system message alone: the same rule in both windows, counted in tokens.
        return self.whole_turns or any(self.cost(m) > self.limit for m in unit)


def requested(window: list[ChatMessage]) -> set[str]:
    return {r.id for m in window if isinstance(m, AiMessage) for r in m.tool_execution_requests}


def drop_orphans(window: list[ChatMessage]) -> list[ChatMessage]:
    """``window`` without the tool results whose request is not before them."""
    out: list[ChatMessage] = []
    for m in window:
        if isinstance(m, ToolExecutionResultMessage) and m.id not in requested(out):
            continue
        out.append(m)
    return out

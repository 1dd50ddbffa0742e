"""What the model was sent on a turn, rebuilt from a store's history."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from ..messages import AiMessage, ChatMessage, SystemMessage
from .summarizing import is_summary

__all__ = ["sent_on_turn"]


class _Entry(Protocol):
    # A stores.HistoryEntry, as far as this module reads it.
    @property
    def message(self) -> ChatMessage: ...

    @property
    def evicted_at(self) -> datetime | None: ...


def sent_on_turn(history: Sequence[_Entry], turn_id: str) -> list[ChatMessage]:
    """The messages of the last model request of turn ``turn_id``, rebuilt from ``history``.

    ``history`` is ``store.get_history(memory_id)`` of a store with ``keep_history=True``,
    for a conversation a service recorded. The request held the window as the turn began
    (the messages recorded before the turn that had not yet left the window), then the
    turn's own messages up to its last ``AiMessage``. A request has the system message
    first (the turn's own when it brought a new one), then a ``SummarizingChatMemory``'s
    summary, then the other messages in the order they were recorded.

    A message left the window before the turn began if its ``evicted_at`` is earlier than
    the middle of the turn: messages evicted by the previous turn's write left before the
    turn's first message was made, and those evicted by this turn's write left after its
    last one, so the middle separates them even when the store's clock (the database
    server's, for Redis and PostgreSQL) is off from the application's by up to half a
    turn. Not recorded, and so not returned: a parse retry's rejected answer and the
    feedback sent with it.
    """
    positions = [i for i, e in enumerate(history) if e.message.turn_id == turn_id]
    if not positions:
        raise LookupError(f"no message of turn {turn_id!r} in this history")
    turn = [history[i].message for i in positions]
    began, ended = turn[0].created_at, turn[-1].created_at
    if began is None or ended is None:
        raise ValueError(
            f"the messages of turn {turn_id!r} carry no created_at: they were not recorded "
            "by a service, so when the turn happened is unknown"
        )
    middle = began + (ended - began) / 2
    window = [
        e.message for e in history[: positions[0]] if e.evicted_at is None or e.evicted_at > middle
    ]
    answers = [i for i, m in enumerate(turn) if isinstance(m, AiMessage)]
    sent = turn[: answers[-1]] if answers else turn
    systems: list[ChatMessage] = [m for m in window if isinstance(m, SystemMessage)]
    system = systems[-1:]
    if sent and isinstance(sent[0], SystemMessage):
        # A new system message replaces the window's.
        system, sent = sent[:1], sent[1:]
    summary = [m for m in window if is_summary(m)][-1:]
    rest = [m for m in window if not isinstance(m, SystemMessage) and not is_summary(m)]
    return [*system, *summary, *rest, *sent]

"""Several processes, one conversation, through a service: no turn is lost or split.

Each persistent store (SQLite, Redis, PostgreSQL) runs it: 4 processes make 100 turns each
on one memory id. Every turn must land whole (its answer right after its question), each
process's turns in its own order, and none lost: 800 messages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Protocol

import pytest

from aiservices import MemoryId, MessageWindowChatMemory, ai_service
from aiservices.messages import AiMessage, UserMessage
from aiservices.models import ChatRequest
from aiservices.testing import ScriptedChatModel

from ._processes import in_processes
from .conftest import OpenedBackend

PROCESSES = 4
TURNS = 100


class Bot(Protocol):
    def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...


def answer(request: ChatRequest) -> str:
    question = request.messages[-1]
    assert isinstance(question, UserMessage)
    return f"answer to {question.text}"


def chat_in_process(
    opener: Callable[..., Any], start: Any, memory_id: str, worker: int, window: int = 0
) -> None:
    """Make turns on ``memory_id``: ``TURNS`` in an unbounded window, or half as many in one
    of ``window`` messages, checking it after each."""
    store = opener(keep_history=True) if window else opener()
    try:
        bot = ai_service(
            Bot,
            model=ScriptedChatModel(default=answer),
            chat_memory_provider=MessageWindowChatMemory.provider(
                max_messages=window or 10_000, evict_whole_turns=bool(window), store=store
            ),
        )
        start.wait()
        for turn in range(TURNS // 2 if window else TURNS):
            bot.chat(memory_id, f"{worker}:{turn}")
            if window:
                # Whatever the other processes stored meanwhile, every write was planned on
                # what the store held: the window never grows past its limit, and starts
                # with a question.
                held = store.get_messages(memory_id)
                assert len(held) <= window, len(held)
                assert isinstance(held[0], UserMessage), held[0]
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()


@pytest.mark.slow
def test_processes_sharing_a_conversation_lose_no_turn(
    persistent_backend: OpenedBackend,
) -> None:
    in_processes(PROCESSES, chat_in_process, persistent_backend.opener, "shared")

    messages = persistent_backend.open().get_messages("shared")
    assert len(messages) == 2 * PROCESSES * TURNS
    assert len({m.message_id for m in messages}) == len(messages)
    questions, answers = messages[::2], messages[1::2]
    for question, reply in zip(questions, answers, strict=True):
        assert isinstance(question, UserMessage)
        assert isinstance(reply, AiMessage)
        assert reply.text == f"answer to {question.text}"
        assert reply.turn_id == question.turn_id is not None
    for worker in range(PROCESSES):
        mine = [q.text for q in questions if q.text.split(":")[0] == str(worker)]  # type: ignore[union-attr]
        assert mine == [f"{worker}:{turn}" for turn in range(TURNS)]


WINDOW = 6


@pytest.mark.slow
def test_processes_sharing_a_small_window_keep_it_within_its_limit(
    history_backend: OpenedBackend,
) -> None:
    in_processes(PROCESSES, chat_in_process, history_backend.opener, "small", WINDOW)

    store = history_backend.open(keep_history=True)
    assert len(store.get_messages("small")) <= WINDOW
    # History keeps every turn whole, once.
    recorded = [e.message for e in store.get_history("small")]
    assert len(recorded) == 2 * PROCESSES * (TURNS // 2)
    assert len({m.message_id for m in recorded}) == len(recorded)

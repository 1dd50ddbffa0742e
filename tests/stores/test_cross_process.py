"""Several processes, one conversation, through a service: no turn is lost or split.

Each persistent store (SQLite, Redis, PostgreSQL) runs it: 4 processes make 100 turns each
on one memory id. Every turn must land whole (its answer right after its question), each
process's turns in its own order, and none lost: 800 messages.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Annotated, Any, Protocol

import pytest

from aiservices import MemoryId, MessageWindowChatMemory, ai_service
from aiservices.messages import AiMessage, UserMessage
from aiservices.models import ChatRequest
from aiservices.testing import ScriptedChatModel

from .conftest import OpenedBackend

PROCESSES = 4
TURNS = 100


class Bot(Protocol):
    def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...


def answer(request: ChatRequest) -> str:
    question = request.messages[-1]
    assert isinstance(question, UserMessage)
    return f"answer to {question.text}"


def chat_in_process(opener: Callable[..., Any], start: Any, memory_id: str, worker: int) -> None:
    store = opener()
    try:
        bot = ai_service(
            Bot,
            model=ScriptedChatModel(default=answer),
            chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10_000, store=store),
        )
        start.wait()
        for turn in range(TURNS):
            bot.chat(memory_id, f"{worker}:{turn}")
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()


@pytest.mark.slow
def test_processes_sharing_a_conversation_lose_no_turn(
    persistent_backend: OpenedBackend,
) -> None:
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(PROCESSES)
    workers = [
        context.Process(
            target=chat_in_process,
            args=(persistent_backend.opener, start, "shared", w),
        )
        for w in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=300)
    assert [w.exitcode for w in workers] == [0] * PROCESSES

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

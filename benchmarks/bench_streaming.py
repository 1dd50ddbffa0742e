"""Time to first chunk: what a streaming service call adds over the model's own stream.

Run by hand: ``python benchmarks/bench_streaming.py``. The model yields its first chunk at
once, so the difference is the framework's work before the first chunk: binding the
arguments, taking the conversation's lock, reading the memory, building the request.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from typing import Annotated, Protocol

from aiservices import AiMessage, MemoryId, MessageWindowChatMemory, ai_service
from aiservices.models import ChatRequest, ChatResponse


class InstantStream:
    """Streams three chunks; the first comes at once."""

    def chat(self, request: ChatRequest) -> ChatResponse:
        return ChatResponse(AiMessage("Hello there!"))

    def stream(self, request: ChatRequest) -> Iterator[str | ChatResponse]:
        yield "Hello"
        yield " there"
        yield "!"
        yield ChatResponse(AiMessage("Hello there!"))


class Chat(Protocol):
    def chat(self, user: Annotated[str, MemoryId], text: str) -> Iterator[str]: ...


def main(n: int = 5000) -> None:
    model = InstantStream()
    bot = ai_service(
        Chat, model=model, chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20)
    )
    request = ChatRequest([])
    direct: list[float] = []
    framed: list[float] = []
    for i in range(n):
        stream = model.stream(request)
        began = time.perf_counter_ns()
        next(stream)
        direct.append((time.perf_counter_ns() - began) / 1000)
        list(stream)
        began = time.perf_counter_ns()
        call = bot.chat("alice", "Hi")
        next(call)
        framed.append((time.perf_counter_ns() - began) / 1000)
        list(call)  # run the stream to its end: the turn is recorded
        del i
    d, f = statistics.median(direct), statistics.median(framed)
    print(f"model's own first chunk:      {d:8.1f} us (median of {n})")
    print(f"through the service:          {f:8.1f} us")
    print(f"added by the framework:       {f - d:8.1f} us (target < 100 us)")


if __name__ == "__main__":
    main()

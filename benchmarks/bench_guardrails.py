"""What guardrails and a retriever cost a call: none, one pass-through input guardrail, one
pass-through output guardrail, and a retriever that finds nothing.

A stateless ``str -> str`` call with an instant model, the cheapest call there is, so that
a fraction of a microsecond shows. Run with ``--against REF`` naming a build without
guardrails to see what their mere existence costs (the "none" scenario in both):

    python benchmarks/bench_guardrails.py --against <a ref before guardrails> --rounds 15
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Protocol

from aiservices import AiMessage, ai_service
from aiservices.models import ChatRequest, ChatResponse


class Instant:
    response = ChatResponse(AiMessage("Hello!"))

    def chat(self, request: ChatRequest) -> ChatResponse:
        return self.response


class Plain(Protocol):
    def chat(self, message: str) -> str: ...


def passes_text(text: str) -> str | None:
    return None


def passes_answer(message: AiMessage) -> AiMessage | None:
    return None


def finds_nothing(query: str, memory_id: Hashable) -> list[str]:
    return []


def scenarios(contender: str) -> dict[str, Callable[[int], Any]]:
    plain = ai_service(Plain, model=Instant())
    table: dict[str, Callable[[int], Any]] = {"none": lambda i: plain.chat("Hi there")}
    try:
        guarded_in = ai_service(Plain, model=Instant(), input_guardrails=[passes_text])
        guarded_out = ai_service(Plain, model=Instant(), output_guardrails=[passes_answer])
        retrieving = ai_service(Plain, model=Instant(), retriever=finds_nothing)
    except TypeError:  # a build without guardrails
        return table
    table["input"] = lambda i: guarded_in.chat("Hi there")
    table["output"] = lambda i: guarded_out.chat("Hi there")
    table["retriever"] = lambda i: retrieving.chat("Hi there")
    return table


if __name__ == "__main__":
    from _interleave import main

    main(__file__, scenarios, names=("none", "input", "output", "retriever"), default_n=5000)

"""Anthropic's thinking blocks: kept with the answer, through memory, JSON and a store, and
sent back first in the assistant turn, as the API requires with thinking and tools."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from _anthropic_server import AnthropicServer, message, text, tool_use
from _loopback import Reply

from aiservices import MessageWindowChatMemory, SqliteChatMemoryStore, ai_service, tool
from aiservices.messages import (
    AiMessage,
    Reasoning,
    UserMessage,
    messages_from_json,
    messages_to_json,
)
from aiservices.models import ChatRequest

THINKING = {"type": "thinking", "thinking": "The user wants the weather.", "signature": "sig-123"}
REDACTED = {"type": "redacted_thinking", "data": "ENCRYPTED"}


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


class Bot(Protocol):
    def ask(self, text: str) -> str: ...


def test_thinking_blocks_go_back_first_and_survive_a_store(
    anthropic_server: AnthropicServer, anthropic_model: Callable[..., Any], tmp_path: Path
) -> None:
    anthropic_server.reply_message(
        [THINKING, REDACTED, tool_use("toolu_1", "get_weather", {"city": "Oslo"})],
        stop_reason="tool_use",
    )
    anthropic_server.reply_text("Sunny in Oslo.")
    store = SqliteChatMemoryStore(tmp_path / "chat.db")
    memory = MessageWindowChatMemory(10, store=store)
    bot = ai_service(Bot, model=anthropic_model(), tools=[get_weather], chat_memory=memory)
    assert bot.ask("Weather in Oslo?") == "Sunny in Oslo."
    assistant = anthropic_server.bodies[1]["messages"][1]
    assert assistant["role"] == "assistant"
    assert assistant["content"][:2] == [THINKING, REDACTED]
    assert assistant["content"][2]["type"] == "tool_use"
    # Read back by a new store object: the reasoning was stored with the answer.
    stored = SqliteChatMemoryStore(tmp_path / "chat.db").get_messages("default")[1]
    assert isinstance(stored, AiMessage)
    assert stored.reasoning == [
        Reasoning(text="The user wants the weather.", signature="sig-123"),
        Reasoning(redacted="ENCRYPTED"),
    ]
    again = messages_from_json(messages_to_json([stored]))[0]
    assert again.reasoning == stored.reasoning  # type: ignore[union-attr]
    store.close()


def test_a_streamed_answer_keeps_its_thinking(
    anthropic_server: AnthropicServer, anthropic_model: Callable[..., Any]
) -> None:
    events: list[tuple[str | None, Any]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {**message([]), "stop_reason": None},
            },
        ),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "thinking_delta", "thinking": "Let me "},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "thinking_delta", "thinking": "think."},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "signature_delta", "signature": "sig-9"},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "text_delta", "text": "Done."},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 5},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    anthropic_server.queue(Reply(events=tuple(events)))
    pieces = list(anthropic_model().stream(ChatRequest([UserMessage("Think.")])))
    final = pieces[-1]
    assert pieces[:-1] == ["Done."]  # thinking is not streamed as answer text
    assert final.ai_message.text == "Done."
    assert final.ai_message.reasoning == [Reasoning(text="Let me think.", signature="sig-9")]


def test_answers_without_reasoning_are_unchanged(
    anthropic_server: AnthropicServer, anthropic_model: Callable[..., Any]
) -> None:
    anthropic_server.reply_message([text("Hi.")])
    answer = anthropic_model().chat(ChatRequest([UserMessage("Hi")])).ai_message
    assert answer.reasoning is None
    assert "reasoning" not in messages_to_json([answer])

"""A loopback server speaking Anthropic's Messages wire format (``POST /v1/messages``).

Bodies follow the API reference: a ``message`` object for plain calls; for streams, named
SSE events ``message_start``, ``content_block_start`` / ``content_block_delta``
(``text_delta``, ``input_json_delta``) / ``content_block_stop``, ``message_delta`` (stop
reason and cumulative usage) and ``message_stop``, with a ``ping`` among them; errors as
``{"type": "error", "error": {...}}``; ``POST /v1/messages/count_tokens`` answers
``{"input_tokens": N}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from _loopback import LoopbackServer, Reply

MODEL = "claude-test-1"

Block = Mapping[str, Any]


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(block_id: str, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": block_id, "name": name, "input": dict(arguments)}


class AnthropicServer(LoopbackServer):
    def reply_message(
        self,
        content: Sequence[Block],
        *,
        stop_reason: str = "end_turn",
        usage: Mapping[str, Any] | None = None,
    ) -> None:
        self.queue(Reply(body=message(content, stop_reason=stop_reason, usage=usage)))

    def reply_text(self, value: str, **options: Any) -> None:
        self.reply_message([text(value)], **options)

    def reply_stream(
        self,
        content: Sequence[Block],
        *,
        stop_reason: str | None = None,
        input_tokens: int = 25,
        output_tokens: int = 12,
        split: int = 3,
    ) -> None:
        reason = stop_reason or (
            "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
        )
        self.queue(
            Reply(
                events=stream_events(
                    content,
                    stop_reason=reason,
                    input_tokens=input_tokens,
                    output_tokens=output_tokens,
                    split=split,
                )
            )
        )

    def reply_count(self, tokens: int) -> None:
        self.queue(Reply(body={"input_tokens": tokens}))

    def reply_error(
        self, status: int, kind: str, message_text: str, *, headers: dict[str, str] | None = None
    ) -> None:
        self.queue(
            Reply(
                status,
                {
                    "type": "error",
                    "error": {"type": kind, "message": message_text},
                    "request_id": "req_test",
                },
                headers=headers or {},
            )
        )


def message(
    content: Sequence[Block],
    *,
    stop_reason: str = "end_turn",
    usage: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [dict(b) for b in content],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": dict(usage) if usage is not None else {"input_tokens": 25, "output_tokens": 12},
    }


def stream_events(
    content: Sequence[Block],
    *,
    stop_reason: str,
    input_tokens: int = 25,
    output_tokens: int = 12,
    split: int = 3,
) -> tuple[tuple[str | None, Any], ...]:
    out: list[tuple[str | None, Any]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    **message([], stop_reason=stop_reason),
                    "stop_reason": None,
                    "usage": {"input_tokens": input_tokens, "output_tokens": 1},
                },
            },
        ),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(content):
        if block["type"] == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            pieces = _split(block["text"], split)
            deltas = [{"type": "text_delta", "text": p} for p in pieces]
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            pieces = _split(json.dumps(block["input"]), split)
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces]
        out.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
        )
        out += [
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": d},
            )
            for d in deltas
        ]
        out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    out.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            },
        )
    )
    out.append(("message_stop", {"type": "message_stop"}))
    return tuple(out)


def _split(value: str, parts: int) -> list[str]:
    if not value:
        return []
    step = max(1, -(-len(value) // parts))
    return [value[i : i + step] for i in range(0, len(value), step)]

"""A loopback server speaking OpenAI's Chat Completions wire format (``POST /v1/chat/completions``).

Bodies follow the API reference: a ``chat.completion`` object for plain calls; for streams,
``chat.completion.chunk`` objects as SSE ``data:`` lines ending with ``data: [DONE]``, tool
call arguments split across chunks by ``index``, and an optional usage-only last chunk
(``choices: []``) as ``stream_options.include_usage`` asks for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from _loopback import LoopbackServer, Recorded, Reply

MODEL = "gpt-test-mini"

Call = tuple[str, str, str]  # (id, name, arguments JSON)


class OpenAIServer(LoopbackServer):
    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    def check(self, recorded: Recorded) -> str | None:
        """OpenAI's rules for tool choice and strict schemas, on every request."""
        body = recorded.body
        if not isinstance(body, dict) or not recorded.path.endswith("/chat/completions"):
            return None
        if body.get("tools"):
            if "tool_choice" not in body:
                return "tools without tool_choice: llama.cpp and LiteLLM then ignore them"
            for spec in body["tools"]:
                function = spec.get("function", {})
                if function.get("strict"):
                    problem = strict_problem(function.get("parameters"), "parameters")
                    if problem:
                        return f"tool {function.get('name')!r} is strict but {problem}"
        elif "tool_choice" in body or "parallel_tool_calls" in body:
            return "tool_choice or parallel_tool_calls without tools"
        fmt = body.get("response_format")
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            schema = fmt.get("json_schema", {})
            if schema.get("strict"):
                problem = strict_problem(schema.get("schema"), "schema")
                if problem:
                    return f"response_format is strict but {problem}"
        return None

    def reply_text(
        self,
        text: str | None,
        *,
        usage: tuple[int, int] | None = (11, 7),
        finish_reason: str = "stop",
        refusal: str | None = None,
    ) -> None:
        self.queue(
            Reply(body=completion(text, usage=usage, finish_reason=finish_reason, refusal=refusal))
        )

    def reply_tool_calls(
        self,
        calls: Sequence[Call],
        *,
        text: str | None = None,
        usage: tuple[int, int] | None = (20, 9),
    ) -> None:
        self.queue(Reply(body=completion(text, calls, finish_reason="tool_calls", usage=usage)))

    def reply_body(self, body: Any) -> None:
        self.queue(Reply(body=body))

    def reply_stream(
        self,
        pieces: Sequence[str] = (),
        calls: Sequence[Call] = (),
        *,
        usage: tuple[int, int] | None = (11, 7),
        finish_reason: str | None = None,
        split_arguments: int = 3,
    ) -> None:
        self.queue(
            Reply(
                events=_sse_chunks(
                    chunks(
                        pieces,
                        calls,
                        usage=usage,
                        finish_reason=finish_reason,
                        split_arguments=split_arguments,
                    )
                )
            )
        )

    def reply_raw_stream(self, chunk_bodies: Sequence[Any]) -> None:
        self.queue(Reply(events=_sse_chunks(chunk_bodies)))

    def reply_error(
        self,
        status: int,
        message: str,
        kind: str,
        *,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.queue(
            Reply(
                status,
                {"error": {"message": message, "type": kind, "param": None, "code": code}},
                headers=headers or {},
            )
        )


def _sse_chunks(bodies: Sequence[Any]) -> tuple[tuple[str | None, Any], ...]:
    return (*((None, b) for b in bodies), (None, "[DONE]"))


def completion(
    text: str | None,
    calls: Sequence[Call] = (),
    *,
    finish_reason: str = "stop",
    usage: tuple[int, int] | None = (11, 7),
    refusal: str | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": refusal}
    if calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ]
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": MODEL,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
        ],
    }
    if usage is not None:
        body["usage"] = {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": usage[0] + usage[1],
        }
    return body


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


def chunks(
    pieces: Sequence[str],
    calls: Sequence[Call] = (),
    *,
    usage: tuple[int, int] | None = (11, 7),
    finish_reason: str | None = None,
    split_arguments: int = 3,
) -> list[dict[str, Any]]:
    out = [_chunk({"role": "assistant", "content": ""})]
    out += [_chunk({"content": p}) for p in pieces]
    for index, (call_id, name, arguments) in enumerate(calls):
        out.append(
            _chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": ""},
                        }
                    ]
                }
            )
        )
        step = max(1, -(-len(arguments) // split_arguments))
        for start in range(0, len(arguments), step):
            part = arguments[start : start + step]
            out.append(_chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]}))
    reason = finish_reason or ("tool_calls" if calls else "stop")
    out.append(_chunk({}, reason))
    if usage is not None:
        out.append(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 1_700_000_000,
                "model": MODEL,
                "choices": [],
                "usage": {
                    "prompt_tokens": usage[0],
                    "completion_tokens": usage[1],
                    "total_tokens": usage[0] + usage[1],
                },
            }
        )
    return out


def strict_problem(node: Any, where: str) -> str | None:
    """Why OpenAI's strict mode would refuse ``node`` (its documented rules), or ``None``."""
    if not isinstance(node, dict):
        return f"{where} is not a schema"
    if not ({"type", "anyOf", "$ref", "enum", "const"} & set(node)):
        return f"{where} has no 'type' key"
    for definition, sub in node.get("$defs", {}).items():
        problem = strict_problem(sub, f"{where}.$defs.{definition}")
        if problem:
            return problem
    if node.get("type") == "object" or "properties" in node:
        properties = node.get("properties", {})
        if node.get("additionalProperties") is not False:
            return f"{where} does not set additionalProperties: false"
        if set(node.get("required", [])) != set(properties):
            return f"{where} does not require every property"
        for name, sub in properties.items():
            problem = strict_problem(sub, f"{where}.{name}")
            if problem:
                return problem
    if "items" in node:
        return strict_problem(node["items"], f"{where}[]")
    for i, sub in enumerate(node.get("anyOf", [])):
        problem = strict_problem(sub, f"{where}.anyOf[{i}]")
        if problem:
            return problem
    return None

"""What OpenAIChatModel (and a service on it) adds to the bare openai SDK, per one-turn call.

Every path makes the same Chat Completions request through the same in-process transport
(httpx's MockTransport handed to the SDK client), so the network is out of the picture and
the difference is our code. Rounds of each path are interleaved and the best round counts,
which keeps a busy machine's noise out of the comparison.

    python benchmarks/bench_openai_adapter.py [--calls N] [--rounds R]
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable
from typing import Protocol

import httpx
import openai

from aiservices.messages import UserMessage
from aiservices.models import ChatRequest
from aiservices.models.openai import OpenAIChatModel

MODEL = "gpt-4o-mini"
KEY = "sk-bench"
BODY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello! How can I help?"},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16},
    }
).encode()


def handler(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, content=BODY, headers={"content-type": "application/json"})


def http_client() -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler))


def bare_sdk() -> Callable[[], object]:
    client = openai.OpenAI(api_key=KEY, http_client=http_client(), max_retries=0)
    messages = [{"role": "user", "content": "Hi"}]

    def call() -> object:
        completion = client.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
        return completion.choices[0].message.content

    return call


def adapter() -> Callable[[], object]:
    model = OpenAIChatModel(MODEL, api_key=KEY, http_client=http_client(), max_retries=0)

    def call() -> object:
        return model.chat(ChatRequest([UserMessage("Hi")])).ai_message.text

    return call


def service() -> Callable[[], object] | None:
    try:
        from aiservices import ai_service
    except ImportError:
        return None

    class Assistant(Protocol):
        def chat(self, message: str) -> str: ...

    model = OpenAIChatModel(MODEL, api_key=KEY, http_client=http_client(), max_retries=0)
    bot = ai_service(Assistant, model=model)

    def call() -> object:
        return bot.chat("Hi")

    return call


def adapter_own_work(calls: int) -> tuple[float, float]:
    """Microseconds a call spends in the adapter's own mapping: request, then response."""
    from aiservices.models.openai import _response

    model = OpenAIChatModel(MODEL, api_key=KEY, http_client=http_client(), max_retries=0)
    request = ChatRequest([UserMessage("Hi")])
    completion = model._sync_client().chat.completions.create(**model._request(request))
    timings = []
    for step in (lambda: model._request(request), lambda: _response(completion)):
        best = float("inf")
        for _ in range(5):
            best = min(best, best_round(step, calls * 10))
        timings.append(best)
    return timings[0], timings[1]


def best_round(call: Callable[[], object], calls: int) -> float:
    gc.collect()  # each round starts from the same heap, so one path's garbage is its own
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=300, help="calls per round")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per path")
    args = parser.parse_args()

    paths: dict[str, Callable[[], object]] = {"bare SDK": bare_sdk(), "OpenAIChatModel": adapter()}
    on_service = service()
    if on_service is not None:
        paths["ai_service on it"] = on_service
    for call in paths.values():  # warm up: lazy clients, caches, first-call imports
        for _ in range(50):
            call()
    best = dict.fromkeys(paths, float("inf"))
    for _ in range(args.rounds):
        for name, call in paths.items():
            best[name] = min(best[name], best_round(call, args.calls))

    bare = best["bare SDK"]
    print(f"one-turn call, best of {args.rounds} rounds x {args.calls} calls")
    for name, micros in best.items():
        added = "" if name == "bare SDK" else f"  ({micros / bare:.3f}x, {micros - bare:+.0f} us)"
        print(f"  {name:<18} {micros:8.0f} us/call{added}")
    to_sdk, from_sdk = adapter_own_work(args.calls)
    print(
        f"adapter's own mapping: {to_sdk:.1f} us request + {from_sdk:.1f} us response "
        f"= {(to_sdk + from_sdk) / bare:.1%} of the bare SDK call"
    )


if __name__ == "__main__":
    main()

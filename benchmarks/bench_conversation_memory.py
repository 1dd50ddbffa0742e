"""Memory per cached conversation: 10,000 conversations x 20 messages through a service.

Each contender runs in a fresh process and reports how much its resident set grew, per
conversation: this checkout, ``--against REF`` (another git ref of this project), and the
floor, plain lists of 20 instances of a two-field pydantic model per conversation. The
service is S2's: a 20-message window per user on the in-memory store, ten turns each.

    python benchmarks/bench_conversation_memory.py --against origin/main
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any, Protocol

CONVERSATIONS = 10_000
TURNS = 10  # two messages each: twenty per conversation, the window's size


def _rss() -> int:
    gc.collect()
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _ours() -> Any:
    from aiservices import MemoryId, MessageWindowChatMemory, ai_service
    from aiservices.messages import AiMessage
    from aiservices.models import ChatRequest, ChatResponse

    class Chat(Protocol):
        def chat(self, user: Annotated[str, MemoryId], message: str) -> str: ...

    class Instant:
        response = ChatResponse(AiMessage("Hello!"))

        def chat(self, request: ChatRequest) -> ChatResponse:
            return self.response

    bot = ai_service(
        Chat,
        model=Instant(),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
        chat_memory_cache_size=CONVERSATIONS,
    )
    bot.chat("warm-up", "Hi there")  # the service's own first-call costs are not counted
    users = [f"user{i}" for i in range(CONVERSATIONS)]
    before = _rss()
    for _ in range(TURNS):
        for user in users:
            bot.chat(user, "Hi there")
    grown = _rss() - before
    assert len(bot.get_chat_memory(users[-1]).messages()) == 2 * TURNS  # type: ignore[attr-defined]
    return grown


def _floor() -> Any:
    from pydantic import BaseModel

    class Message(BaseModel):
        role: str
        text: str

    Message(role="user", text="warm-up")
    users = [f"user{i}" for i in range(CONVERSATIONS)]
    before = _rss()
    kept = {
        user: [
            Message(role=role, text=text)
            for _ in range(TURNS)
            for role, text in (("user", "Hi there"), ("ai", "Hello!"))
        ]
        for user in users
    }
    grown = _rss() - before
    assert len(kept[users[-1]]) == 2 * TURNS
    return grown


def _run(contender: str, path: Path | None) -> float:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, __file__, "--worker", contender],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    return float(json.loads(out)) / CONVERSATIONS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--against", action="append", default=[], metavar="REF")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per contender")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_ours() if args.worker == "ours" else _floor()))
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from _interleave import ROOT, export

    with tempfile.TemporaryDirectory() as temporary:
        contenders: list[tuple[str, str, Path | None]] = [
            ("floor", "floor", None),
            ("this", "ours", ROOT),
        ]
        contenders += [(ref, "ours", export(ref, Path(temporary))) for ref in args.against]
        best: dict[str, float] = {}
        for _ in range(args.runs):  # alternating, each keeps its smallest
            for label, contender, path in contenders:
                size = _run(contender, path)
                best[label] = min(size, best.get(label, size))
    floor = best["floor"]
    print(f"{'contender':<12} {'bytes per conversation':>24} {'/ floor':>8}")
    for label, size in best.items():
        print(f"{label:<12} {size:>24,.0f} {size / floor:>8.2f}")


if __name__ == "__main__":
    main()

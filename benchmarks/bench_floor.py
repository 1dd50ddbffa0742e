"""The floor of S1 in pure Python: its data work written out as one function.

Run by hand: ``python benchmarks/bench_floor.py [calls]``. ``floor`` does what an S1 call
of ``bench_overhead.py`` must do to keep its promises, and nothing else: find the
conversation (a least-recently-used table under a lock), take its turn lock, read the window
from the store and check it is current, stamp the user message and the answer (a message id
each, a turn id, a time), build the request, call the model, evict the two oldest messages
and write the delta (the memory's and the store's bookkeeping). It skips what the real call
also does (the generated method, a retired conversation's check, the system-message scan,
parsing, the debug-log check), so it is a lower bound, not a design. It runs next to our S1
and magentic's in the same process.

For counts that do not depend on the machine's load, run it under
``valgrind --tool=callgrind`` with two call counts and take the difference.
"""

from __future__ import annotations

import operator
import sys
import threading
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

from _interleave import measure
from bench_overhead import magentic_scenarios, ours

from aiservices.messages import (
    AiMessage,
    UserMessage,
    _ids,
    _new,
    _set_dict,
    _set_extra,
    _set_fields,
    _set_private,
)
from aiservices.models import ChatRequest, ChatRequestParameters, ChatResponse

WINDOW = 20
_RESPONSE = ChatResponse(AiMessage("Hello!"))
_PARAMETERS = ChatRequestParameters()
_USER_FIELDS = {"type", "text", "name", "message_id", "turn_id", "created_at"}
_AI_FIELDS = {"type", "text", "tool_execution_requests", "message_id", "turn_id", "created_at"}


class _Memory:
    __slots__ = ("held", "known", "lock", "messages", "mutex")

    def __init__(self) -> None:
        self.mutex = threading.Lock()  # the turn lock's
        self.held = False
        self.lock = threading.Lock()  # the memory's own
        self.messages: list[Any] = []
        self.known: dict[str, int] = {}


class _Stored:
    __slots__ = ("ids", "messages", "mids", "start")

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.mids: list[str] = []
        self.ids: set[str] = set()
        self.start = 0


def floor_scenario() -> Any:
    table: OrderedDict[str, _Memory] = OrderedDict(alice=_Memory())
    table_lock = threading.Lock()
    store = {"alice": _Stored()}
    store_lock = threading.Lock()

    def model(request: ChatRequest) -> ChatResponse:
        return _RESPONSE

    def stamp(cls: type[Any], values: dict[str, Any], fields: set[str]) -> Any:
        message = _new(cls)
        _set_dict(message, "__dict__", values)
        _set_fields(message, fields)
        _set_extra(message, None)
        _set_private(message, None)
        return message

    def call(memory_id: str, text: str) -> Any:
        table_lock.acquire()
        memory = table[memory_id]
        table.move_to_end(memory_id)
        table_lock.release()
        mutex = memory.mutex
        mutex.acquire()
        memory.held = True
        mutex.release()
        try:
            memory.lock.acquire()
            store_lock.acquire()
            stored = store[memory_id]
            window = stored.messages[stored.start :]
            store_lock.release()
            kept = memory.messages
            current = len(window) == len(kept) and all(map(operator.is_, window, kept))
            history = kept.copy() if current else window
            memory.lock.release()

            turn_id = next(_ids.counter).to_bytes(16, "big").hex()
            user_id = next(_ids.counter).to_bytes(16, "big").hex()
            user = stamp(
                UserMessage,
                {
                    "type": "user",
                    "text": text,
                    "name": None,
                    "message_id": user_id,
                    "turn_id": turn_id,
                    "created_at": datetime.now(UTC),
                },
                _USER_FIELDS,
            )
            history.append(user)
            response = model(ChatRequest(history, (), None, _PARAMETERS))
            values = response.ai_message.__dict__.copy()
            ai_id = values["message_id"] = next(_ids.counter).to_bytes(16, "big").hex()
            values["turn_id"] = turn_id
            values["created_at"] = datetime.now(UTC)
            ai = stamp(AiMessage, values, _AI_FIELDS)

            memory.lock.acquire()
            known = memory.known
            removed: list[str] = []
            if len(kept) + 2 > WINDOW:
                removed = [kept[0].message_id, kept[1].message_id]
                del known[removed[0]], known[removed[1]], kept[:2]
            kept += (user, ai)
            known[user_id] = known[ai_id] = 1
            store_lock.acquire()
            stored = store[memory_id]
            new_ids = [user_id, ai_id]
            if stored.ids.isdisjoint(new_ids):
                if removed and stored.mids[stored.start : stored.start + 2] == removed:
                    stored.start += 2
                    stored.ids.difference_update(removed)
                    if stored.start > 32:
                        del stored.messages[: stored.start], stored.mids[: stored.start]
                        stored.start = 0
                stored.messages += (user, ai)
                stored.mids += new_ids
                stored.ids.update(new_ids)
            store_lock.release()
            memory.lock.release()
            return ai.text
        finally:
            mutex.acquire()
            memory.held = False
            mutex.release()

    return lambda i: call("alice", "Hi there")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    contenders = {"floor": floor_scenario(), "aiservices": ours()["S1"]}
    peers = magentic_scenarios()
    if peers is not None:
        contenders["magentic"] = peers["S1"]
    best: dict[str, float] = {}
    for _ in range(5):
        for name, call in contenders.items():
            median, _p90 = measure(call, n)
            best[name] = min(best.get(name, median), median)
    for name, median in best.items():
        print(f"S1 {name:<12} {median:8.2f} us")


if __name__ == "__main__":
    main()

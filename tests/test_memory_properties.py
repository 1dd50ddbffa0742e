"""Window invariants under random conversations, for both memories (hypothesis)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from aiservices.memory import MessageWindowChatMemory, TokenWindowChatMemory
from aiservices.memory._window_memory import WindowChatMemory
from aiservices.messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionRequest,
    ToolExecutionResultMessage,
    UserMessage,
)
from aiservices.stores.in_memory import InMemoryChatMemoryStore


class Words:
    """One token per word, one per tool request."""

    def estimate_token_count_in_text(self, text: str) -> int:
        return len(text.split())

    def estimate_token_count_in_message(self, message: ChatMessage) -> int:
        text = getattr(message, "text", None) or ""
        requests = len(message.tool_execution_requests) if isinstance(message, AiMessage) else 0
        return len(text.split()) + requests


WORDS = Words()
sizes = st.integers(1, 6)
loose = st.one_of(
    st.tuples(st.just("user"), sizes),
    st.tuples(st.just("ai"), sizes),
    st.tuples(st.just("tools"), sizes, st.integers(1, 3)),
    st.tuples(st.just("result"), st.integers(0, 40)),
    st.tuples(st.just("system"), st.sampled_from("AB")),
)
answer = st.one_of(
    st.tuples(st.just("ai"), sizes),
    st.tuples(st.just("tools"), sizes, st.integers(1, 3)),
)
turn = st.builds(
    lambda head, user, answers: [*head, user, *answers],
    st.lists(st.tuples(st.just("system"), st.sampled_from("AB")), max_size=1),
    st.tuples(st.just("user"), sizes),
    st.lists(answer, max_size=3),
)


@dataclass
class Conversation:
    """Makes messages with unique texts for one memory id and remembers what it made."""

    prefix: str
    made: int = 0
    requests: list[str] = field(default_factory=list)
    order: dict[str, int] = field(default_factory=dict)

    def text(self, words: int) -> str:
        self.made += 1
        head = f"{self.prefix}{self.made}"
        self.order[head] = self.made
        return " ".join([head] + ["w"] * (words - 1))

    def messages(self, specs: list[tuple[Any, ...]]) -> list[ChatMessage]:
        out: list[ChatMessage] = []
        for spec in specs:
            kind = spec[0]
            if kind == "user":
                out.append(UserMessage(self.text(spec[1])))
            elif kind == "ai":
                out.append(AiMessage(self.text(spec[1])))
            elif kind == "system":
                out.append(SystemMessage(f"{self.prefix}system {spec[1]}"))
            elif kind == "tools":
                ids = [f"{self.prefix}r{len(self.requests) + i}" for i in range(spec[2])]
                self.requests += ids
                requests = [ToolExecutionRequest(i, "tool", "{}") for i in ids]
                out.append(AiMessage(self.text(spec[1]), requests))
                out += [ToolExecutionResultMessage(i, "tool", self.text(1)) for i in ids]
            else:
                pick = spec[1]
                request = self.requests[pick % len(self.requests)] if self.requests else "none"
                out.append(ToolExecutionResultMessage(request, "tool", self.text(1)))
        return out


def head(message: ChatMessage) -> str:
    return (getattr(message, "text", None) or "").split(" ")[0]


def units(messages: list[ChatMessage], whole_turns: bool) -> list[list[ChatMessage]]:
    """The window's eviction units, as the documented rules define them."""
    out: list[list[ChatMessage]] = []
    for m in messages:
        if whole_turns:
            starts = isinstance(m, UserMessage) or not out
        else:
            starts = not isinstance(m, ToolExecutionResultMessage) or not out
        if starts:
            out.append([m])
        else:
            out[-1].append(m)
    return out


def check_window(
    window: list[ChatMessage],
    *,
    memory: WindowChatMemory,
    limit: int,
    conversation: Conversation,
    system: str | None,
    newest: ChatMessage | None,
    keep_first: bool,
    whole_turns: bool,
    evicted_any: bool,
) -> None:
    def cost(m: ChatMessage) -> int:
        return (
            1
            if isinstance(memory, MessageWindowChatMemory)
            else WORDS.estimate_token_count_in_message(m)
        )

    systems = [m for m in window if isinstance(m, SystemMessage)]
    rest = [m for m in window if not isinstance(m, SystemMessage)]
    # No message of another conversation.
    assert all(head(m).startswith(conversation.prefix) for m in window)
    # The system message kept: one, the last one added, first when asked.
    if system is None:
        assert systems == []
    else:
        assert [m.text for m in systems] == [system]
        if keep_first:
            assert window[0] is systems[0]
    # Order preserved.
    positions = [conversation.order[head(m)] for m in rest]
    assert positions == sorted(positions)
    # No orphan tool result.
    asked: set[str] = set()
    for m in rest:
        if isinstance(m, AiMessage):
            asked.update(r.id for r in m.tool_execution_requests)
        elif isinstance(m, ToolExecutionResultMessage):
            assert m.id in asked
    # Never over the limit, but for one unit larger than the whole window kept alone, or a
    # system message larger than the window.
    total = sum(cost(m) for m in window)
    if total > limit and rest:
        parts = units(rest, whole_turns)
        assert len(parts) == 1
        assert sum(cost(m) for m in parts[0]) > limit
    # The newest message kept, unless it fits alone but not beside the system message.
    if newest is not None and (
        isinstance(newest, UserMessage)
        or (
            not whole_turns and isinstance(newest, AiMessage) and not newest.tool_execution_requests
        )
    ):
        sys_cost = sum(cost(m) for m in systems)
        assert newest in rest or (sys_cost + cost(newest) > limit >= cost(newest))
    # With whole turns, a window that lost a turn starts with a user message.
    if whole_turns and evicted_any and rest:
        assert isinstance(rest[0], UserMessage)


def make(kind: str, limit: Any, **options: Any) -> WindowChatMemory:
    if kind == "messages":
        return MessageWindowChatMemory(limit, **options)
    return TokenWindowChatMemory(limit, WORDS, **options)


def run(
    kind: str,
    script: list[tuple[str, Any]],
    *,
    keep_first: bool,
    whole_turns: bool,
    first_limit: int,
) -> None:
    store = InMemoryChatMemoryStore()
    limits = {"a": first_limit, "b": first_limit}
    options = {
        "store": store,
        "always_keep_system_message_first": keep_first,
        "evict_whole_turns": whole_turns,
    }
    memories = {mid: make(kind, lambda i: limits[i], id=mid, **options) for mid in "ab"}
    conversations = {mid: Conversation(f"{mid}-") for mid in "ab"}
    systems: dict[str, str | None] = {"a": None, "b": None}
    added: dict[str, list[ChatMessage]] = {"a": [], "b": []}
    for step, (op, value) in enumerate(script):
        mid = "ab"[step % 2] if op != "limit" else value[0]
        memory, conversation = memories[mid], conversations[mid]
        newest = None
        if op == "limit":
            limits[mid] = value[1]
        elif op == "reopen":
            memories[mid] = memory = make(kind, lambda i: limits[i], id=mid, **options)
        else:
            batch = conversation.messages(value)
            memory.add(*batch)
            added[mid] += batch
            newest = batch[-1]
            for m in batch:
                if isinstance(m, SystemMessage):
                    systems[mid] = m.text
        window = memory.messages()
        check_window(
            window,
            memory=memory,
            limit=limits[mid],
            conversation=conversation,
            system=systems[mid],
            newest=newest,
            keep_first=keep_first,
            whole_turns=whole_turns,
            evicted_any=any(
                not isinstance(m, SystemMessage) and m not in window for m in added[mid]
            ),
        )
        if newest is not None:
            # An add writes the window exactly: what it evicted leaves the store too.
            stored = store.get_messages(mid)
            assert sorted(head(m) for m in stored) == sorted(head(m) for m in window)
        # What the store holds reads back as the same window in a new memory object.
        fresh = make(kind, lambda i: limits[i], id=mid, **options)
        assert [head(m) for m in fresh.messages()] == [head(m) for m in window]


kinds = st.sampled_from(["messages", "tokens"])


def scripts(batch: st.SearchStrategy[list[tuple[Any, ...]]]) -> st.SearchStrategy[Any]:
    return st.lists(
        st.one_of(
            st.tuples(st.just("add"), batch),
            st.tuples(st.just("add"), batch),
            st.tuples(st.just("add"), batch),
            st.tuples(st.just("limit"), st.tuples(st.sampled_from("ab"), st.integers(1, 14))),
            st.tuples(st.just("reopen"), st.none()),
        ),
        max_size=25,
    )


@settings(max_examples=200, deadline=None)
@given(
    kind=kinds,
    script=scripts(st.lists(loose, min_size=1, max_size=6)),
    keep_first=st.booleans(),
    first_limit=st.integers(1, 14),
)
def test_window_invariants(
    kind: str, script: list[tuple[str, Any]], keep_first: bool, first_limit: int
) -> None:
    run(kind, script, keep_first=keep_first, whole_turns=False, first_limit=first_limit)


@settings(max_examples=200, deadline=None)
@given(
    kind=kinds,
    script=scripts(turn),
    keep_first=st.booleans(),
    first_limit=st.integers(1, 14),
)
def test_whole_turn_window_invariants(
    kind: str, script: list[tuple[str, Any]], keep_first: bool, first_limit: int
) -> None:
    run(kind, script, keep_first=keep_first, whole_turns=True, first_limit=first_limit)

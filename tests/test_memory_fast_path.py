"""The window memories' fast path for plain adds agrees with the general rules (hypothesis).

Adds of user messages and answers without tool requests, each with a new id, take a fast
path. Each script below runs on a memory as it
is and on one held to the general path; their windows and stores must match exactly, ids
included, after every step.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_memory_properties import WORDS, Conversation, sizes

from aiservices.memory import MessageWindowChatMemory, TokenWindowChatMemory
from aiservices.memory._window import WindowChatMemory
from aiservices.messages import AiMessage, ChatMessage, UserMessage, new_message_id
from aiservices.stores.in_memory import InMemoryChatMemoryStore

batch = st.lists(
    st.one_of(
        st.tuples(st.just("user"), sizes),
        st.tuples(st.just("ai"), sizes),
        st.tuples(st.just("tools"), sizes, st.integers(1, 2)),
        st.tuples(st.just("system"), st.sampled_from("AB")),
    ),
    min_size=1,
    max_size=4,
)
step = st.one_of(
    st.tuples(st.just("turn"), st.tuples(sizes, sizes)),
    st.tuples(st.just("turn"), st.tuples(sizes, sizes)),
    st.tuples(st.just("add"), batch),
    st.tuples(st.just("add_without_ids"), batch),
    st.tuples(st.just("add_again"), st.none()),
)


def _memory(kind: str, limit: int, store: InMemoryChatMemoryStore, keep_first: bool) -> Any:
    if kind == "messages":
        return MessageWindowChatMemory(
            limit, store=store, always_keep_system_message_first=keep_first
        )
    return TokenWindowChatMemory(
        limit, WORDS, store=store, always_keep_system_message_first=keep_first
    )


GIVEN: set[str | None] = set()  # the ids the tests gave; a memory gives the others


def _with_ids(messages: list[ChatMessage]) -> list[ChatMessage]:
    out = [m.with_metadata(message_id=new_message_id()) for m in messages]
    GIVEN.update(m.message_id for m in out)
    return out


def _new_id() -> str:
    mid = new_message_id()
    GIVEN.add(mid)
    return mid


def _state(memory: WindowChatMemory, store: InMemoryChatMemoryStore) -> tuple[Any, ...]:
    def ids(messages: list[ChatMessage]) -> list[tuple[ChatMessage, str | None]]:
        # Ids a memory made are random: they must exist and be unique, not be equal.
        out = [(m, m.message_id if m.message_id in GIVEN else "made") for m in messages]
        assert all(m.message_id is not None for m in messages)
        assert len({m.message_id for m in messages}) == len(messages)
        return out

    return ids(memory.messages()), ids(store.get_messages("default"))


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["messages", "tokens"]),
    limit=st.integers(1, 12),
    keep_first=st.booleans(),
    script=st.lists(step, min_size=1, max_size=14),
)
def test_the_fast_path_agrees_with_the_general_rules(
    kind: str, limit: int, keep_first: bool, script: list[tuple[str, Any]]
) -> None:
    fast_store, slow_store = InMemoryChatMemoryStore(), InMemoryChatMemoryStore()
    fast = _memory(kind, limit, fast_store, keep_first)
    slow = _memory(kind, limit, slow_store, keep_first)
    slow._plain_adds = False  # the general rules only
    conversation = Conversation("c-")
    last: list[ChatMessage] = []
    for op, value in script:
        if op == "turn":
            user = UserMessage(conversation.text(value[0]), message_id=_new_id())
            answer = AiMessage(conversation.text(value[1]), message_id=_new_id())
            fast.add(user, answer)
            slow.add(user, answer)
            last = [user, answer]
        elif op == "add_again":
            # Messages whose ids the store already holds: the general path renames them.
            fast.add(*last)
            slow.add(*last)
        else:
            messages = conversation.messages(value)
            if op == "add":
                messages = _with_ids(messages)
            fast.add(*messages)
            slow.add(*messages)
            last = messages
        assert _state(fast, fast_store) == _state(slow, slow_store), (op, value)


def test_a_plain_add_evicts_a_tool_exchange_at_the_front_with_its_results() -> None:
    conversation = Conversation("t-")
    memory = MessageWindowChatMemory(4)
    memory.add(*_with_ids(conversation.messages([("user", 1), ("tools", 1, 2)])))
    assert len(memory.messages()) == 4  # user, the request, two results
    user = UserMessage("next", message_id=new_message_id())
    answer = AiMessage("fine", message_id=new_message_id())
    memory.add(user, answer)
    # The request goes, and its results with it: no orphan stays in the window.
    assert memory.messages() == [user, answer]
    assert memory.store.get_messages("default") == [user, answer]

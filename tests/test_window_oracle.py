"""Both window memories against a plain model of their rules, over random conversations."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _window_oracle import WindowOracle
from hypothesis import given, settings
from hypothesis import strategies as st

from aiservices import MessageWindowChatMemory, SqliteChatMemoryStore, TokenWindowChatMemory
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
    """One token per word of text, one per tool request."""

    def estimate_token_count_in_text(self, text: str) -> int:
        return len(text.split())

    def estimate_token_count_in_message(self, message: ChatMessage) -> int:
        text = getattr(message, "text", None) or ""
        requests = len(message.tool_execution_requests) if isinstance(message, AiMessage) else 0
        return self.estimate_token_count_in_text(text) + requests


WORDS = Words()


@dataclass
class Conversation:
    """Builds messages from specs; every text is unique, so that list equality means the
    same messages in the same order."""

    made: int = 0
    requests: list[str] = field(default_factory=list)

    def text(self, words: int) -> str:
        self.made += 1
        return " ".join([f"m{self.made}"] + ["w"] * (words - 1))

    def build(self, specs: list[tuple[Any, ...]]) -> list[ChatMessage]:
        out: list[ChatMessage] = []
        for kind, *args in specs:
            if kind == "system":
                out.append(SystemMessage(f"system {args[0]}"))
            elif kind == "user":
                out.append(UserMessage(self.text(args[0])))
            elif kind == "ai":
                out.append(AiMessage(self.text(args[0])))
            elif kind == "tools":
                words, count, answered = args
                ids = [f"r{len(self.requests) + i}" for i in range(count)]
                self.requests += ids
                asked = [ToolExecutionRequest(i, "calc", "{}") for i in ids]
                out.append(AiMessage(self.text(words), asked))
                out += [self.result(ids[i]) for i in answered if i < count]
            elif kind == "reask":  # a request id used before (a model reusing "call_0")
                known = self.requests or ["r-first"]
                rid = known[args[0] % len(known)]
                out.append(AiMessage(self.text(1), [ToolExecutionRequest(rid, "calc", "{}")]))
            else:  # a result for an earlier request, evicted or not, or for none
                known = [*self.requests, "never-asked"]
                out.append(self.result(known[args[0] % len(known)]))
        return out

    def result(self, request_id: str) -> ToolExecutionResultMessage:
        return ToolExecutionResultMessage(request_id, "calc", self.text(1))


sizes = st.integers(1, 5)
system = st.tuples(st.just("system"), st.sampled_from("ABC"))
tools = st.tuples(
    st.just("tools"),
    sizes,
    st.integers(1, 3),
    # Maybe only some results, maybe out of order.
    st.lists(st.integers(0, 2), unique=True, max_size=3),
)
late = st.tuples(st.just("late"), st.integers(0, 50))
reask = st.tuples(st.just("reask"), st.integers(0, 50))
answer = st.one_of(st.tuples(st.just("ai"), sizes), tools, late, reask)
anything = st.one_of(system, st.tuples(st.just("user"), sizes), answer)
# With whole turns a batch is a turn, as a service adds it.
turn = st.builds(
    lambda head, question, answers: [*head, question, *answers],
    st.lists(system, max_size=1),
    st.tuples(st.just("user"), sizes),
    st.lists(answer, max_size=3),
)


def scripts(batch: st.SearchStrategy[Any], limits: st.SearchStrategy[int]) -> Any:
    return st.lists(
        st.one_of(
            st.tuples(st.just("add"), batch),
            st.tuples(st.just("add"), batch),
            st.tuples(st.just("add"), batch),
            st.tuples(st.just("limit"), limits),
            # Changed with no read before the next add: a read may have hidden messages that
            # the store still holds, and the add must see them again.
            st.tuples(st.just("limit unread"), limits),
            st.tuples(st.just("reopen"), st.none()),
        ),
        max_size=20,
    )


@pytest.fixture(scope="module")
def sqlite_store(tmp_path_factory: pytest.TempPathFactory) -> SqliteChatMemoryStore:
    return SqliteChatMemoryStore(Path(tmp_path_factory.mktemp("oracle")) / "x.db")


def check(
    kind: str,
    store_factory: Callable[[], Any],
    script: list[tuple[str, Any]],
    *,
    first_limit: int,
    keep_first: bool,
    whole_turns: bool,
) -> None:
    store = store_factory()
    memory_id = uuid.uuid4().hex
    limit = [first_limit]
    options: dict[str, Any] = {
        "id": memory_id,
        "store": store,
        "always_keep_system_message_first": keep_first,
        "evict_whole_turns": whole_turns,
    }

    def make() -> MessageWindowChatMemory | TokenWindowChatMemory:
        if kind == "messages":
            return MessageWindowChatMemory(lambda _: limit[0], **options)
        return TokenWindowChatMemory(lambda _: limit[0], WORDS, **options)

    cost = None if kind == "messages" else WORDS.estimate_token_count_in_message
    oracle = WindowOracle(first_limit, cost, keep_system_first=keep_first, whole_turns=whole_turns)
    memory = make()
    conversation = Conversation()
    for step, (op, value) in enumerate(script):
        if op.startswith("limit"):
            limit[0] = oracle.limit = value
            if op == "limit unread":
                continue
        elif op == "reopen":
            memory = make()
        else:
            batch = conversation.build(value)
            memory.add(*batch)
            oracle.add(*batch)
        expected = oracle.messages()
        window = memory.messages()
        assert window == expected, f"step {step}: {op} {value!r}"
        ids = [m.message_id for m in window]
        assert None not in ids
        assert len(set(ids)) == len(ids)
        if op == "add":
            # An add writes exactly the window; the store may keep the system message where
            # it was added while the window shows it first.
            stored = store.get_messages(memory_id)
            assert len(stored) == len(ids)
            assert {m.message_id for m in stored} == set(ids)
            if not keep_first:
                assert stored == window
        assert make().messages() == expected, f"step {step}: re-read from the store"


stores = pytest.mark.parametrize("store_kind", ["in-memory", "sqlite"])


def factory(store_kind: str, request: pytest.FixtureRequest) -> Callable[[], Any]:
    if store_kind == "sqlite":
        shared = request.getfixturevalue("sqlite_store")
        return lambda: shared
    return InMemoryChatMemoryStore


@stores
@settings(max_examples=200, deadline=None)
@given(
    script=scripts(st.lists(anything, min_size=1, max_size=4), st.integers(1, 8)),
    first_limit=st.integers(1, 8),
    keep_first=st.booleans(),
)
def test_message_window_matches_the_oracle(
    request: pytest.FixtureRequest,
    store_kind: str,
    script: list[tuple[str, Any]],
    first_limit: int,
    keep_first: bool,
) -> None:
    check(
        "messages",
        factory(store_kind, request),
        script,
        first_limit=first_limit,
        keep_first=keep_first,
        whole_turns=False,
    )


@stores
@settings(max_examples=200, deadline=None)
@given(
    script=scripts(st.lists(anything, min_size=1, max_size=4), st.integers(1, 25)),
    first_limit=st.integers(1, 25),
    keep_first=st.booleans(),
)
def test_token_window_matches_the_oracle(
    request: pytest.FixtureRequest,
    store_kind: str,
    script: list[tuple[str, Any]],
    first_limit: int,
    keep_first: bool,
) -> None:
    check(
        "tokens",
        factory(store_kind, request),
        script,
        first_limit=first_limit,
        keep_first=keep_first,
        whole_turns=False,
    )


@stores
@pytest.mark.parametrize("kind", ["messages", "tokens"])
@settings(max_examples=200, deadline=None)
@given(
    script=scripts(turn, st.integers(1, 20)),
    first_limit=st.integers(1, 20),
    keep_first=st.booleans(),
)
def test_whole_turn_windows_match_the_oracle(
    request: pytest.FixtureRequest,
    store_kind: str,
    kind: str,
    *,
    script: list[tuple[str, Any]],
    first_limit: int,
    keep_first: bool,
) -> None:
    check(
        kind,
        factory(store_kind, request),
        script,
        first_limit=first_limit,
        keep_first=keep_first,
        whole_turns=True,
    )


def calc(request_id: str) -> tuple[AiMessage, ToolExecutionResultMessage]:
    asked = AiMessage(tool_execution_requests=[ToolExecutionRequest(request_id, "calc", "{}")])
    return asked, ToolExecutionResultMessage(request_id, "calc", "4")


@pytest.mark.parametrize("together", [True, False])
def test_a_tool_call_that_fits_only_without_the_system_message_goes_with_its_result(
    together: bool,
) -> None:
    system = SystemMessage("Use the calculator")
    asked, result = calc("1")
    oracle = WindowOracle(1)
    memory = MessageWindowChatMemory(1)
    batches = [[system, asked, result]] if together else [[system], [asked], [result]]
    for batch in batches:
        oracle.add(*batch)
        memory.add(*batch)
    assert oracle.messages() == [system]
    assert memory.messages() == [system]


def test_a_limit_raised_before_the_next_add_brings_back_what_a_read_hid() -> None:
    a, b, c = UserMessage("a"), UserMessage("b"), UserMessage("c")
    limit = [3]
    oracle = WindowOracle(3)
    memory = MessageWindowChatMemory(lambda _: limit[0])
    for m in (oracle, memory):
        m.add(a, b)
    limit[0] = oracle.limit = 1
    assert memory.messages() == oracle.messages() == [b]
    # The store still holds a; the add reads the limit again, and all three fit.
    limit[0] = oracle.limit = 3
    for m in (oracle, memory):
        m.add(c)
    assert oracle.messages() == [a, b, c]
    assert memory.messages() == [a, b, c]


# The oracle itself, on examples worked by hand from the rules, the documentation and the
# unit tests.
S, S2 = SystemMessage("s"), SystemMessage("s2")
U1, U2, U3 = UserMessage("u1"), UserMessage("u2"), UserMessage("u3")
A1, A2 = AiMessage("a1"), AiMessage("a2")
ASK, ANSWER = calc("1")
ASK2 = AiMessage(
    tool_execution_requests=[ToolExecutionRequest("2", "c", "{}"), ToolExecutionRequest("3", "c")]
)
R2, R3 = (ToolExecutionResultMessage(i, "c", "x") for i in "23")
BIG = UserMessage("big " * 20)
BIG_ASK = AiMessage("big " * 20, [ToolExecutionRequest("4", "c")])
BIG_ANSWER = ToolExecutionResultMessage("4", "c", "x")


@pytest.mark.parametrize(
    ("oracle", "batches", "expected"),
    [
        (WindowOracle(3), [[S], [U1], [A1], [S2]], [U1, A1, S2]),
        (WindowOracle(3, keep_system_first=True), [[U1], [S], [A1], [S2]], [S2, U1, A1]),
        (WindowOracle(5), [[U1, S], [A1], [S]], [U1, S, A1]),
        (WindowOracle(2), [[S], [U1], [ASK], [ANSWER]], [S]),
        (WindowOracle(3), [[ASK2, R2, U1, R3]], [U1]),
        (WindowOracle(2), [[ASK2, R2, R3]], []),
        (WindowOracle(5), [[U1, ANSWER]], [U1]),
        (
            WindowOracle(3, whole_turns=True),
            [[S, U1, A1], [U2, ASK, ANSWER, A2]],
            [S, U2, ASK, ANSWER, A2],
        ),
        (WindowOracle(4, whole_turns=True), [[U1, A1, U2, A2], [U3]], [U2, A2, U3]),
        (WindowOracle(10, WORDS.estimate_token_count_in_message), [[U1], [BIG]], [BIG]),
        (WindowOracle(10, WORDS.estimate_token_count_in_message), [[BIG], [A1]], [A1]),
        (WindowOracle(3, WORDS.estimate_token_count_in_message), [[S, ASK2, R2, R3]], [S]),
        (
            WindowOracle(10, WORDS.estimate_token_count_in_message),
            [[S, U1, BIG_ASK, BIG_ANSWER]],
            [S, BIG_ASK, BIG_ANSWER],
        ),
    ],
)
def test_the_oracle_on_documented_examples(
    oracle: WindowOracle, batches: list[list[ChatMessage]], expected: list[ChatMessage]
) -> None:
    for batch in batches:
        oracle.add(*batch)
    assert oracle.messages() == expected

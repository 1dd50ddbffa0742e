"""MessageWindowChatMemory: the window's rules, limits, store traffic, threads and async."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Collection, Hashable, Sequence
from typing import Any

import pytest

from aiservices.memory import ChatMemory, MessageWindowChatMemory
from aiservices.messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionRequest,
    ToolExecutionResultMessage,
    UserMessage,
)
from aiservices.stores.in_memory import InMemoryChatMemoryStore


class CountingStore:
    """A real in-memory store that records every call made to it."""

    is_blocking = False

    def __init__(self) -> None:
        self.inner = InMemoryChatMemoryStore()
        self.calls: list[tuple[str, Any]] = []

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def get_messages(self, memory_id: Hashable) -> list[ChatMessage]:
        self.calls.append(("get", memory_id))
        return self.inner.get_messages(memory_id)

    def update_messages(self, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
        self.calls.append(("update", list(messages)))
        self.inner.update_messages(memory_id, messages)

    def apply_changes(
        self, memory_id: Hashable, *, appended: Sequence[ChatMessage], removed: Collection[str]
    ) -> None:
        self.calls.append(("apply", (list(appended), list(removed))))
        self.inner.apply_changes(memory_id, appended=appended, removed=removed)

    def delete_messages(self, memory_id: Hashable) -> None:
        self.calls.append(("delete", memory_id))
        self.inner.delete_messages(memory_id)


class PlainStore:
    """Only the three protocol methods: no deltas, and blocking (async goes to a thread)."""

    def __init__(self) -> None:
        self.rows: dict[Hashable, list[ChatMessage]] = {}
        self.updates = 0
        self.threads: set[int] = set()

    def get_messages(self, memory_id: Hashable) -> list[ChatMessage]:
        self.threads.add(threading.get_ident())
        return list(self.rows.get(memory_id, []))

    def update_messages(self, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
        self.threads.add(threading.get_ident())
        self.updates += 1
        self.rows[memory_id] = list(messages)

    def delete_messages(self, memory_id: Hashable) -> None:
        self.rows.pop(memory_id, None)


def user(text: str) -> UserMessage:
    return UserMessage(text)


def ai(text: str) -> AiMessage:
    return AiMessage(text)


def calc(*ids: str) -> tuple[AiMessage, list[ToolExecutionResultMessage]]:
    requests = [ToolExecutionRequest(i, "calculator", '{"a": 2, "b": 2}') for i in ids]
    return AiMessage(tool_execution_requests=requests), [
        ToolExecutionResultMessage(i, "calculator", "4") for i in ids
    ]


def test_id_defaults_to_default_and_satisfies_the_protocol() -> None:
    assert MessageWindowChatMemory(1).id == "default"
    memory = MessageWindowChatMemory(1, id="abc")
    assert memory.id == "abc"
    assert isinstance(memory, ChatMemory)


def test_unhashable_id_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="hashable"):
        MessageWindowChatMemory(3, id=["alice"])  # type: ignore[arg-type]


def test_store_and_clear() -> None:
    memory = MessageWindowChatMemory(2)
    memory.add(user("hello"))
    memory.add(user("world"))
    assert memory.messages() == [user("hello"), user("world")]
    memory.add(user("banana"))
    assert memory.messages() == [user("world"), user("banana")]
    memory.clear()
    memory.clear()
    assert memory.messages() == []


def test_default_window_is_ten_messages() -> None:
    memory = MessageWindowChatMemory()
    memory.add(*(user(str(i)) for i in range(12)))
    assert memory.messages() == [user(str(i)) for i in range(2, 12)]


def test_keeps_the_newest_messages() -> None:
    memory = MessageWindowChatMemory(3)
    memory.add(user("hello"))
    memory.add(ai("hi"))
    memory.add(user("sup"))
    assert memory.messages() == [user("hello"), ai("hi"), user("sup")]
    memory.add(ai("not much"))
    assert memory.messages() == [ai("hi"), user("sup"), ai("not much")]


def test_batch_add_beyond_the_limit_keeps_the_newest_and_never_stores_the_rest() -> None:
    store = CountingStore()
    memory = MessageWindowChatMemory(3, store=store)
    memory.add(user("old"))
    memory.add(*(user(str(i)) for i in range(6)))
    assert memory.messages() == [user("3"), user("4"), user("5")]
    (appended, removed) = store.calls[-2][1]
    assert [m.text for m in appended] == ["3", "4", "5"]  # type: ignore[union-attr]
    assert len(removed) == 1


def test_system_message_is_never_evicted_and_counts() -> None:
    memory = MessageWindowChatMemory(3)
    system = SystemMessage("You are a helpful assistant")
    memory.add(system)
    memory.add(user("Hello"))
    memory.add(ai("Hi, how can I help you?"))
    assert memory.messages() == [system, user("Hello"), ai("Hi, how can I help you?")]
    memory.add(user("Tell me a joke"))
    assert memory.messages() == [system, ai("Hi, how can I help you?"), user("Tell me a joke")]
    memory.add(ai("No."))
    assert memory.messages() == [system, user("Tell me a joke"), ai("No.")]


def test_a_different_system_message_replaces_the_old_one_at_the_end() -> None:
    memory = MessageWindowChatMemory(3)
    memory.add(SystemMessage("helpful"))
    memory.add(user("Hello"))
    memory.add(ai("Hi"))
    memory.add(SystemMessage("unhelpful"))
    assert memory.messages() == [user("Hello"), ai("Hi"), SystemMessage("unhelpful")]
    memory.add(user("again"))
    assert memory.messages() == [ai("Hi"), SystemMessage("unhelpful"), user("again")]
    memory.add(user("and again"))
    memory.add(user("and again!"))
    assert memory.messages() == [SystemMessage("unhelpful"), user("and again"), user("and again!")]


def test_the_same_system_message_is_ignored_without_a_write() -> None:
    store = CountingStore()
    memory = MessageWindowChatMemory(3, store=store)
    system = SystemMessage("You are a helpful assistant")
    memory.add(system, user("Hello"), ai("Hi"))
    writes = len(store.calls)
    memory.add(SystemMessage("You are a helpful assistant"))
    assert len(store.calls) == writes
    assert memory.messages() == [system, user("Hello"), ai("Hi")]


def test_one_system_message_survives_a_batch_with_two() -> None:
    memory = MessageWindowChatMemory(5)
    memory.add(SystemMessage("a"), user("1"), SystemMessage("b"), user("2"))
    assert memory.messages() == [user("1"), SystemMessage("b"), user("2")]


@pytest.mark.parametrize("first", [True, False])
def test_always_keep_system_message_first(first: bool) -> None:
    memory = MessageWindowChatMemory(5, always_keep_system_message_first=first)
    system = SystemMessage("You are a helpful assistant")
    memory.add(user("Hello"))
    memory.add(system)
    memory.add(ai("Hi"))
    expected = [system, user("Hello"), ai("Hi")] if first else [user("Hello"), system, ai("Hi")]
    assert memory.messages() == expected


def test_system_message_first_survives_eviction_and_replacement() -> None:
    memory = MessageWindowChatMemory(3, always_keep_system_message_first=True)
    memory.add(SystemMessage("s1"), user("1"), user("2"))
    memory.add(user("3"))
    assert memory.messages() == [SystemMessage("s1"), user("2"), user("3")]
    memory.add(SystemMessage("s2"))
    assert memory.messages() == [SystemMessage("s2"), user("2"), user("3")]
    # A fresh memory on the same store sees it first too, though the store appended it.
    again = MessageWindowChatMemory(3, store=memory.store, always_keep_system_message_first=True)
    assert again.messages() == [SystemMessage("s2"), user("2"), user("3")]


def test_evicting_an_ai_message_evicts_its_tool_results() -> None:
    memory = MessageWindowChatMemory(2)
    question = user("How much is 2+2?")
    request, (result,) = calc("1")
    memory.add(question)
    memory.add(request)
    assert memory.messages() == [question, request]
    memory.add(result)
    assert memory.messages() == [request, result]
    memory.add(ai("2 + 2 = 4"))
    assert memory.messages() == [ai("2 + 2 = 4")]


def test_evicting_tool_results_with_a_system_message() -> None:
    memory = MessageWindowChatMemory(3)
    system = SystemMessage("Use calculator for math questions")
    request, (result,) = calc("1")
    memory.add(system)
    memory.add(user("How much is 2+2?"))
    memory.add(request)
    memory.add(result)
    assert memory.messages() == [system, request, result]
    memory.add(ai("2 + 2 = 4"))
    assert memory.messages() == [system, ai("2 + 2 = 4")]


def test_a_tool_result_whose_request_is_evicted_goes_too() -> None:
    memory = MessageWindowChatMemory(2)
    system = SystemMessage("Use calculator for math questions")
    request, (result,) = calc("1")
    memory.add(system)
    memory.add(user("How much is 2+2?"))
    memory.add(request)
    assert memory.messages() == [system, request]
    memory.add(result)
    assert memory.messages() == [system]


@pytest.mark.parametrize("with_system", [False, True])
def test_several_tool_results_go_with_their_request(with_system: bool) -> None:
    memory = MessageWindowChatMemory(4 if with_system else 3)
    system = SystemMessage("Use calculator")
    request, results = calc("1", "2")
    if with_system:
        memory.add(system)
    memory.add(user("2+2 and 3+3?"))
    memory.add(request)
    memory.add(results[0])
    memory.add(results[1])
    head = [system] if with_system else []
    assert memory.messages() == [*head, request, *results]
    memory.add(ai("4 and 6"))
    assert memory.messages() == [*head, ai("4 and 6")]


def test_a_tool_result_without_its_request_in_the_window_is_dropped() -> None:
    store = CountingStore()
    memory = MessageWindowChatMemory(5, store=store)
    memory.add(user("hi"), ToolExecutionResultMessage("nope", "calculator", "4"))
    assert memory.messages() == [user("hi")]
    assert [m.text for m in store.inner.get_messages("default")] == ["hi"]  # type: ignore[union-attr]


def test_a_tool_result_left_behind_apart_from_its_request_is_dropped() -> None:
    memory = MessageWindowChatMemory(3)
    request, results = calc("1", "2")
    memory.add(request, results[0], user("wait"), results[1])
    assert memory.messages() == [user("wait")]


def test_a_result_before_a_reused_request_id_goes_with_the_request_it_answered() -> None:
    # A result answers a request before it: once that request is evicted, a later request
    # with the same id (a model reusing "call_0") does not keep the result in the window.
    memory = MessageWindowChatMemory(3)
    ask = AiMessage(tool_execution_requests=[ToolExecutionRequest("call_0", "calc", "{}")])
    memory.add(ask)
    memory.add(user("u1"))
    memory.add(ToolExecutionResultMessage("call_0", "calc", "4"))
    memory.add(ask)
    assert memory.messages() == [user("u1"), ask]
    fresh = MessageWindowChatMemory(3, store=memory.store)
    assert fresh.messages() == memory.messages()


def test_stored_orphans_and_extra_system_messages_are_dropped_at_read() -> None:
    store = InMemoryChatMemoryStore()
    store.update_messages(
        "default",
        [
            SystemMessage("old"),
            ToolExecutionResultMessage("x", "calculator", "4"),
            user("hi"),
            SystemMessage("new"),
        ],
    )
    assert MessageWindowChatMemory(5, store=store).messages() == [user("hi"), SystemMessage("new")]


def test_evict_whole_turns_never_leaves_an_ai_or_tool_message_first() -> None:
    memory = MessageWindowChatMemory(4, evict_whole_turns=True)
    request, (result,) = calc("1")
    memory.add(user("q1"), request, result, ai("a1"))
    memory.add(user("q2"), ai("a2"))
    assert memory.messages() == [user("q2"), ai("a2")]
    memory.add(user("q3"))
    assert memory.messages() == [user("q2"), ai("a2"), user("q3")]
    memory.add(ai("a3"), user("q4"))
    assert memory.messages() == [user("q3"), ai("a3"), user("q4")]


def test_evict_whole_turns_keeps_a_turn_larger_than_the_window_alone() -> None:
    memory = MessageWindowChatMemory(3, evict_whole_turns=True)
    system = SystemMessage("s")
    request, (result,) = calc("1")
    memory.add(system, user("q1"), ai("a1"))
    memory.add(user("q2"), request, result, ai("a2"))
    assert memory.messages() == [system, user("q2"), request, result, ai("a2")]
    memory.add(user("q3"))
    assert memory.messages() == [system, user("q3")]


def test_without_whole_turns_a_window_may_start_with_an_ai_message() -> None:
    memory = MessageWindowChatMemory(3)
    memory.add(user("q1"), ai("a1"), user("q2"), ai("a2"))
    assert memory.messages()[0] == ai("a1")


@pytest.mark.parametrize("read_between", [False, True])
def test_an_answer_added_after_a_read_that_hid_its_question_keeps_the_turn_whole(
    read_between: bool,
) -> None:
    # The newest whole turn stays alone beside the system message; a read under the
    # lowered limit in between hides the question, but must not change what the add keeps.
    limit = [3]
    memory = MessageWindowChatMemory(lambda _: limit[0], evict_whole_turns=True)
    memory.add(SystemMessage("S"), user("U1"), ai("A1"))
    memory.add(user("U2"))
    limit[0] = 1
    if read_between:
        assert memory.messages() == [SystemMessage("S")]
    memory.add(ai("A2"))
    assert memory.messages() == [SystemMessage("S"), user("U2"), ai("A2")]
    assert memory.store.get_messages("default") == [SystemMessage("S"), user("U2"), ai("A2")]


def test_limit_may_depend_on_the_memory_id() -> None:
    def limits(memory_id: str) -> int:
        return {"short": 2, "long": 4}.get(memory_id, 3)

    for memory_id, kept in [("short", 2), ("long", 4), ("other", 3)]:
        memory = MessageWindowChatMemory(limits, id=memory_id)
        for i in range(6):
            memory.add(user(str(i)))
        assert memory.messages() == [user(str(i)) for i in range(6 - kept, 6)]


def test_limit_changes_between_calls_for_the_same_memory() -> None:
    store = CountingStore()
    limit = [3]
    memory = MessageWindowChatMemory(lambda _: limit[0], id="same-id", store=store)
    for text in "ABC":
        memory.add(user(text))
    assert memory.messages() == [user("A"), user("B"), user("C")]
    memory.add(user("D"))
    assert memory.messages() == [user("B"), user("C"), user("D")]
    limit[0] = 5  # raised: keeps more from now on
    memory.add(user("E"))
    assert memory.messages() == [user("B"), user("C"), user("D"), user("E")]
    limit[0] = 2  # lowered: trims at the next read, without writing
    writes = [n for n in store.names() if n != "get"]
    assert memory.messages() == [user("D"), user("E")]
    assert [n for n in store.names() if n != "get"] == writes
    assert len(store.inner.get_messages("same-id")) == 4
    memory.add(user("F"))  # the next write removes what the read trimmed
    assert [m.text for m in store.inner.get_messages("same-id")] == ["E", "F"]  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", [0, -1])
def test_a_limit_below_one_is_a_value_error(bad: int) -> None:
    with pytest.raises(ValueError, match=rf"max_messages must be at least 1 \(got {bad}\)"):
        MessageWindowChatMemory(bad)
    with pytest.raises(ValueError, match="at least 1"):
        MessageWindowChatMemory.provider(bad)


@pytest.mark.parametrize("bad", [2.5, "10", True, None])
def test_a_limit_that_is_not_a_whole_number_is_a_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match="max_messages"):
        MessageWindowChatMemory(bad)  # type: ignore[arg-type]


def test_a_callable_limit_is_checked_at_use() -> None:
    limit: list[object] = [-1]
    memory = MessageWindowChatMemory(lambda _: limit[0], id="x")  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match=r"max_messages\('x'\) returned -1"):
        memory.add(user("hi"))
    with pytest.raises(ValueError, match="at least 1"):
        memory.messages()
    limit[0] = 1.5
    with pytest.raises(TypeError, match=r"returned 1\.5"):
        memory.add(user("hi"))
    limit[0] = 1
    memory.add(user("hi"))
    assert memory.messages() == [user("hi")]


def test_messages_reads_the_store_once_and_add_then_writes_once_without_reading() -> None:
    store = CountingStore()
    memory = MessageWindowChatMemory(10, store=store)
    memory.messages()
    memory.add(SystemMessage("s"), user("q"), ai("a"))
    assert store.names() == ["get", "apply"]
    memory.messages()
    memory.add(SystemMessage("s"), user("q2"), ai("a2"))
    assert store.names() == ["get", "apply", "get", "apply"]


def test_a_fresh_memory_reads_once_before_its_first_write() -> None:
    store = CountingStore()
    MessageWindowChatMemory(10, store=store).add(user("q"))
    assert store.names() == ["get", "apply"]


def test_the_write_is_a_delta_of_new_messages_and_evicted_ids() -> None:
    store = CountingStore()
    memory = MessageWindowChatMemory(3, store=store)
    memory.add(user("1"), ai("2"), user("3"))
    before = memory.messages()
    memory.add(ai("4"), user("5"))
    appended, removed = store.calls[-1][1]
    assert appended == [ai("4"), user("5")]
    assert removed == [before[0].message_id, before[1].message_id]


def test_messages_get_a_message_id_and_the_callers_objects_are_untouched() -> None:
    memory = MessageWindowChatMemory(5)
    mine = user("hi")
    memory.add(mine, mine)
    assert mine.message_id is None
    stored = memory.messages()
    assert stored == [mine, mine]
    assert all(m.message_id for m in stored)
    assert stored[0].message_id != stored[1].message_id


def test_a_recorded_message_added_twice_gets_a_new_id_the_second_time() -> None:
    memory = MessageWindowChatMemory(5)
    recorded = user("hi").with_metadata(message_id="m1", turn_id="t1")
    memory.add(recorded)
    memory.add(recorded)
    ids = [m.message_id for m in memory.messages()]
    assert ids[0] == "m1"
    assert ids[1] not in (None, "m1")
    assert [m.turn_id for m in memory.messages()] == ["t1", "t1"]


def test_a_delta_write_keeps_what_another_writer_appended_meanwhile() -> None:
    store = InMemoryChatMemoryStore()
    one = MessageWindowChatMemory(10, id="c", store=store)
    two = MessageWindowChatMemory(10, id="c", store=store)
    one.messages()
    two.add(user("from two"))
    one.add(user("from one"))
    assert one.messages() == [user("from two"), user("from one")]


@pytest.fixture(params=["in_memory", "sqlite"])
def shared_store(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """A store two memories of one conversation share, as two processes would."""
    if request.param == "in_memory":
        yield InMemoryChatMemoryStore()
        return
    from aiservices.stores import SqliteChatMemoryStore

    with SqliteChatMemoryStore(tmp_path / "shared.db") as store:
        yield store


def test_a_memory_shows_another_writers_new_order(shared_store: Any) -> None:
    one = MessageWindowChatMemory(10, id="c", store=shared_store)
    one.add(user("u1"), ai("a1"), SystemMessage("S"), user("u2"))
    assert one.messages() == [user("u1"), ai("a1"), SystemMessage("S"), user("u2")]
    two = MessageWindowChatMemory(10, id="c", store=shared_store)
    held = two.messages()
    two.set([held[2], held[0], held[1], held[3]])  # the system message first
    expected = [SystemMessage("S"), user("u1"), ai("a1"), user("u2")]
    assert two.messages() == expected
    assert one.messages() == expected


def test_a_memory_shows_another_writers_rewrite_of_a_message(shared_store: Any) -> None:
    one = MessageWindowChatMemory(10, id="c", store=shared_store)
    one.add(user("my card is 4111 1111"), ai("noted"))
    one.messages()
    two = MessageWindowChatMemory(10, id="c", store=shared_store)
    held = two.messages()
    two.set([held[0].model_copy(update={"text": "my card is [redacted]"}), held[1]])
    assert [m.text for m in one.messages()] == ["my card is [redacted]", "noted"]
    assert one.messages()[0].message_id == held[0].message_id


def test_set_ignores_a_system_message_repeated_as_add_does() -> None:
    given = [SystemMessage("S"), user("u1"), ai("a1"), SystemMessage("S"), user("u2")]
    added = MessageWindowChatMemory(10)
    added.add(*given)
    set_ = MessageWindowChatMemory(10)
    set_.set(given)
    expected = [SystemMessage("S"), user("u1"), ai("a1"), user("u2")]
    assert added.messages() == expected
    assert set_.messages() == expected
    assert set_.store.get_messages("default") == expected


def test_a_store_without_deltas_gets_the_whole_window() -> None:
    store = PlainStore()
    memory = MessageWindowChatMemory(2, store=store)
    memory.add(user("1"), user("2"), user("3"))
    assert store.rows["default"] == [user("2"), user("3")]
    assert store.updates == 1
    assert all(m.message_id for m in store.rows["default"])


def test_set_applies_the_rules_and_rewrites_the_store() -> None:
    store = CountingStore()
    memory = MessageWindowChatMemory(3, store=store)
    request, (result,) = calc("1")
    memory.set([SystemMessage("a"), user("1"), request, result, SystemMessage("b"), user("2")])
    assert memory.messages() == [SystemMessage("b"), user("2")]
    assert store.names() == ["update", "get"]
    assert all(m.message_id for m in store.calls[0][1])


def test_set_with_a_window_that_fits_keeps_everything_in_order() -> None:
    memory = MessageWindowChatMemory(10)
    given = [SystemMessage("s"), user("1"), ai("2")]
    memory.set(iter(given))
    assert memory.messages() == given


def test_clear_deletes_the_conversation() -> None:
    store = CountingStore()
    memory = MessageWindowChatMemory(3, store=store)
    memory.add(user("hi"))
    memory.clear()
    assert store.names()[-1] == "delete"
    assert store.inner.get_messages("default") == []
    memory.add(user("again"))
    assert memory.messages() == [user("again")]


def test_add_rejects_what_is_not_a_message() -> None:
    memory = MessageWindowChatMemory(3)
    with pytest.raises(TypeError, match=r"item 1 is a str.*UserMessage"):
        memory.add(user("ok"), "hi")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="set"):
        memory.set([{"text": "hi"}])  # type: ignore[list-item]
    assert memory.messages() == []


def test_a_store_missing_methods_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="no get_messages, update_messages, delete_messages"):
        MessageWindowChatMemory(3, store=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"the class InMemoryChatMemoryStore.*InMemoryChat"):
        MessageWindowChatMemory(3, store=InMemoryChatMemoryStore)  # type: ignore[arg-type]


class FailingOnce(CountingStore):
    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    def apply_changes(
        self, memory_id: Hashable, *, appended: Sequence[ChatMessage], removed: Collection[str]
    ) -> None:
        if self.fail:
            self.fail = False
            raise OSError("disk full")
        super().apply_changes(memory_id, appended=appended, removed=removed)


def test_a_failed_write_leaves_the_memory_as_it_was() -> None:
    store = FailingOnce()
    memory = MessageWindowChatMemory(2, store=store)
    memory.add(user("1"), user("2"))
    store.fail = True
    with pytest.raises(OSError, match="disk full"):
        memory.add(user("3"))
    assert memory.messages() == [user("1"), user("2")]
    memory.add(user("4"))
    assert memory.messages() == [user("2"), user("4")]


def test_threads_adding_to_one_memory_lose_nothing() -> None:
    memory = MessageWindowChatMemory(10_000)
    barrier = threading.Barrier(4)

    def work(n: int) -> None:
        barrier.wait()
        for i in range(50):
            memory.add(user(f"{n}-{i}"), ai(f"{n}-{i}"))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    texts = [m.text for m in memory.messages()]  # type: ignore[union-attr]
    assert len(texts) == 400
    for n in range(4):
        mine = [t for t in texts if t.startswith(f"{n}-")]
        assert mine == [f"{n}-{i}" for i in range(50) for _ in (0, 1)]


def test_provider_gives_each_id_its_own_memory_on_one_store() -> None:
    store = InMemoryChatMemoryStore()
    provider = MessageWindowChatMemory.provider(
        2, store=store, always_keep_system_message_first=True
    )
    alice, bob = provider("alice"), provider("bob")
    assert (alice.id, bob.id) == ("alice", "bob")
    assert alice.store is store
    assert bob.store is store
    alice.add(user("hi"), SystemMessage("s"))
    bob.add(user("yo"))
    assert provider("alice").messages() == [SystemMessage("s"), user("hi")]
    assert provider("bob").messages() == [user("yo")]
    assert "MessageWindowChatMemory.provider(max_messages=2" in repr(provider)


def test_provider_default_store_is_shared_by_its_ids_only() -> None:
    one, two = MessageWindowChatMemory.provider(3), MessageWindowChatMemory.provider(3)
    one("a").add(user("hi"))
    assert one("a").messages() == [user("hi")]
    assert two("a").messages() == []
    assert isinstance(one.store, InMemoryChatMemoryStore)


def test_provider_passes_evict_whole_turns_on() -> None:
    provider = MessageWindowChatMemory.provider(2, evict_whole_turns=True)
    memory = provider(1)
    memory.add(user("q1"), ai("a1"), user("q2"))
    assert memory.messages() == [user("q2")]


class NativeAsyncStore(CountingStore):
    """An async-native store: its async methods are the ones async callers must use."""

    is_blocking = True

    async def aget_messages(self, memory_id: Hashable) -> list[ChatMessage]:
        await asyncio.sleep(0)
        self.calls.append(("aget", memory_id))
        return self.inner.get_messages(memory_id)

    async def aupdate_messages(self, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
        await asyncio.sleep(0)
        self.calls.append(("aupdate", list(messages)))
        self.inner.update_messages(memory_id, messages)

    async def adelete_messages(self, memory_id: Hashable) -> None:
        self.calls.append(("adelete", memory_id))
        self.inner.delete_messages(memory_id)

    async def aapply_changes(
        self, memory_id: Hashable, *, appended: Sequence[ChatMessage], removed: Collection[str]
    ) -> None:
        await asyncio.sleep(0)
        self.calls.append(("aapply", (list(appended), list(removed))))
        self.inner.apply_changes(memory_id, appended=appended, removed=removed)


async def exercise(memory: MessageWindowChatMemory) -> None:
    assert await memory.amessages() == []
    await memory.aadd(SystemMessage("s"), user("1"), ai("2"))
    await memory.aadd(user("3"))
    assert await memory.amessages() == [SystemMessage("s"), ai("2"), user("3")]
    await memory.aset([user("x"), user("y")])
    assert await memory.amessages() == [user("x"), user("y")]
    await memory.aclear()
    assert await memory.amessages() == []


async def test_async_twins_use_a_native_async_store() -> None:
    store = NativeAsyncStore()
    await exercise(MessageWindowChatMemory(3, store=store))
    assert set(store.names()) == {"aget", "aapply", "aupdate", "adelete"}
    assert store.names()[:3] == ["aget", "aapply", "aapply"]


async def test_async_twins_call_a_non_blocking_store_directly() -> None:
    store = CountingStore()
    await exercise(MessageWindowChatMemory(3, store=store))
    assert store.names()[:3] == ["get", "apply", "apply"]


async def test_async_twins_run_a_blocking_store_in_a_worker_thread() -> None:
    store = PlainStore()
    await exercise(MessageWindowChatMemory(3, store=store))
    assert threading.get_ident() not in store.threads


async def test_concurrent_async_adds_to_one_memory_lose_nothing() -> None:
    memory = MessageWindowChatMemory(1000, store=NativeAsyncStore())

    async def work(n: int) -> None:
        for i in range(20):
            await memory.aadd(user(f"{n}-{i}"))

    await asyncio.gather(*(work(n) for n in range(5)))
    assert len(await memory.amessages()) == 100


def test_importing_aiservices_imports_no_tokenizer() -> None:
    import subprocess
    import sys

    code = "import sys, aiservices; assert 'tiktoken' not in sys.modules, 'tiktoken imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_a_cancelled_async_waiter_leaves_the_memory_usable() -> None:
    entered, gate = asyncio.Event(), asyncio.Event()

    class Slow(NativeAsyncStore):
        async def aapply_changes(
            self,
            memory_id: Hashable,
            *,
            appended: Sequence[ChatMessage],
            removed: Collection[str],
        ) -> None:
            entered.set()
            await gate.wait()
            await super().aapply_changes(memory_id, appended=appended, removed=removed)

    memory = MessageWindowChatMemory(5, store=Slow())
    first = asyncio.create_task(memory.aadd(user("1")))
    await entered.wait()  # the first add holds the memory while its write waits
    second = asyncio.create_task(memory.aadd(user("2")))
    for _ in range(5):
        await asyncio.sleep(0)
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    gate.set()
    await first
    await memory.aadd(user("3"))
    assert await memory.amessages() == [user("1"), user("3")]


def test_a_read_left_running_by_a_cancelled_caller_frees_the_memory_when_its_loop_is_gone() -> None:
    # A store without async methods is read in a worker thread; a caller cancelled
    # meanwhile leaves the memory to that thread, which frees it when it ends, whether or not
    # the caller's event loop still runs (a sync wrapper closes its loop at once).
    import time

    class SlowReads:
        def __init__(self) -> None:
            self.stored: dict[Hashable, list[ChatMessage]] = {}

        def get_messages(self, memory_id: Hashable) -> list[ChatMessage]:
            time.sleep(0.2)
            return list(self.stored.get(memory_id, []))

        def update_messages(self, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
            self.stored[memory_id] = list(messages)

        def delete_messages(self, memory_id: Hashable) -> None:
            self.stored.pop(memory_id, None)

    memory = MessageWindowChatMemory(5, store=SlowReads())
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(TimeoutError):
            loop.run_until_complete(asyncio.wait_for(memory.amessages(), 0.05))
    finally:
        loop.close()
    done = threading.Event()

    def later() -> None:
        memory.add(user("after"))
        done.set()

    threading.Thread(target=later, daemon=True).start()
    assert done.wait(5), "the memory stayed locked after its caller's loop closed"
    assert memory.messages() == [user("after")]

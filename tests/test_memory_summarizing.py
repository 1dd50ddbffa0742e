"""SummarizingChatMemory: the oldest whole turns fold into one summary a model writes."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Collection, Hashable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Protocol

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stores.conftest import BACKENDS, OpenedBackend, _opened

from aiservices import MemoryId, ai_service, system_message
from aiservices.memory import ChatMemory, SummarizingChatMemory
from aiservices.memory.summarizing import (
    DEFAULT_SUMMARY_PREFIX,
    DEFAULT_SUMMARY_PROMPT,
    SUMMARY_ID_PREFIX,
    is_summary,
)
from aiservices.messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionRequest,
    ToolExecutionResultMessage,
    UserMessage,
)
from aiservices.models import ChatRequest, ChatResponse
from aiservices.stores import InMemoryChatMemoryStore, SqliteChatMemoryStore
from aiservices.testing import ScriptedChatModel

PERSISTENT = [name for name, spec in BACKENDS.items() if spec.persistent and spec.history]


@pytest.fixture(params=PERSISTENT)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenedBackend]:
    with _opened(request.param, tmp_path) as opened:
        yield opened


class Summarizer:
    """A summariser whose summary names every question it has seen: ``covers q0,q1,...``.

    The previous summary is part of what it reads, so a fold that drops the previous
    summary shows as questions missing from the next one. ``fail`` holds the numbers of the
    calls (from 1) that raise instead.
    """

    def __init__(self, *, fail: Collection[int] = (), padding: int = 0) -> None:
        self.requests: list[ChatRequest] = []
        self.fail = set(fail)
        self.padding = padding

    def chat(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        if len(self.requests) in self.fail:
            raise RuntimeError("summariser down")
        text = request.messages[-1].text  # type: ignore[union-attr]
        seen = sorted({int(n) for n in re.findall(r"\bq(\d+)\b", text)})
        words = " ".join(["pad"] * self.padding)
        return ChatResponse(AiMessage(f"covers {','.join(f'q{n}' for n in seen)} {words}"))

    def covered(self, summary: ChatMessage) -> list[int]:
        return [int(n) for n in re.findall(r"\bq(\d+)\b", summary.text)]  # type: ignore[union-attr]


class AsyncSummarizer(Summarizer):
    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.awaited = 0

    def chat(self, request: ChatRequest) -> ChatResponse:
        raise AssertionError("an async add must await achat")

    async def achat(self, request: ChatRequest) -> ChatResponse:
        self.awaited += 1
        await asyncio.sleep(0)
        return Summarizer.chat(self, request)


class Words:
    """One token per word."""

    def estimate_token_count_in_text(self, text: str) -> int:
        return len(text.split())

    def estimate_token_count_in_message(self, message: ChatMessage) -> int:
        return len((getattr(message, "text", None) or "").split()) or 1


def turn(i: int) -> tuple[UserMessage, AiMessage]:
    return UserMessage(f"q{i}"), AiMessage(f"a{i}")


def texts(messages: Sequence[ChatMessage]) -> list[str | None]:
    return [getattr(m, "text", None) for m in messages]


def questions(messages: Sequence[ChatMessage]) -> list[int]:
    return [int(m.text[1:]) for m in messages if isinstance(m, UserMessage) and not is_summary(m)]


class Chat(Protocol):
    @system_message("You are terse.")
    def chat(self, user: Annotated[str, MemoryId], message: str) -> str: ...


def echo(request: ChatRequest) -> str:
    return "a" + request.messages[-1].text[1:]  # type: ignore[union-attr]


# -- through a service, on every persistent store -------------------------------------------


def test_thirty_turns_keep_the_summary_and_the_newest_turns_within_the_budget(
    backend: OpenedBackend,
) -> None:
    summarizer = Summarizer()
    store = backend.open(keep_history=True)
    model = ScriptedChatModel(default=echo)
    bot = ai_service(
        Chat,
        model=model,
        chat_memory_provider=SummarizingChatMemory.provider(
            max_messages=8, summarizer=summarizer, store=store
        ),
    )
    for i in range(30):
        assert bot.chat("ann", f"q{i}") == f"a{i}"
        window = bot.get_chat_memory("ann").messages()
        assert len(window) <= 8
        # The system message, the summary once there is one, then whole turns.
        assert window[0] == SystemMessage("You are terse.")
        rest = window[1:]
        if summarizer.requests:
            assert is_summary(rest[0])
            folded = summarizer.covered(rest[0])
            rest = rest[1:]
        else:
            folded = []
        assert isinstance(rest[0], UserMessage)
        # Nothing the model should know of is lost: the summary covers every question
        # before the ones still in the window.
        assert folded + questions(rest) == list(range(i + 1))
        # What the model was sent: that window before the turn, plus the turn's question.
        assert len(model.last_messages) <= 9

    assert len(summarizer.requests) > 3
    # A later fold reads the previous summary and folds it into the new one.
    second = summarizer.requests[1].messages[-1].text  # type: ignore[union-attr]
    assert second.startswith("Previous summary:\ncovers q0,")

    # The summary is persisted: a new store object and a new memory read it back.
    again = SummarizingChatMemory(
        max_messages=8, summarizer=Summarizer(), id="ann", store=backend.open()
    )
    assert [m.message_id for m in again.messages()] == [m.message_id for m in window]
    assert is_summary(again.messages()[1])
    assert again.messages()[1].text.startswith(DEFAULT_SUMMARY_PREFIX)  # type: ignore[union-attr]

    # The summarised turns stay in history, in order, marked evicted; so do old summaries.
    history = store.get_history("ann")
    recorded = [e for e in history if not is_summary(e.message)]
    assert texts([e.message for e in recorded]) == ["You are terse."] + [
        t for i in range(30) for t in (f"q{i}", f"a{i}")
    ]
    in_window = {m.message_id for m in window}
    for entry in history:
        assert entry.evicted == (entry.message.message_id not in in_window), entry
    summaries = [e for e in history if is_summary(e.message)]
    assert len(summaries) == len(summarizer.requests)
    assert [e.evicted for e in summaries] == [True] * (len(summaries) - 1) + [False]


def test_a_failing_summariser_never_loses_a_message(backend: OpenedBackend) -> None:
    summarizer = Summarizer(fail={1, 2})
    store = backend.open(keep_history=True)
    bot = ai_service(
        Chat,
        model=ScriptedChatModel(default=echo),
        chat_memory_provider=SummarizingChatMemory.provider(
            max_messages=6, summarizer=summarizer, store=store
        ),
    )
    for i in range(2):
        bot.chat("bo", f"q{i}")
    memory = bot.get_chat_memory("bo")
    assert isinstance(memory, SummarizingChatMemory)
    assert memory.last_summary_error is None
    # Turn 2 overflows and the summariser fails: the turn is stored all the same, and the
    # window keeps the overflow. Turn 3 tries again and fails again.
    for i in (2, 3):
        assert bot.chat("bo", f"q{i}") == f"a{i}"
        window = memory.messages()
        assert questions(window) == list(range(i + 1))
        assert isinstance(memory.last_summary_error, RuntimeError)
    assert len(summarizer.requests) == 2
    assert not any(e.evicted for e in store.get_history("bo"))
    # Turn 4: the summariser works again and folds everything it missed.
    bot.chat("bo", "q4")
    window = memory.messages()
    assert memory.last_summary_error is None
    assert summarizer.covered(window[1]) + questions(window[2:]) == list(range(5))
    assert len(window) <= 6
    # Read back from the store, not from the memory's own list.
    fresh = SummarizingChatMemory(
        max_messages=6, summarizer=summarizer, id="bo", store=backend.open()
    )
    assert texts(fresh.messages()) == texts(window)


# -- the rules, on the default store --------------------------------------------------------


def test_the_newest_turn_is_never_folded_and_the_fold_goes_down_to_the_target() -> None:
    summarizer = Summarizer()
    memory = SummarizingChatMemory(max_messages=10, summarizer=summarizer)
    memory.add(SystemMessage("sys"))
    for i in range(4):
        memory.add(*turn(i))
    assert len(memory.messages()) == 9
    memory.add(*turn(4))  # 11 > 10: fold down to half the budget (5)
    assert texts(memory.messages()) == [
        "sys",
        f"{DEFAULT_SUMMARY_PREFIX}covers q0,q1,q2,q3",
        "q4",
        "a4",
    ]
    # summarize_down_to=1.0 folds as little as fits.
    tight = SummarizingChatMemory(max_messages=10, summarizer=Summarizer(), summarize_down_to=1.0)
    for i in range(6):
        tight.add(*turn(i))
    assert questions(tight.messages()) == [2, 3, 4, 5]
    assert len(tight.messages()) == 9


def test_a_summary_that_does_not_fit_is_folded_again_with_more_turns() -> None:
    # Turns of 4 words in a budget of 40; every summary takes 27 words (its prefix, the
    # questions it covers and 20 words of padding). The first fold keeps 4 turns (16 words,
    # 0.4 of the budget) beside a summary it guesses small: 27 + 16 > 40, so the same add
    # folds again, leaving the newest turn beside the second summary.
    summarizer = Summarizer(padding=20)
    words = Words()
    memory = SummarizingChatMemory(
        max_tokens=40, token_count_estimator=words, summarizer=summarizer, summarize_down_to=0.4
    )
    calls_per_add = []
    for i in range(16):
        before = len(summarizer.requests)
        memory.add(UserMessage(f"q{i} x"), AiMessage(f"a{i} y"))
        calls_per_add.append(len(summarizer.requests) - before)
        window = memory.messages()
        assert sum(words.estimate_token_count_in_message(m) for m in window) <= 40
    assert calls_per_add[:10] == [0] * 10
    assert calls_per_add[10] == 2
    second = summarizer.requests[1].messages[-1].text  # type: ignore[union-attr]
    assert second.startswith("Previous summary:\ncovers q0,q1,q2,q3,q4,q5,q6 pad")
    summary = memory.messages()[0]
    assert is_summary(summary)
    assert summarizer.covered(summary) + questions_of_words(memory.messages()[1:]) == list(
        range(16)
    )


def questions_of_words(messages: Sequence[ChatMessage]) -> list[int]:
    return [int(m.text.split()[0][1:]) for m in messages if isinstance(m, UserMessage)]


def test_tool_turns_fold_whole_and_read_as_a_transcript() -> None:
    summarizer = Summarizer()
    memory = SummarizingChatMemory(max_messages=5, summarizer=summarizer)
    request = ToolExecutionRequest("c1", "weather", '{"city": "Paris"}')
    memory.add(
        UserMessage("q0 weather?", "ann"),
        AiMessage(None, [request]),
        ToolExecutionResultMessage("c1", "weather", "sunny"),
        AiMessage("a0 sunny"),
    )
    memory.add(*turn(1))
    window = memory.messages()
    assert is_summary(window[0])
    assert texts(window[1:]) == ["q1", "a1"]
    transcript = summarizer.requests[0].messages[-1].text  # type: ignore[union-attr]
    assert transcript == (
        "New messages:\n"
        "User (ann): q0 weather?\n"
        'Assistant called tool weather with {"city": "Paris"}\n'
        "Tool weather returned: sunny\n"
        "Assistant: a0 sunny"
    )
    assert summarizer.requests[0].messages[0] == SystemMessage(DEFAULT_SUMMARY_PROMPT)


def test_custom_prompt_and_prefix() -> None:
    summarizer = Summarizer()
    memory = SummarizingChatMemory(
        max_messages=3, summarizer=summarizer, prompt="Sum up.", summary_prefix="Earlier: "
    )
    memory.add(*turn(0))
    memory.add(*turn(1))
    assert summarizer.requests[0].messages[0] == SystemMessage("Sum up.")
    assert memory.messages()[0].text == "Earlier: covers q0"  # type: ignore[union-attr]
    memory.add(*turn(2))
    # The previous summary goes back without its prefix.
    assert (
        summarizer.requests[1]
        .messages[-1]
        .text.startswith(  # type: ignore[union-attr]
            "Previous summary:\ncovers q0\n"
        )
    )


def test_a_summariser_answering_no_text_counts_as_a_failure() -> None:
    empty = ScriptedChatModel(default="  ")
    memory = SummarizingChatMemory(max_messages=3, summarizer=empty)
    for i in range(3):
        memory.add(*turn(i))
    assert questions(memory.messages()) == [0, 1, 2]
    assert isinstance(memory.last_summary_error, ValueError)


def test_one_read_and_one_write_per_turn_with_the_fold_in_the_write() -> None:
    class Counting(InMemoryChatMemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []
            self.writes: list[tuple[list[str | None], list[str]]] = []

        def get_messages(self, memory_id: Hashable) -> list[ChatMessage]:
            self.calls.append("read")
            return super().get_messages(memory_id)

        def apply_changes(
            self,
            memory_id: Hashable,
            *,
            appended: Sequence[ChatMessage],
            removed: Collection[str],
        ) -> None:
            self.calls.append("write")
            self.writes.append((texts(appended), list(removed)))
            super().apply_changes(memory_id, appended=appended, removed=removed)

    store = Counting()
    bot = ai_service(
        Chat,
        model=ScriptedChatModel(default=echo),
        chat_memory_provider=SummarizingChatMemory.provider(
            max_messages=5, summarizer=Summarizer(), store=store
        ),
    )
    for i in range(6):
        bot.chat("c", f"q{i}")
    assert store.calls == ["read", "write"] * 6
    # Turn 2 overflowed (system + 3 turns = 7 > 5): its write appends the turn and the
    # summary, and removes the two folded turns.
    appended, removed = store.writes[2]
    assert appended == ["q2", "a2", f"{DEFAULT_SUMMARY_PREFIX}covers q0,q1"]
    assert len(removed) == 4


def test_the_summary_is_shown_after_the_system_message_whatever_the_store_order() -> None:
    memory = SummarizingChatMemory(max_messages=4, summarizer=Summarizer())
    memory.add(*turn(0))
    memory.add(*turn(1))
    memory.add(*turn(2))  # folds; the summary is appended after turn 2 in the store
    memory.add(SystemMessage("late system"))
    stored = texts(memory.store.get_messages("default"))
    assert stored.index("late system") > stored.index(f"{DEFAULT_SUMMARY_PREFIX}covers q0,q1")
    window = memory.messages()
    assert isinstance(window[0], SystemMessage)
    assert is_summary(window[1])


def test_copying_a_conversation_keeps_its_summary() -> None:
    memory = SummarizingChatMemory(max_messages=4, summarizer=Summarizer())
    for i in range(4):
        memory.add(*turn(i))
    copied = memory.messages()
    assert is_summary(copied[0])
    by_set = SummarizingChatMemory(max_messages=4, summarizer=Summarizer())
    by_set.set(copied)
    assert texts(by_set.messages()) == texts(copied)
    by_add = SummarizingChatMemory(max_messages=10, summarizer=Summarizer())
    by_add.add(*turn(9))
    by_add.add(*copied)
    # The copied summary is the summary: shown first, not as a turn.
    assert texts(by_add.messages())[0] == texts(copied)[0]
    assert is_summary(by_add.messages()[0])


def test_of_several_stored_summaries_the_last_leads_and_the_others_are_folded_in() -> None:
    # Two writers each folded a summary: the older one covers turns the newer does not, so
    # it stays, where it was stored, until the next fold takes it in; it is never dropped.
    store = InMemoryChatMemoryStore()
    summarizer = Summarizer()
    a = SummarizingChatMemory(max_messages=4, summarizer=summarizer, store=store)
    stale = UserMessage("covers q9", message_id=f"{SUMMARY_ID_PREFIX}1")
    newer = UserMessage("new", message_id=f"{SUMMARY_ID_PREFIX}2")
    store.update_messages("default", [stale, *turn(0), newer])
    assert texts(a.messages()) == ["new", "covers q9", "q0", "a0"]
    a.add(*turn(1))
    assert "covers q9" in summarizer.requests[0].messages[-1].text
    assert [m.message_id for m in store.get_messages("default")].count(f"{SUMMARY_ID_PREFIX}1") == 0
    assert "q9" in texts(a.messages())[0]


def test_adding_a_conversation_with_two_summaries_keeps_both() -> None:
    store = InMemoryChatMemoryStore()
    older = UserMessage("covers q9", message_id=f"{SUMMARY_ID_PREFIX}1")
    newer = UserMessage("covers q8", message_id=f"{SUMMARY_ID_PREFIX}2")
    store.update_messages("src", [older, newer, *turn(0)])
    shown = SummarizingChatMemory(
        max_messages=10, summarizer=Summarizer(), store=store, id="src"
    ).messages()
    copy = SummarizingChatMemory(max_messages=10, summarizer=Summarizer(), store=store, id="dst")
    copy.add(*shown)
    assert sorted(texts(copy.messages())) == sorted(texts(shown))
    assert is_summary(copy.messages()[0])


def test_two_processes_folding_at_once_lose_no_turn(tmp_path: Path) -> None:
    # Each memory (a process of its own, on the same file) reads the same window, then
    # folds a different range of it into a summary of its own.
    path = tmp_path / "chat.db"

    def memory() -> SummarizingChatMemory:
        return SummarizingChatMemory(
            summarizer=Summarizer(),
            max_messages=8,
            summarize_down_to=1.0,
            store=SqliteChatMemoryStore(path),
            id="c",
        )

    seed = memory()
    for i in range(3):
        seed.add(*turn(i))
    one, two = memory(), memory()
    one.messages()
    two.messages()
    one.add(UserMessage("q3"), AiMessage("x"), AiMessage("x"), AiMessage("a3"))
    two.add(UserMessage("q4"), AiMessage("x"), AiMessage("a4"))
    third = memory()
    third.messages()
    third.add(*turn(5))
    shown = " ".join(m.text or "" for m in third.messages())
    assert all(f"q{i}" in shown for i in range(6)), shown


def test_clear_removes_the_summary_too() -> None:
    memory = SummarizingChatMemory(max_messages=3, summarizer=Summarizer())
    for i in range(3):
        memory.add(*turn(i))
    memory.clear()
    assert memory.messages() == []
    memory.add(*turn(7))
    assert texts(memory.messages()) == ["q7", "a7"]


async def test_async_adds_await_the_summariser() -> None:
    summarizer = AsyncSummarizer()
    memory = SummarizingChatMemory(max_messages=4, summarizer=summarizer)
    for i in range(5):
        await memory.aadd(*turn(i))
    window = await memory.amessages()
    assert summarizer.awaited >= 1
    assert summarizer.covered(window[0]) + questions(window[1:]) == list(range(5))


async def test_async_adds_on_a_blocking_store(tmp_path: Path) -> None:
    from aiservices.stores import SqliteChatMemoryStore

    with SqliteChatMemoryStore(tmp_path / "s.db", keep_history=True) as store:
        summarizer = AsyncSummarizer()
        memory = SummarizingChatMemory(max_messages=4, summarizer=summarizer, store=store)
        for i in range(5):
            await memory.aadd(*turn(i))
        window = await memory.amessages()
        assert summarizer.covered(window[0]) + questions(window[1:]) == list(range(5))
        assert len(store.get_history("default")) == 10 + summarizer.awaited


async def test_a_cancelled_summary_leaves_the_memory_as_it_was() -> None:
    class Cancelled(Summarizer):
        async def achat(self, request: ChatRequest) -> ChatResponse:
            raise asyncio.CancelledError

    memory = SummarizingChatMemory(max_messages=4, summarizer=Cancelled())
    await memory.aadd(*turn(0))
    await memory.aadd(*turn(1))
    with pytest.raises(asyncio.CancelledError):
        await memory.aadd(*turn(2))
    assert texts(await memory.amessages()) == ["q0", "a0", "q1", "a1"]


async def test_async_service_with_summarising_memory() -> None:
    class AsyncChat(Protocol):
        async def chat(self, user: Annotated[str, MemoryId], message: str) -> str: ...

    summarizer = AsyncSummarizer()
    bot = ai_service(
        AsyncChat,
        model=ScriptedChatModel(default=echo),
        chat_memory_provider=SummarizingChatMemory.provider(max_messages=4, summarizer=summarizer),
    )
    for i in range(6):
        assert await bot.chat("x", f"q{i}") == f"a{i}"
    memory: ChatMemory = bot.get_chat_memory("x")  # type: ignore[attr-defined]
    window = memory.messages()
    assert summarizer.awaited >= 1
    assert summarizer.covered(window[0]) + questions(window[1:]) == list(range(6))


# -- options -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({}, TypeError, "one budget"),
        ({"max_messages": 4, "max_tokens": 40}, TypeError, "one budget"),
        ({"max_tokens": 40}, TypeError, "token_count_estimator"),
        ({"max_messages": 4, "token_count_estimator": Words()}, TypeError, "with max_tokens"),
        ({"max_messages": 4, "calibrate": True}, TypeError, "needs max_tokens"),
        ({"max_messages": 0}, ValueError, "at least 1"),
        ({"max_messages": 4, "summarize_down_to": 0}, ValueError, "summarize_down_to"),
        ({"max_messages": 4, "summarize_down_to": 1.5}, ValueError, "summarize_down_to"),
        ({"max_messages": 4, "summarize_down_to": "half"}, TypeError, "summarize_down_to"),
        ({"max_messages": 4, "prompt": " "}, ValueError, "prompt"),
        ({"max_messages": 4, "summary_prefix": None}, TypeError, "summary_prefix"),
        ({"max_messages": 4, "summarizer": "openai:gpt-4o"}, TypeError, "ChatModel"),
        ({"max_messages": 4, "summarizer": ScriptedChatModel}, TypeError, "the class"),
    ],
)
def test_bad_options_are_refused_by_the_constructor_and_the_provider(
    options: dict[str, Any], error: type[Exception], words: str
) -> None:
    options = {"summarizer": Summarizer(), **options}
    with pytest.raises(error, match=words):
        SummarizingChatMemory(**options)
    with pytest.raises(error, match=words):
        SummarizingChatMemory.provider(**options)


def test_provider_gives_each_id_its_memory_on_one_store() -> None:
    summarizer = Summarizer()
    provider = SummarizingChatMemory.provider(max_messages=3, summarizer=summarizer)
    a, b = provider("a"), provider("b")
    assert a.store is b.store is provider.store
    assert a.id == "a"
    assert a.summarizer is summarizer
    assert isinstance(a, ChatMemory)
    assert repr(provider).startswith("SummarizingChatMemory.provider(max_messages=3")
    assert repr(a).startswith("SummarizingChatMemory(max_messages=3, id='a'")


# -- the invariant, over random conversations ---------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=25),
    fail=st.sets(st.integers(1, 12), max_size=4),
    budget=st.integers(4, 12),
    down_to=st.sampled_from([0.3, 0.5, 1.0]),
    system=st.booleans(),
)
def test_no_message_is_lost_and_the_window_fits_when_the_summariser_works(
    sizes: list[int], fail: set[int], budget: int, down_to: float, system: bool
) -> None:
    summarizer = Summarizer(fail=fail)
    memory = SummarizingChatMemory(
        max_messages=budget, summarizer=summarizer, summarize_down_to=down_to
    )
    if system:
        memory.add(SystemMessage("sys"))
    for i, size in enumerate(sizes):
        # A turn: the question, then size - 1 answers (tool rounds flattened to text).
        calls = len(summarizer.requests)
        memory.add(UserMessage(f"q{i}"), *(AiMessage(f"a{i}.{k}") for k in range(size - 1)))
        window = memory.messages()
        rest = window[1:] if system else window
        assert not system or window[0] == SystemMessage("sys")
        folded: list[int] = []
        if rest and is_summary(rest[0]):
            folded = summarizer.covered(rest[0])
            rest = rest[1:]
        # Whole turns only, and every question either summarised or still there.
        assert isinstance(rest[0], UserMessage)
        assert folded + questions(rest) == list(range(i + 1))
        tried = len(summarizer.requests) > calls
        failed = tried and len(summarizer.requests) in fail
        newest_alone = len(rest) == size
        if not failed and not newest_alone:
            assert len(window) <= budget


def test_a_copied_summary_folded_at_once_is_never_stored_beside_the_new_one() -> None:
    source = SummarizingChatMemory(max_messages=4, summarizer=Summarizer())
    for i in range(4):
        source.add(*turn(i))
    copied = source.messages()
    target = SummarizingChatMemory(max_messages=4, summarizer=Summarizer())
    target.add(*turn(8))
    target.add(*copied)  # over budget at once: turn 8 and the copied summary fold together
    stored = target.store.get_messages("default")
    assert sum(is_summary(m) for m in stored) == 1
    assert texts(target.messages()) == texts(stored[-1:]) + texts(copied[1:])


def test_reads_of_an_unchanged_store_reuse_the_window_with_its_summary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The summary is stored where it was appended and shown first: the window still holds
    # what the store holds, and is not built again at each read.
    from aiservices.memory import _window_memory

    memory = SummarizingChatMemory(max_messages=6, summarizer=Summarizer())
    for i in range(8):
        memory.messages()
        memory.add(*turn(i))
    assert is_summary(memory.messages()[0])
    loads = 0
    load = _window_memory.WindowChatMemory._load

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal loads
        loads += 1
        return load(self, *args, **kwargs)

    monkeypatch.setattr(_window_memory.WindowChatMemory, "_load", counted)
    for _ in range(5):
        memory.messages()
    assert loads == 0

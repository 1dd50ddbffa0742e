"""Both wire formats against a server we did not write: fakellm, a mock of the OpenAI and
Anthropic APIs, run from a virtualenv of its own (``.ci/run`` makes ``.venv-servers``), so
its dependencies never mix with ours. Skipped, saying how to install it, when absent."""

from __future__ import annotations

import asyncio
import os
import shutil
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Annotated, Any, Protocol

import pytest
from _servers import serving
from pydantic import BaseModel

from aiservices import ChatMemoryAccess, MemoryId, MessageWindowChatMemory, ai_service, tool
from aiservices.models.anthropic import AnthropicChatModel
from aiservices.models.openai import OpenAIChatModel

ROOT = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("fakellm.yaml")


def _fakellm() -> str | None:
    found = os.environ.get("AISERVICES_FAKELLM") or str(ROOT / ".venv-servers" / "bin" / "fakellm")
    return found if Path(found).exists() else shutil.which("fakellm")


FAKELLM = _fakellm()
pytestmark = pytest.mark.skipif(
    FAKELLM is None,
    reason="fakellm is not installed: python3 -m venv .venv-servers && "
    ".venv-servers/bin/pip install fakellm (what .ci/run does)",
)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    assert FAKELLM is not None
    command = [FAKELLM, "serve", "--host", "127.0.0.1", "--config", str(CONFIG), "--port"]
    with serving(lambda port: [*command, str(port)]) as port:
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(params=["openai", "anthropic"])
def model(request: pytest.FixtureRequest, server: str) -> Iterator[Any]:
    # fakellm remembers tool results across requests: each test starts it afresh.
    urllib.request.urlopen(urllib.request.Request(f"{server}/_fakellm/reset", method="POST"))
    if request.param == "openai":
        made: Any = OpenAIChatModel("gpt-4o-mini", base_url=f"{server}/v1", api_key="k")
    else:
        made = AnthropicChatModel("claude-test", base_url=server, api_key="k")
    yield made
    made.close()


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


class City(BaseModel):
    city: str
    country: str


class Bot(ChatMemoryAccess, Protocol):
    def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    async def achat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    def stream(self, user: Annotated[str, MemoryId], text: str) -> Iterator[str]: ...

    def astream(self, user: Annotated[str, MemoryId], text: str) -> AsyncIterator[str]: ...

    def where(self, text: str) -> City: ...


def _bot(model: Any) -> Bot:
    return ai_service(
        Bot,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
        tools=[get_weather],
    )


def test_chat_with_memory(model: Any) -> None:
    bot = _bot(model)
    assert bot.chat("ada", "hello") == "Hi there! Nice to meet you."
    bot.chat("ada", "hello again")
    assert len(bot.get_chat_memory("ada").messages()) == 4


def test_a_tool_round_trip(model: Any) -> None:
    bot = _bot(model)
    assert bot.chat("ada", "What is the weather in Oslo?") == "It is sunny in Oslo."
    kinds = [type(m).__name__ for m in bot.get_chat_memory("ada").messages()]
    assert kinds == ["UserMessage", "AiMessage", "ToolExecutionResultMessage", "AiMessage"]


def test_streaming_sync_and_async(model: Any) -> None:
    bot = _bot(model)
    assert "".join(bot.stream("ada", "hello")) == "Hi there! Nice to meet you."

    async def main() -> str:
        try:
            return "".join([piece async for piece in bot.astream("bob", "hello")])
        finally:
            await model.aclose()

    assert asyncio.run(main()) == "Hi there! Nice to meet you."
    assert len(bot.get_chat_memory("bob").messages()) == 2


def test_async_chat_and_a_typed_answer(model: Any) -> None:
    bot = _bot(model)
    assert bot.where("Paris: which city and country?") == City(city="Paris", country="France")

    async def main() -> str:
        try:
            return await bot.achat("ada", "hello")
        finally:
            await model.aclose()

    assert asyncio.run(main()) == "Hi there! Nice to meet you."

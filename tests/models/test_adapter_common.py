"""What both adapters share, through the same code: client lifetimes and options, reprs."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
from _anthropic_server import AnthropicServer, text
from _openai_server import OpenAIServer

from aiservices.messages import UserMessage
from aiservices.models import ChatRequest

REQUEST = ChatRequest([UserMessage("Hi")])
PROVIDERS = ["openai", "anthropic"]


def _model_answering(request: pytest.FixtureRequest, provider: str, answers: int) -> Any:
    """A model on its loopback server, with ``answers`` replies queued."""
    if provider == "openai":
        openai_server: OpenAIServer = request.getfixturevalue("openai_server")
        for _ in range(answers):
            openai_server.reply_text("Hello")
        return request.getfixturevalue("openai_model")()
    anthropic_server: AnthropicServer = request.getfixturevalue("anthropic_server")
    for _ in range(answers):
        anthropic_server.reply_message([text("Hello")])
    return request.getfixturevalue("anthropic_model")()


# -- async clients across event loops ---------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_each_asyncio_run_closes_the_async_client_made_in_it(
    request: pytest.FixtureRequest, provider: str, caplog: pytest.LogCaptureFixture
) -> None:
    model = _model_answering(request, provider, answers=3)
    made: list[Any] = []

    async def once() -> None:
        await model.achat(REQUEST)
        made.append(model._async_client())

    for _ in range(3):  # as a script or a test suite calling asyncio.run() per task does
        asyncio.run(once())
        assert made[-1].is_closed()
    gc.collect()  # an error of a task nobody awaited is logged when the task is collected

    assert len({id(client) for client in made}) == 3
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


@pytest.mark.parametrize("provider", PROVIDERS)
def test_close_closes_the_async_client_of_a_loop_still_open(
    request: pytest.FixtureRequest, provider: str
) -> None:
    model = _model_answering(request, provider, answers=1)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(model.achat(REQUEST))
        client = loop.run_until_complete(_current_client(model))
        with model:
            pass
        assert client.is_closed()
    finally:
        loop.close()


async def _current_client(model: Any) -> Any:
    return model._async_client()


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_aclose_closes_this_loops_async_client(
    request: pytest.FixtureRequest, provider: str
) -> None:
    model = _model_answering(request, provider, answers=1)
    await model.achat(REQUEST)
    client = model._async_client()
    async with model:
        pass
    assert client.is_closed()
    assert model._async_client() is not client  # the next call makes another

"""What both adapters share, through the same code: client lifetimes and options, reprs."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest
from _anthropic_server import AnthropicServer, text
from _loopback import ANTHROPIC_KEY, OPENAI_KEY
from _openai_server import OpenAIServer

from aiservices.messages import UserMessage
from aiservices.models import ChatRequest, TokenUsage
from aiservices.models.anthropic import AnthropicChatModel
from aiservices.models.openai import OpenAIChatModel

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


@pytest.mark.parametrize("provider", PROVIDERS)
def test_http_clients_handed_in_stay_open_and_an_async_one_stays_in_its_loop(
    request: pytest.FixtureRequest, provider: str
) -> None:
    import httpx2

    http, async_http = httpx2.Client(), httpx2.AsyncClient()
    first = _model_answering(request, provider, answers=2)  # (for the server's fixtures)
    make = request.getfixturevalue(f"{provider}_model")
    model = make(http_client=http, async_http_client=async_http)
    first.close()
    with asyncio.Runner() as runner:
        assert runner.run(model.achat(REQUEST)).ai_message.text == "Hello"
        loop = runner.get_loop()
        loop.run_until_complete(loop.shutdown_asyncgens())  # as the end of asyncio.run() does
        assert not async_http.is_closed  # the caller's, not the adapter's
        with pytest.raises(RuntimeError, match="first used in another event loop"):
            asyncio.run(model.achat(REQUEST))  # its connections belong to the first loop
        runner.run(model.aclose())
        assert not async_http.is_closed
        runner.run(async_http.aclose())
    assert model.chat(REQUEST).ai_message.text == "Hello"
    model.close()
    assert not http.is_closed
    http.close()


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


# -- a handed-in client beside connection options ---------------------------------------------


_OPTIONS: dict[str, Any] = {
    "api_key": "sk-other",
    "base_url": "http://127.0.0.1:1/v1",
    "timeout": 5.0,
    "max_retries": 0,
    "default_headers": {"X-Tenant": "t1"},
}


@pytest.mark.parametrize("option", sorted(_OPTIONS))
@pytest.mark.parametrize("given", ["client", "async_client"])
def test_connection_options_beside_one_handed_in_client_are_an_error(
    option: str, given: str
) -> None:
    # They could reach only the client made for the other path: sync and async calls would
    # go to different servers, or with different keys, timeouts or headers.
    sdk_client = (
        openai.OpenAI(api_key=OPENAI_KEY)
        if given == "client"
        else openai.AsyncOpenAI(api_key=OPENAI_KEY)
    )
    with pytest.raises(
        ValueError, match=rf"^{option} cannot be given with {given}=: .* set these on the client"
    ):
        OpenAIChatModel("m", **{given: sdk_client, option: _OPTIONS[option]})


def test_the_anthropic_adapter_refuses_them_too() -> None:
    client = anthropic.Anthropic(api_key=ANTHROPIC_KEY, base_url="http://127.0.0.1:1")
    with pytest.raises(ValueError, match=r"^base_url, timeout cannot be given with client="):
        AnthropicChatModel("c", client=client, base_url="http://127.0.0.1:2", timeout=1.0)
    client.close()


def test_the_other_paths_http_client_beside_one_handed_in_client_is_used() -> None:
    # async_http_client= is for the async client made beside client=: it takes effect.
    import httpx2

    http = httpx2.Client()
    with openai.OpenAI(api_key=OPENAI_KEY) as client:
        model = OpenAIChatModel("m", client=client, async_http_client=httpx2.AsyncClient())
        with pytest.raises(ValueError, match=r"^http_client cannot be given with client="):
            OpenAIChatModel("m", client=client, http_client=http)
    http.close()
    model.close()


# -- the base URL in a repr -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base_url", "shown"),
    [
        ("https://gw.example.com/v1?api-key=SECRET1", "https://gw.example.com/v1?api-key=***"),
        (
            "https://gw.example.com/v1?api-version=2024&token=SECRET1",
            "https://gw.example.com/v1?api-version=***&token=***",
        ),
        ("https://gw.example.com/v1?SECRET1", "https://gw.example.com/v1?***"),
        ("https://gw.example.com/v1#SECRET1", "https://gw.example.com/v1#***"),
        ("https://user:SECRET1@gw.example.com/v1?k=SECRET1", "https://***@gw.example.com/v1?k=***"),
    ],
)
@pytest.mark.parametrize("make", [OpenAIChatModel, AnthropicChatModel])
def test_a_repr_masks_every_query_value_and_the_fragment_of_the_base_url(
    make: Callable[..., Any], base_url: str, shown: str
) -> None:
    model = make("m", base_url=base_url, api_key="k")
    assert "SECRET1" not in repr(model)
    assert repr(model) == f"{type(model).__name__}(model='m', base_url='{shown}')"
    model.close()


@pytest.mark.parametrize("make", [OpenAIChatModel, AnthropicChatModel])
def test_a_model_whose_making_failed_still_has_a_repr(
    make: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A traceback that shows its frames' locals shows the half-made ``self``."""
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError, match="API key") as failed:
        make("m")
    frame = failed.traceback[-1].frame
    half_made = frame.f_locals["self"]
    assert repr(half_made).startswith(f"{type(half_made).__name__}(model=")


# -- token usage ------------------------------------------------------------------------------


def test_sum_adds_token_usages() -> None:
    usages = [TokenUsage(10, 2), TokenUsage(5, None), TokenUsage(None, 1)]
    assert sum(usages) == TokenUsage(15, 3)
    assert sum(usages, TokenUsage()) == TokenUsage(15, 3)
    assert sum([TokenUsage(1, 1)]) == TokenUsage(1, 1)
    with pytest.raises(TypeError):
        TokenUsage(1, 1) + 1  # type: ignore[operator]

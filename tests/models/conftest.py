"""Loopback provider servers and model factories that close what they make."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _anthropic_server import MODEL as ANTHROPIC_MODEL
from _anthropic_server import AnthropicServer
from _loopback import ANTHROPIC_KEY, OPENAI_KEY
from _openai_server import MODEL as OPENAI_MODEL
from _openai_server import OpenAIServer

_PROVIDER_ENV = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_ORG_ID",
    "OPENAI_PROJECT_ID",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_CUSTOM_HEADERS",
)


@pytest.fixture(autouse=True)
def _no_provider_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's real keys or endpoints must never reach these tests' servers (or leave them).
    for name in _PROVIDER_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def openai_server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as server:
        yield server
    assert not server.violations, server.violations


@pytest.fixture
def anthropic_server() -> Iterator[AnthropicServer]:
    with AnthropicServer() as server:
        yield server


@pytest.fixture
def openai_model(openai_server: OpenAIServer) -> Iterator[Callable[..., Any]]:
    from aiservices.models.openai import OpenAIChatModel

    made: list[OpenAIChatModel] = []

    def make(**options: Any) -> OpenAIChatModel:
        options.setdefault("api_key", OPENAI_KEY)
        options.setdefault("base_url", openai_server.base_url)
        options.setdefault("max_retries", 0)
        model = OpenAIChatModel(options.pop("model", OPENAI_MODEL), **options)
        made.append(model)
        return model

    yield make
    for model in made:
        model.close()


@pytest.fixture
def anthropic_model(anthropic_server: AnthropicServer) -> Iterator[Callable[..., Any]]:
    from aiservices.models.anthropic import AnthropicChatModel

    made: list[AnthropicChatModel] = []

    def make(**options: Any) -> AnthropicChatModel:
        options.setdefault("api_key", ANTHROPIC_KEY)
        options.setdefault("base_url", anthropic_server.origin)
        options.setdefault("max_retries", 0)
        model = AnthropicChatModel(options.pop("model", ANTHROPIC_MODEL), **options)
        made.append(model)
        return model

    yield make
    for model in made:
        model.close()

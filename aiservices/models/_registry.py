"""Model strings (``"openai:gpt-4o-mini"``, ``"anthropic:claude-sonnet-4-6"``) to models.

A provider's adapter module, and with it its SDK, is imported only when a string names it.
"""

from __future__ import annotations

import importlib
from typing import Any, Final, NamedTuple

from . import ChatModel

__all__ = ["PROVIDERS", "parse_model_spec", "resolve_model"]


class _Provider(NamedTuple):
    module: str
    factory: str
    sdk: str


PROVIDERS: Final = {
    "openai": _Provider("aiservices.models.openai", "OpenAIChatModel", "openai"),
    "anthropic": _Provider("aiservices.models.anthropic", "AnthropicChatModel", "anthropic"),
}
"""Provider prefixes that model strings may use."""


def parse_model_spec(spec: str) -> tuple[str, str]:
    """``(provider, model name)`` of a model string, checked without importing anything.

    The model name is everything after the first colon, so names with colons of their own
    (``"openai:llama3.1:8b"``, fine-tuned ids) work.
    """
    if not isinstance(spec, str):
        raise TypeError(
            f"a model must be a ChatModel or a string like 'openai:gpt-4o-mini', "
            f"not {type(spec).__name__}"
        )
    prefix, colon, name = spec.partition(":")
    provider = prefix.strip().lower()
    if provider not in PROVIDERS:
        known = ", ".join(f"'{p}:MODEL'" for p in PROVIDERS)
        if not colon:
            raise ValueError(f"model string {spec!r} names no provider; use one of {known}")
        raise ValueError(
            f"unknown model provider {prefix!r} in {spec!r}; use one of {known}, "
            "or pass a ChatModel object"
        )
    name = name.strip()
    if not name:
        raise ValueError(f"model string {spec!r} names no model after the colon")
    return provider, name


def resolve_model(spec: str, **options: Any) -> ChatModel:
    """The model a ``"provider:MODEL"`` string names; ``options`` go to its adapter.

    A missing SDK is a ``ModuleNotFoundError`` that names the extra to install.
    """
    provider_name, name = parse_model_spec(spec)
    provider = PROVIDERS[provider_name]
    try:
        module = importlib.import_module(provider.module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] != provider.sdk:
            raise
        raise ModuleNotFoundError(
            f"model {spec!r} needs the {provider.sdk!r} package, which is not installed: "
            f'pip install "aiservices[{provider_name}]"',
            name=provider.sdk,
        ) from exc
    factory = getattr(module, provider.factory)
    model: ChatModel = factory(name, **options)
    return model

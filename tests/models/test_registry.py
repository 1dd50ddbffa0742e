"""Model strings: resolution, errors, and the SDKs staying unimported until used."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _loopback import ANTHROPIC_KEY, OPENAI_KEY

from aiservices.models._registry import parse_model_spec, resolve_model


def test_openai_string_makes_an_openai_model() -> None:
    from aiservices.models.openai import OpenAIChatModel

    model = resolve_model("openai:gpt-4o-mini", api_key=OPENAI_KEY)

    assert isinstance(model, OpenAIChatModel)
    assert model.model_name == "gpt-4o-mini"


def test_anthropic_string_makes_an_anthropic_model() -> None:
    from aiservices.models.anthropic import AnthropicChatModel

    model = resolve_model("anthropic:claude-sonnet-4-6", api_key=ANTHROPIC_KEY)

    assert isinstance(model, AnthropicChatModel)
    assert model.model_name == "claude-sonnet-4-6"


def test_the_model_name_keeps_its_own_colons() -> None:
    model = resolve_model(" OpenAI : llama3.1:8b", base_url="http://127.0.0.1:1/v1")

    assert model.model_name == "llama3.1:8b"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("mistral:large", r"unknown model provider 'mistral'.*'openai:MODEL', 'anthropic:MODEL'"),
        ("gpt-4o-mini", r"names no provider; use one of 'openai:MODEL'"),
        ("openai:", "names no model"),
        ("anthropic:  ", "names no model"),
    ],
)
def test_bad_strings_are_clear_errors(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_model(spec)


def test_strings_are_checked_without_importing_the_adapter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)

    assert parse_model_spec("openai:gpt-4o-mini") == ("openai", "gpt-4o-mini")
    with pytest.raises(ValueError, match="unknown model provider"):
        parse_model_spec("cohere:command")


def test_a_non_string_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="ChatModel or a string"):
        resolve_model(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_missing_sdk_names_the_extra_to_install(
    provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # None in sys.modules makes `import openai` fail as if it were not installed.
    monkeypatch.setitem(sys.modules, provider, None)
    monkeypatch.delitem(sys.modules, f"aiservices.models.{provider}", raising=False)

    with pytest.raises(ImportError, match=rf'pip install "aiservices\[{provider}\]"') as caught:
        resolve_model(f"{provider}:some-model")

    assert isinstance(caught.value, ModuleNotFoundError)
    assert caught.value.name == provider


def test_importing_the_package_and_registry_imports_no_provider_sdk() -> None:
    code = (
        "import sys, aiservices, aiservices.models, aiservices.models._registry\n"
        "loaded = [m for m in ('openai', 'anthropic', 'httpx', 'httpx2') if m in sys.modules]\n"
        "print(','.join(loaded))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )

    assert out.stdout.strip() == ""

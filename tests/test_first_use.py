"""What a newcomer meets first: the star import, and the errors of a first mistake."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, Protocol

import pytest
from pydantic import BaseModel

from aiservices import InterfaceError, OutputParseError, ai_service, tool
from aiservices.testing import ScriptedChatModel


def _fresh_interpreter(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_star_import_works_without_the_store_drivers() -> None:
    # None in sys.modules makes an import fail as it does where the package is not installed.
    done = _fresh_interpreter(
        "import sys\n"
        "for name in ('psycopg', 'psycopg_pool', 'redis'):\n"
        "    sys.modules[name] = None\n"
        "from aiservices import *\n"
        "print(ai_service.__name__, SqliteChatMemoryStore.__name__)\n"
        "try:\n"
        "    PostgresChatMemoryStore('host=127.0.0.1')\n"
        "except ModuleNotFoundError as error:\n"
        "    print(error.name, error)\n"
        "try:\n"
        "    RedisChatMemoryStore('redis://127.0.0.1')\n"
        "except ModuleNotFoundError as error:\n"
        "    print(error.name, error)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "ai_service SqliteChatMemoryStore",
        "psycopg PostgresChatMemoryStore needs the 'psycopg' package, which is not installed: "
        'pip install "aiservices[postgres]"',
        "redis RedisChatMemoryStore needs the 'redis' package, which is not installed: "
        'pip install "aiservices[redis]"',
    ]


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_an_adapter_imported_without_its_sdk_names_the_extra_to_install(sdk: str) -> None:
    done = _fresh_interpreter(
        "import sys\n"
        f"sys.modules[{sdk!r}] = None\n"
        "try:\n"
        f"    import aiservices.models.{sdk}\n"
        "except ModuleNotFoundError as error:\n"
        "    print(error.name, error)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f'{sdk} aiservices.models.{sdk} needs the {sdk} SDK: pip install "aiservices[{sdk}]"'
    ]


def test_star_import_gives_the_real_stores_when_their_drivers_are_there() -> None:
    import aiservices.stores.postgres
    import aiservices.stores.redis

    namespace: dict[str, Any] = {}
    exec("from aiservices import *", namespace)
    assert (
        namespace["PostgresChatMemoryStore"] is aiservices.stores.postgres.PostgresChatMemoryStore
    )
    assert namespace["RedisChatMemoryStore"] is aiservices.stores.redis.RedisChatMemoryStore


class Verdict(BaseModel):
    score: float


class Rater(Protocol):
    def rate(self, text: str) -> Verdict: ...


def test_output_parse_error_says_what_went_wrong_not_what_the_model_was_told() -> None:
    model = ScriptedChatModel("not JSON", '{"score": "high"}')
    rater = ai_service(Rater, model=model)
    with pytest.raises(OutputParseError) as caught:
        rater.rate("great")
    message = str(caught.value)
    assert message.startswith("Rater.rate: the answer could not be parsed as Verdict after 2")
    assert "score: Input should be a valid number" in message
    assert OutputParseError.retry_instruction not in message
    # The model itself was told, with the error, what to do.
    assert OutputParseError.retry_instruction in (model.last_user_text or "")


def test_a_tool_parameter_without_a_type_is_an_error_at_build_time() -> None:
    @tool
    def lookup(order_id, verbose: bool = False) -> str:  # type: ignore[no-untyped-def]
        """Look an order up."""
        return str(order_id)

    class Shop(Protocol):
        def ask(self, question: str) -> str: ...

    with pytest.raises(InterfaceError) as caught:
        ai_service(Shop, model=ScriptedChatModel(), tools=[lookup])
    assert str(caught.value).endswith(
        ".lookup(order_id): the parameter has no type; annotate it (`order_id: str`, say) so "
        "that the model is told what to send (`typing.Any` accepts anything)"
    )

"""Context: a per-call value for tools and providers, never sent to the model."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Annotated, Protocol

import pytest

from aiservices import (
    AiMessage,
    Context,
    InterfaceError,
    MemoryId,
    MessageWindowChatMemory,
    ToolExecutionRequest,
    UserMessage,
    ai_service,
    system_message,
    tool,
)
from aiservices.testing import ScriptedChatModel


@dataclass(frozen=True)
class User:
    name: str
    tenant: str


@tool
def whoami(user: Annotated[User | None, Context], shout: bool = False) -> str:
    """Who is signed in."""
    name = "nobody" if user is None else user.name
    return name.upper() if shout else name


@tool
def conversation(memory_id: Annotated[str, MemoryId]) -> str:
    """The conversation's id."""
    return f"conversation {memory_id}"


def _calls(*names: str) -> AiMessage:
    return AiMessage(
        tool_execution_requests=[
            ToolExecutionRequest(f"c{i}", n, "{}") for i, n in enumerate(names)
        ]
    )


class Bot(Protocol):
    def chat(
        self, session: Annotated[str, MemoryId], text: str, user: Annotated[User, Context]
    ) -> str: ...

    def anonymous(self, session: Annotated[str, MemoryId], text: str) -> str: ...

    async def achat(
        self, session: Annotated[str, MemoryId], text: str, user: Annotated[User, Context]
    ) -> str: ...


def _bot(model: ScriptedChatModel, **options: object) -> Bot:
    return ai_service(
        Bot,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
        **options,  # type: ignore[arg-type]
    )


def test_a_tool_reads_the_signed_in_user_and_the_memory_id_from_the_call() -> None:
    model = ScriptedChatModel(_calls("whoami", "conversation"), "done")
    bot = _bot(model, tools=[whoami, conversation])
    assert bot.chat("s1", "who am I?", user=User("Ada", "acme")) == "done"
    results = [m.text for m in model.requests[1].messages[-2:]]
    assert results == ["Ada", "conversation s1"]
    # Neither the context nor the memory id is in a tool's schema, the prompt or memory.
    specs = {spec.name: spec.parameters for spec in model.requests[0].tools}
    assert set(specs["whoami"]["properties"]) == {"shout"}
    assert specs["conversation"]["properties"] == {}
    assert model.requests[0].messages == [UserMessage("who am I?")]
    assert "Ada" not in repr(bot.get_chat_memory("s1").messages()[0])  # type: ignore[attr-defined]


def test_a_method_without_a_context_gives_tools_none() -> None:
    model = ScriptedChatModel(_calls("whoami"), "done")
    bot = _bot(model, tools=[whoami])
    bot.anonymous("s1", "who am I?")
    assert model.requests[1].messages[-1].text == "nobody"


def test_async_calls_give_tools_their_context_too() -> None:
    model = ScriptedChatModel(_calls("whoami", "whoami"), "done")
    bot = _bot(model, tools=[whoami])
    asyncio.run(bot.achat("s1", "who am I?", user=User("Bob", "acme")))
    assert [m.text for m in model.requests[1].messages[-2:]] == ["Bob", "Bob"]


def test_a_tool_provider_offers_tools_per_tenant_from_the_context() -> None:
    @tool
    def acme_discount() -> str:
        """Acme's discount."""
        return "10%"

    @tool
    def globex_discount() -> str:
        """Globex's discount."""
        return "5%"

    seen: list[str] = []

    def per_tenant(
        memory_id: Hashable, user_message: UserMessage, context: User | None = None
    ) -> Iterable[object]:
        assert context is not None
        seen.append(context.tenant)
        return [acme_discount] if context.tenant == "acme" else [globex_discount]

    model = ScriptedChatModel(default="ok")
    bot = _bot(model, tool_provider=per_tenant)
    bot.chat("s1", "discount?", user=User("Ada", "acme"))
    bot.chat("s2", "discount?", user=User("Hal", "globex"))
    assert [[t.name for t in r.tools] for r in model.requests] == [
        ["acme_discount"],
        ["globex_discount"],
    ]
    assert seen == ["acme", "globex"]


def test_a_system_message_provider_may_read_the_context() -> None:
    def system(memory_id: Hashable, *, context: User | None = None) -> str:
        return f"You help {context.name if context else 'a guest'}."

    model = ScriptedChatModel(default="ok")
    bot = _bot(model, system_message_provider=system)
    bot.chat("s1", "hi", user=User("Ada", "acme"))
    bot.anonymous("s2", "hi")
    assert [r.messages[0].text for r in model.requests] == ["You help Ada.", "You help a guest."]

    def old_style(memory_id: Hashable) -> str:  # no context keyword: called as before
        return "Be brief."

    model = ScriptedChatModel(default="ok")
    _bot(model, system_message_provider=old_style).chat("s1", "hi", user=User("Ada", "acme"))
    assert model.requests[0].messages[0].text == "Be brief."


def test_context_misuse_fails_the_build() -> None:
    class TwoContexts(Protocol):
        def chat(
            self, text: str, a: Annotated[User, Context], b: Annotated[User, Context]
        ) -> str: ...

    with pytest.raises(InterfaceError, match=r"TwoContexts.chat\(b\): a second Context"):
        ai_service(TwoContexts, model=ScriptedChatModel("x"))

    class InTemplate(Protocol):
        @system_message("You help {{user}} with {{topic}}.")
        def chat(self, text: str, user: Annotated[User, Context]) -> str: ...

    with pytest.raises(InterfaceError) as info:
        ai_service(InTemplate, model=ScriptedChatModel("x"))
    # The context is named as what it is, apart from the name that is no parameter at all.
    assert info.value.problems == [
        "InTemplate.chat(): @system_message uses {{user}}, which is the call's context "
        "(Annotated[..., Context]): a template can't use the context, which goes to tools "
        "and providers and never to the model; pass what the prompt needs as a parameter of "
        "its own",
        "InTemplate.chat(): @system_message uses {{topic}}, which is not a parameter; known: "
        "current_date, current_date_time, current_time, it, text",
    ]

    @tool
    def two(a: Annotated[User, Context], b: Annotated[User, Context]) -> str:
        """Two contexts."""
        return ""

    class Plain(Protocol):
        def chat(self, text: str) -> str: ...

    with pytest.raises(InterfaceError, match="a second Context parameter"):
        ai_service(Plain, model=ScriptedChatModel("x"), tools=[two])


def test_a_tool_parameter_marked_both_memory_id_and_context_is_refused() -> None:
    @tool
    def orders(user: Annotated[str, MemoryId, Context]) -> str:
        """The signed-in user's orders."""
        return user

    class Shop(Protocol):
        def chat(self, text: str, user: Annotated[User, Context]) -> str: ...

    with pytest.raises(
        InterfaceError, match=r"orders\(user\): a Context parameter cannot also be a MemoryId"
    ):
        ai_service(Shop, model=ScriptedChatModel("x"), tools=[orders])


def test_it_names_the_only_parameter_beside_the_context() -> None:
    from aiservices import user_message

    class Asker(Protocol):
        @user_message("Question: {{it}}")
        def ask(self, question: str, user: Annotated[User, Context]) -> str: ...

    class OnlyContext(Protocol):
        @user_message("Hello {{it}}")
        def ask(self, user: Annotated[User, Context]) -> str: ...

    model = ScriptedChatModel(default="ok")
    ai_service(Asker, model=model).ask("why?", user=User("Ada", "acme"))
    assert model.requests[0].messages == [UserMessage("Question: why?")]
    # The context is never a template variable, not even as {{it}}.
    with pytest.raises(InterfaceError, match=r"uses \{\{it\}\}, which is not a parameter"):
        ai_service(OnlyContext, model=model)

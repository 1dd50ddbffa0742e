"""Calling a service: routing by memory id, prompts, what is recorded and what the model sees."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Annotated, Protocol

import pytest
from pydantic import BaseModel

from aiservices import (
    AiMessage,
    ChatMemoryAccess,
    InterfaceError,
    MemoryId,
    MessageWindowChatMemory,
    Result,
    SystemMessage,
    UserMessage,
    UserName,
    V,
    ai_service,
    system_message,
    user_message,
)
from aiservices.models import TokenUsage
from aiservices.testing import ScriptedChatModel


class Chat(ChatMemoryAccess, Protocol):
    @system_message("You are a support agent for {{product}}.")
    def chat(self, user: Annotated[str, MemoryId], message: str, product: str) -> str: ...


def test_each_memory_id_gets_its_own_conversation() -> None:
    model = ScriptedChatModel("Hello Alice", "Hello Bob", "You are Alice")
    bot = ai_service(
        Chat, model=model, chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20)
    )
    assert bot.chat("alice", "Hi, I am Alice", product="Acme") == "Hello Alice"
    bot.chat("bob", "Hi, I am Bob", product="Acme")
    bot.chat("alice", "Who am I?", product="Acme")
    assert model.sent_texts() == [
        ("system", "You are a support agent for Acme."),
        ("user", "Hi, I am Alice"),
        ("ai", "Hello Alice"),
        ("user", "Who am I?"),
    ]
    assert bot.get_chat_memory("bob").messages() == [
        SystemMessage("You are a support agent for Acme."),
        UserMessage("Hi, I am Bob"),
        AiMessage("Hello Bob"),
    ]


def test_recorded_messages_carry_ids_turn_and_time() -> None:
    bot = ai_service(
        Chat,
        model=ScriptedChatModel("a", "b"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
    )
    bot.chat("u", "one", product="P")
    bot.chat("u", "two", product="P")
    messages = bot.get_chat_memory("u").messages()
    assert len({m.message_id for m in messages}) == 5
    assert all(m.created_at is not None and m.created_at.tzinfo is not None for m in messages)
    turns = [m.turn_id for m in messages]
    assert turns[0] == turns[1] == turns[2] != turns[3] == turns[4]


def test_identical_system_message_is_kept_once_and_a_new_one_replaces_it() -> None:
    bot = ai_service(
        Chat,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
    )
    bot.chat("u", "one", product="A")
    bot.chat("u", "two", product="A")
    systems = [m for m in bot.get_chat_memory("u").messages() if isinstance(m, SystemMessage)]
    assert systems == [SystemMessage("You are a support agent for A.")]
    bot.chat("u", "three", product="B")
    systems = [m for m in bot.get_chat_memory("u").messages() if isinstance(m, SystemMessage)]
    assert systems == [SystemMessage("You are a support agent for B.")]


def test_model_sees_the_new_system_message_instead_of_the_old() -> None:
    model = ScriptedChatModel(default="ok")
    bot = ai_service(
        Chat, model=model, chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20)
    )
    bot.chat("u", "one", product="A")
    bot.chat("u", "two", product="B")
    texts = model.sent_texts()
    assert texts[0] == ("system", "You are a support agent for B.")
    assert [t for t in texts if t[0] == "system"] == [texts[0]]


def test_user_text_is_never_rendered_again() -> None:
    class Bot(Protocol):
        @user_message("Tell {{name}} about {{topic}}")
        def ask(self, name: str, topic: str) -> str: ...

    model = ScriptedChatModel("ok")
    bot = ai_service(Bot, model=model)
    bot.ask("{{topic}}", topic="{{name}}")
    assert model.last_user_text == "Tell {{topic}} about {{name}}"


def test_it_names_the_only_parameter_and_structured_values_render_as_json() -> None:
    class Item(BaseModel):
        name: str
        qty: int

    @dataclass
    class Point:
        x: int
        y: int

    class Bot(Protocol):
        @user_message("Describe {{it}}")
        def describe(self, item: Item) -> str: ...

        @user_message("Plot {{p}} and {{tags}} and {{n}}")
        def plot(self, p: Point, tags: list[str], n: int) -> str: ...

    model = ScriptedChatModel(default="ok")
    bot = ai_service(Bot, model=model)
    bot.describe(Item(name="pen", qty=2))
    assert model.last_user_text == 'Describe {"name":"pen","qty":2}'
    bot.plot(Point(1, 2), ["a", "b"], 3)
    assert model.last_user_text == 'Plot {"x":1,"y":2} and ["a","b"] and 3'


def test_alias_and_user_name() -> None:
    class Bot(Protocol):
        @system_message("Topic: {{topic}}")
        def chat(
            self, subject: Annotated[str, V("topic")], who: Annotated[str, UserName], text: str
        ) -> str: ...

    model = ScriptedChatModel("ok")
    bot = ai_service(Bot, model=model)
    bot.chat("cats", "alice", "hello")
    assert model.last_system_text == "Topic: cats"
    assert model.last_messages[-1] == UserMessage("hello", name="alice")


def test_a_user_name_that_is_not_a_str_is_a_type_error_naming_the_parameter() -> None:
    # Recorded as it was, it made the stored conversation unreadable.
    class Room(Protocol):
        def say(self, who: Annotated[str, UserName], text: str) -> str: ...

    model = ScriptedChatModel("ok")
    with pytest.raises(TypeError, match=r"Room.say\(who\): a UserName must be a str"):
        ai_service(Room, model=model).say(1042, "hello")  # type: ignore[arg-type]
    assert model.requests == []


def test_class_level_system_message_applies_to_every_method_and_method_wins() -> None:
    @system_message("Be brief.")
    class Bot(Protocol):
        def a(self, text: str) -> str: ...

        @system_message("Be verbose.")
        def b(self, text: str) -> str: ...

    model = ScriptedChatModel(default="ok")
    bot = ai_service(Bot, model=model)
    bot.a("x")
    assert model.last_system_text == "Be brief."
    bot.b("x")
    assert model.last_system_text == "Be verbose."


def test_a_methods_empty_system_message_wins_over_the_class_one() -> None:
    @system_message("Be brief.")
    class Bot(Protocol):
        @system_message("")
        def free(self, text: str) -> str: ...

    model = ScriptedChatModel(default="ok")
    ai_service(Bot, model=model).free("x")
    assert [m.text for m in model.requests[0].messages] == ["x"]
    # Nor does a system_message_provider give it one.
    provided = ai_service(
        Bot, model=model, system_message_provider=lambda memory_id: "You are a pirate."
    )
    provided.free("y")
    assert [m.text for m in model.requests[1].messages] == ["y"]


def test_system_message_provider_gets_the_memory_id() -> None:
    class Bot(Protocol):
        def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    model = ScriptedChatModel(default="ok")
    bot = ai_service(
        Bot,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(),
        system_message_provider=lambda memory_id: f"Talking to {memory_id}",
    )
    bot.chat("zoe", "hi")
    assert model.last_system_text == "Talking to zoe"


def test_a_system_message_provider_giving_an_empty_text_gives_no_system_message() -> None:
    # As a template that renders empty: an empty system message would go on the wire.
    class Bot(Protocol):
        def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    model = ScriptedChatModel(default="ok")
    memory = MessageWindowChatMemory.provider()
    bot = ai_service(
        Bot, model=model, chat_memory_provider=memory, system_message_provider=lambda m: ""
    )
    bot.chat("zoe", "hi")
    assert model.sent_texts() == [("user", "hi")]


def test_none_memory_id_is_a_value_error_unless_optional() -> None:
    bot = ai_service(
        Chat,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(),
    )
    with pytest.raises(ValueError, match=r"Chat.chat\(user\)"):
        bot.chat(None, "hi", product="p")  # type: ignore[arg-type]


def test_optional_memory_id_none_starts_a_new_conversation() -> None:
    class Bot(ChatMemoryAccess, Protocol):
        def chat(self, conversation: Annotated[str | None, MemoryId], text: str) -> Result[str]: ...

    bot = ai_service(
        Bot,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(),
    )
    first = bot.chat(None, "hi")
    second = bot.chat(None, "hi")
    assert isinstance(first.memory_id, str)
    assert str(uuid.UUID(first.memory_id)) == first.memory_id
    assert first.memory_id != second.memory_id
    assert len(bot.get_chat_memory(first.memory_id).messages()) == 2


def test_a_new_conversation_id_is_what_templates_show() -> None:
    class Bot(Protocol):
        @system_message("You are in conversation {{conversation}}.")
        def chat(self, conversation: Annotated[str | None, MemoryId], text: str) -> Result[str]: ...

    model = ScriptedChatModel(default="ok")
    bot = ai_service(Bot, model=model, chat_memory_provider=MessageWindowChatMemory.provider())
    new_id = bot.chat(None, "hi").memory_id
    assert model.sent_texts(0)[0] == ("system", f"You are in conversation {new_id}.")
    # The next call on that id finds the same system message: nothing is replaced.
    bot.chat(new_id, "again")
    assert [text for role, text in model.sent_texts(1) if role == "system"] == [
        f"You are in conversation {new_id}."
    ]


def test_a_memory_id_marked_inside_an_optional_is_a_memory_id() -> None:
    # `Annotated[str, MemoryId] | None` is the natural spelling: read as unmarked, every
    # user shared one conversation.
    class Bot(ChatMemoryAccess, Protocol):
        def chat(self, user: Annotated[str, MemoryId] | None, text: str) -> Result[str]: ...

    model = ScriptedChatModel(default="ok")
    bot = ai_service(Bot, model=model, chat_memory_provider=MessageWindowChatMemory.provider())
    bot.chat("alice", "My card is 4111")
    assert bot.chat("bob", "What do you know?").memory_id == "bob"
    assert [m.text for m in model.requests[-1].messages] == ["What do you know?"]
    assert [m.text for m in bot.get_chat_memory("alice").messages()] == ["My card is 4111", "ok"]
    assert bot.chat(None, "hi").memory_id not in ("alice", "bob", "default")

    class Unserved(Protocol):
        def chat(self, user: Annotated[str, MemoryId] | None, text: str) -> str: ...

    with pytest.raises(InterfaceError, match=r"Unserved.chat\(user\).*chat_memory_provider"):
        ai_service(Unserved, model=model)


def test_unhashable_memory_id_is_a_type_error_naming_the_parameter() -> None:
    class Bot(Protocol):
        def chat(self, user: Annotated[object, MemoryId], text: str) -> str: ...

    bot = ai_service(
        Bot,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(),
    )
    with pytest.raises(TypeError, match=r"Bot.chat\(user\).*unhashable"):
        bot.chat(["a"], "hi")


def test_without_memory_id_the_chat_memory_is_used() -> None:
    class Bot(Protocol):
        def chat(self, text: str) -> str: ...

    memory = MessageWindowChatMemory(10)
    bot = ai_service(Bot, model=ScriptedChatModel("a", "b"), chat_memory=memory)
    bot.chat("one")
    bot.chat("two")
    assert memory.messages() == [
        UserMessage("one"),
        AiMessage("a"),
        UserMessage("two"),
        AiMessage("b"),
    ]


def test_without_memory_id_the_provider_memory_default_is_used() -> None:
    class Bot(ChatMemoryAccess, Protocol):
        def chat(self, text: str) -> str: ...

    bot = ai_service(
        Bot, model=ScriptedChatModel("a"), chat_memory_provider=MessageWindowChatMemory.provider()
    )
    bot.chat("one")
    assert bot.get_chat_memory("default").messages() == [UserMessage("one"), AiMessage("a")]


def test_without_any_memory_calls_are_stateless() -> None:
    class Bot(Protocol):
        def chat(self, text: str) -> str: ...

    model = ScriptedChatModel("a", "b")
    bot = ai_service(Bot, model=model)
    bot.chat("one")
    bot.chat("two")
    assert model.sent_texts() == [("user", "two")]


def test_memory_cache_is_bounded_and_evicts_least_recently_used() -> None:
    made: list[str] = []
    base = MessageWindowChatMemory.provider(max_messages=10)

    def provider(memory_id: object) -> object:
        made.append(str(memory_id))
        return base(memory_id)

    class Bot(ChatMemoryAccess, Protocol):
        def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    bot = ai_service(
        Bot,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=provider,  # type: ignore[arg-type]
        chat_memory_cache_size=2,
    )
    bot.chat("a", "x")
    bot.chat("b", "x")
    bot.chat("a", "x")  # a is now the most recent
    bot.chat("c", "x")  # evicts b
    bot.chat("a", "x")
    bot.chat("b", "x")
    assert made == ["a", "b", "c", "b"]
    # the conversation itself survives eviction: it lives in the store
    assert len(bot.get_chat_memory("b").messages()) == 4


def test_get_and_evict_chat_memory() -> None:
    bot = ai_service(
        Chat,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(),
    )
    bot.chat("u", "hi", product="p")
    memory = bot.get_chat_memory("u")
    assert bot.get_chat_memory("u") is memory
    bot.evict_chat_memory("u")
    again = bot.get_chat_memory("u")
    assert again is not memory
    assert again.messages() == memory.messages()


def test_forget_erases_the_conversation() -> None:
    bot = ai_service(
        Chat,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(),
    )
    bot.chat("u", "hi", product="p")
    bot.forget("u")
    assert bot.get_chat_memory("u").messages() == []


def test_result_sums_token_usage_and_reports_finish_reason() -> None:
    class Bot(Protocol):
        def chat(self, text: str) -> Result[str]: ...

    bot = ai_service(Bot, model=ScriptedChatModel("hi", usage=TokenUsage(10, 2)))
    result = bot.chat("hello")
    assert result.content == "hi"
    assert result.token_usage == TokenUsage(10, 2)
    assert result.finish_reason == "stop"
    assert result.tool_executions == ()
    assert result.ai_message == AiMessage("hi")


def test_ai_message_return() -> None:
    class Bot(Protocol):
        def chat(self, text: str) -> AiMessage: ...

    bot = ai_service(Bot, model=ScriptedChatModel("hi"))
    answer = bot.chat("hello")
    assert answer == AiMessage("hi")
    assert answer.message_id is not None


async def test_async_method_awaits_the_model() -> None:
    class Bot(ChatMemoryAccess, Protocol):
        async def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    bot = ai_service(
        Bot,
        model=ScriptedChatModel("a", "b"),
        chat_memory_provider=MessageWindowChatMemory.provider(),
    )
    assert await bot.chat("u", "one") == "a"
    assert await bot.chat("u", "two") == "b"
    assert [m.text for m in bot.get_chat_memory("u").messages()] == ["one", "a", "two", "b"]


async def test_async_call_on_a_model_with_only_chat_uses_a_thread() -> None:
    class OnlyChat:
        def __init__(self) -> None:
            self.inner = ScriptedChatModel("sync answer")

        def chat(self, request):  # type: ignore[no-untyped-def]
            return self.inner.chat(request)

    class Bot(Protocol):
        async def chat(self, text: str) -> str: ...

    bot = ai_service(Bot, model=OnlyChat())
    assert await bot.chat("x") == "sync answer"


def test_the_model_always_sees_the_system_message_first() -> None:
    class Bot(ChatMemoryAccess, Protocol):
        def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    model = ScriptedChatModel(default="ok")
    bot = ai_service(
        Bot,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
        system_message_provider=lambda memory_id: "Be kind.",
    )
    memory = bot.get_chat_memory("u")
    # a conversation whose system message was added after some messages
    memory.set([UserMessage("early"), AiMessage("reply"), SystemMessage("Be kind.")])
    bot.chat("u", "now")
    assert model.sent_texts() == [
        ("system", "Be kind."),
        ("user", "early"),
        ("ai", "reply"),
        ("user", "now"),
    ]


def test_a_system_message_provider_returning_no_text_is_a_type_error_naming_it() -> None:
    class Bot(Protocol):
        def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    def numbered(memory_id: object) -> int:
        return 42

    model = ScriptedChatModel(default="never")
    memory_provider = MessageWindowChatMemory.provider()
    bot = ai_service(
        Bot,
        model=model,
        chat_memory_provider=memory_provider,
        system_message_provider=numbered,  # type: ignore[arg-type]
    )
    with pytest.raises(
        TypeError, match=r"system_message_provider .*numbered returned int for memory id 'zoe'"
    ):
        bot.chat("zoe", "hi")
    assert model.requests == []

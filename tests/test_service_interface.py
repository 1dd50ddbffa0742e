"""Building a service: the interface is analysed once, and every mistake fails the build."""

from __future__ import annotations

import datetime
import enum
import functools
from collections.abc import Callable, Iterator
from datetime import date
from typing import Annotated, Any, Literal, LiteralString, NewType, Protocol

import pytest
from pydantic import BaseModel

from aiservices import (
    InterfaceError,
    MemoryId,
    MessageWindowChatMemory,
    Result,
    UserName,
    V,
    ai_service,
    guardrails,
    system_message,
    user_message,
)
from aiservices.testing import ScriptedChatModel


def build(interface: type, **options: object) -> object:
    options.setdefault("model", ScriptedChatModel(default="ok"))
    return ai_service(interface, **options)  # type: ignore[arg-type]


def problems(interface: type, **options: object) -> list[str]:
    with pytest.raises(InterfaceError) as info:
        build(interface, **options)
    return info.value.problems


def test_memory_id_without_provider_fails_at_build_naming_method_and_parameter() -> None:
    class Bot(Protocol):
        def chat(self, user: Annotated[str, MemoryId], message: str) -> str: ...

    [problem] = problems(Bot)
    assert problem.startswith("Bot.chat(user)")
    assert "chat_memory_provider" in problem


def test_two_memory_ids_fail() -> None:
    class Bot(Protocol):
        def chat(
            self, a: Annotated[str, MemoryId], b: Annotated[str, MemoryId], message: str
        ) -> str: ...

    found = problems(Bot, chat_memory_provider=MessageWindowChatMemory.provider())
    assert any(p.startswith("Bot.chat(b)") and "second MemoryId" in p for p in found)
    # The second id is no candidate for the user message: `message` is, alone.
    assert not any("ambiguous" in p for p in found), found


def test_unknown_template_variable_fails_and_lists_known_names() -> None:
    class Bot(Protocol):
        @system_message("You sell {{prodcut}}.")
        def chat(self, message: str, product: str) -> str: ...

    found = problems(Bot)
    assert found[0].startswith("Bot.chat()")
    assert "{{prodcut}}" in found[0]
    assert "known: current_date, current_date_time, current_time, message, product" in found[0]


def test_every_problem_is_reported_at_once() -> None:
    class Bot(Protocol):
        @user_message("{{nope}}")
        def a(self, x: str) -> str: ...

        def b(self, x: str, y: str) -> str: ...

        def c(self) -> str: ...

    found = problems(Bot)
    assert len(found) == 3
    assert [p.split(":")[0] for p in found] == ["Bot.a()", "Bot.b()", "Bot.c()"]
    assert "ambiguous" in found[1]
    assert "no user message" in found[2]


def test_unsupported_return_type_fails_at_build() -> None:
    class Bot(Protocol):
        def chat(self, message: str) -> object: ...

    [problem] = problems(Bot)
    assert problem.startswith("Bot.chat()")
    assert "return type" in problem


def test_missing_return_annotation_fails() -> None:
    class Bot(Protocol):
        def chat(self, message: str): ...  # type: ignore[no-untyped-def]

    [problem] = problems(Bot)
    assert "return type" in problem


def test_var_args_fail() -> None:
    class Bot(Protocol):
        def chat(self, *messages: str) -> str: ...

    assert any("*args" in p for p in problems(Bot))


def test_duplicate_alias_fails() -> None:
    class Bot(Protocol):
        @user_message("{{topic}}")
        def chat(self, a: Annotated[str, V("topic")], topic: str) -> str: ...

    assert any("already" in p for p in problems(Bot))


def test_not_a_protocol_fails() -> None:
    class Bot:
        def chat(self, message: str) -> str:
            return message

    with pytest.raises(InterfaceError, match=r"typing\.Protocol"):
        build(Bot)


def test_model_must_be_a_chat_model_or_known_string() -> None:
    class Bot(Protocol):
        def chat(self, message: str) -> str: ...

    with pytest.raises(InterfaceError, match="openai:MODEL"):
        build(Bot, model="gpt-4o")
    with pytest.raises(InterfaceError, match="ChatModel"):
        build(Bot, model=object())


def test_interface_error_is_a_type_error() -> None:
    class Bot(Protocol):
        def chat(self) -> str: ...

    with pytest.raises(TypeError):
        build(Bot)


def test_user_name_and_memory_id_are_not_the_user_message() -> None:
    class Bot(Protocol):
        def chat(
            self,
            who: Annotated[str, UserName],
            conversation: Annotated[str, MemoryId],
            message: str,
        ) -> str: ...

    bot = build(Bot, chat_memory_provider=MessageWindowChatMemory.provider())
    assert hasattr(bot, "chat")


def test_class_decorator_form_makes_the_service() -> None:
    model = ScriptedChatModel("hello")

    @ai_service(model=model)
    class Bot(Protocol):
        def chat(self, message: str) -> str: ...

    assert Bot.chat("hi") == "hello"


def test_service_keeps_the_interface_signature_and_type() -> None:
    import inspect

    class Bot(Protocol):
        @user_message("{{message}} ({{tone}})")
        def chat(self, message: str, *, tone: str = "calm") -> str:
            """Talk."""
            ...

    bot = build(Bot)
    assert Bot in type(bot).__mro__
    assert str(inspect.signature(bot.chat)) == "(message: 'str', *, tone: 'str' = 'calm') -> 'str'"  # type: ignore[attr-defined]
    assert bot.chat.__doc__ == "Talk."  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        bot.chat()  # type: ignore[attr-defined]


class Chat(Protocol):
    def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...


class AsyncChat(Protocol):
    async def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...


def test_a_system_message_provider_that_is_a_text_fails_the_build() -> None:
    found = problems(
        Chat,
        chat_memory_provider=MessageWindowChatMemory.provider(),
        system_message_provider="You are a pirate.",
    )
    assert len(found) == 1
    assert "system_message_provider='You are a pirate.' is not callable" in found[0]
    assert "@system_message" in found[0]


@pytest.mark.parametrize("interface", [Chat, AsyncChat])
def test_providers_and_transformers_called_without_await_may_not_be_async(
    interface: type,
) -> None:
    # Nothing awaits them, on sync or async methods alike: an async one could never work.
    async def system(memory_id: object) -> str:
        return "x"

    async def tools(memory_id: object, message: object) -> list[object]:
        return []

    async def transform(request: object, memory_id: object) -> object:
        return request

    async def memories(memory_id: object) -> object:
        return MessageWindowChatMemory(10, id=memory_id)

    found = problems(
        interface,
        chat_memory_provider=memories,
        system_message_provider=system,
        tool_provider=tools,
        request_transformer=transform,
    )
    assert [p.split("=")[0] for p in found] == [
        "chat_memory_provider",
        "system_message_provider",
        "tool_provider",
        "request_transformer",
    ]
    assert all("is async: it must be a plain function" in p for p in found)


def test_an_async_seed_memory_fails_the_build_on_a_sync_method_only() -> None:
    async def seed(memory_id: object) -> list[object]:
        return []

    provider = MessageWindowChatMemory.provider()
    found = problems(Chat, chat_memory_provider=provider, seed_memory=seed)
    assert found == [
        "Chat.chat(): the seed_memory "
        "test_an_async_seed_memory_fails_the_build_on_a_sync_method_only.<locals>.seed is "
        "async and the method is not: make the method async or the seed_memory sync"
    ]
    build(AsyncChat, chat_memory_provider=provider, seed_memory=seed)  # awaited there


class Ask(Protocol):
    def ask(self, question: str) -> str: ...


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            {"retriever": lambda query: []},
            "retriever=<lambda>(query) can't be called as retriever(query, memory_id): too "
            "many positional arguments; it must accept (query, memory_id), and any other "
            "parameter needs a default",
        ),
        (
            {"system_message_provider": lambda: "Be brief."},
            "system_message_provider=<lambda>() can't be called as "
            "system_message_provider(memory_id): too many positional arguments",
        ),
        (
            {"system_message_provider": lambda context, memory_id=None: "Be brief."},
            "system_message_provider=<lambda>(context, memory_id=None) can't be called as "
            "system_message_provider(memory_id, context=...): multiple values for argument "
            "'context'; it must accept (memory_id, context=...)",
        ),
        (
            {"tool_provider": lambda memory_id: []},
            "tool_provider=<lambda>(memory_id) can't be called as "
            "tool_provider(memory_id, user_message): too many positional arguments",
        ),
        (
            {"tool_provider": lambda memory_id, message, *, tenant: []},
            "tool_provider=<lambda>(memory_id, message, *, tenant) can't be called as "
            "tool_provider(memory_id, user_message): missing a required argument: 'tenant'",
        ),
        (
            {"request_transformer": lambda request: request},
            "request_transformer=<lambda>(request) can't be called as "
            "request_transformer(request, memory_id): too many positional arguments",
        ),
        (
            {"tool_error_handler": lambda error: "failed"},
            "tool_error_handler=<lambda>(error) can't be called as "
            "tool_error_handler(error, request): too many positional arguments",
        ),
        (
            {"seed_memory": lambda: []},
            "seed_memory=<lambda>() can't be called as seed_memory(memory_id): too many "
            "positional arguments",
        ),
        (
            {"chat_memory_provider": lambda: None},
            "chat_memory_provider=<lambda>() can't be called as "
            "chat_memory_provider(memory_id): too many positional arguments",
        ),
        (
            {"input_guardrails": [str.strip, lambda: None]},
            "input_guardrails[1]=<lambda>() can't be called as guardrail(text): too many "
            "positional arguments; it must accept (text)",
        ),
        (
            {"output_guardrails": [lambda message, extra: None]},
            "output_guardrails[0]=<lambda>(message, extra) can't be called as "
            "guardrail(message): missing a required argument: 'extra'",
        ),
    ],
    ids=[
        "retriever",
        "system_message_provider",
        "system_message_provider-context",
        "tool_provider",
        "tool_provider-keyword",
        "request_transformer",
        "tool_error_handler",
        "seed_memory",
        "chat_memory_provider",
        "input_guardrails",
        "output_guardrails",
    ],
)
def test_an_option_that_cannot_take_the_arguments_it_is_called_with_fails_the_build(
    options: dict[str, object], expected: str
) -> None:
    [problem] = problems(Ask, **options)
    assert problem.startswith(expected), problem


def test_every_option_that_cannot_take_its_call_is_reported_at_once() -> None:
    class Searcher:
        def __call__(self, query: str) -> list[str]:
            return []

    def three(a: str, b: str, c: str) -> list[str]:
        return []

    found = problems(
        Ask,
        retriever=Searcher(),
        system_message_provider=functools.partial(three, "a"),
        request_transformer=MessageWindowChatMemory(5).add,  # (*messages): takes any call
    )
    assert found == [
        "system_message_provider=partial(test_every_option_that_cannot_take_its_call_is_"
        "reported_at_once.<locals>.three, ...)(b, c) can't be called as "
        "system_message_provider(memory_id): missing a required argument: 'c'; it must "
        "accept (memory_id), and any other parameter needs a default",
        "retriever=test_every_option_that_cannot_take_its_call_is_reported_at_once.<locals>."
        "Searcher.__call__(query) can't be called as retriever(query, memory_id): too many "
        "positional arguments; it must accept (query, memory_id), and any other parameter "
        "needs a default",
    ]


def test_options_that_can_take_their_call_build_and_run() -> None:
    class Searcher:
        def __call__(self, query: str, memory_id: object, limit: int = 3) -> list[str]:
            return [f"found {query}"][:limit]

        def search(self, query: str, memory_id: object) -> list[str]:
            return [f"found {query}"]

    def limited(function: Callable[..., Any]) -> Callable[..., Any]:
        # Shows the signature of what it wraps, and is called with one argument less.
        @functools.wraps(function)
        def wrapper(*args: Any) -> Any:
            return function(*args, 1)

        return wrapper

    def system(tone: str, memory_id: object, context: object = None) -> str:
        return f"Be {tone}."

    def tools(*args: object) -> list[object]:
        return []

    for retriever in (Searcher(), Searcher().search, limited(lambda query, _, n: [query])):
        model = ScriptedChatModel(default="ok")
        service: Any = build(
            Ask,
            model=model,
            retriever=retriever,
            system_message_provider=functools.partial(system, "brief"),
            tool_provider=tools,
            input_guardrails=[str.strip],  # a builtin's signature may not be known: not checked
            output_guardrails=[lambda message, *rest: None],
        )
        assert service.ask(" Where is it? ") == "ok"
        assert model.last_system_text == "Be brief."


def test_a_methods_guardrail_that_cannot_take_its_call_fails_the_build() -> None:
    def check(text: str, strict: bool) -> None:
        return None

    @guardrails(output=[lambda: None])
    class Bot(Protocol):
        @guardrails(input=[check])
        def ask(self, question: str) -> str: ...

        def other(self, question: str) -> str: ...

    found = problems(Bot)
    # The class's guardrail is every method's, and reported once.
    assert len(found) == 2, found
    assert found[0].startswith(
        "Bot.ask(): the input guardrail "
        "test_a_methods_guardrail_that_cannot_take_its_call_fails_the_build.<locals>.check"
        "(text, strict) can't be called as guardrail(text): missing a required argument: "
        "'strict'"
    )
    assert "output guardrail" in found[1]
    assert "<lambda>() can't be called as guardrail(message)" in found[1]


class Planner(Protocol):
    @user_message("When is {{event}}?")
    def when(self, event: str) -> date: ...  # a string annotation, resolved at build


def test_the_builders_locals_do_not_shadow_the_interface_modules_names() -> None:
    date = "2024-01-01"  # a local that happens to share the name of the return type
    bot = ai_service(Planner, model=ScriptedChatModel("2024-05-01"))  # here: these locals
    assert bot.when("the launch") == datetime.date(2024, 5, 1)
    assert date == "2024-01-01"


def test_an_interface_local_to_a_function_still_names_its_locals() -> None:
    class Slot(BaseModel):
        day: str

    class Local(Protocol):
        def when(self, event: str) -> Slot: ...

    bot = ai_service(Local, model=ScriptedChatModel('{"day": "Monday"}'))
    assert bot.when("x") == Slot(day="Monday")


def test_call_is_a_method_the_service_implements() -> None:
    class Summarizer(Protocol):
        def __call__(self, text: str) -> str: ...

    model = ScriptedChatModel("a summary")
    summarize = ai_service(Summarizer, model=model)
    assert summarize("a long text") == "a summary"
    assert [m.text for m in model.requests[0].messages] == ["a long text"]


def test_parameters_may_have_any_name() -> None:
    # Named like what the generated method uses inside: they must not hide it.
    class Odd(Protocol):
        @user_message("{{_run}} {{_plan}} {{run_sync}}")
        def ask(self, _run: str, _plan: str, run_sync: str = "c") -> str: ...

    model = ScriptedChatModel("ok")
    assert ai_service(Odd, model=model).ask("a", "b") == "ok"
    assert model.last_user_text == "a b c"


@pytest.mark.parametrize("size", [0, 1.5, True, None, "3"])
def test_a_cache_size_that_is_not_a_positive_int_fails_the_build(size: object) -> None:
    class Bot(Protocol):
        def chat(self, user: Annotated[str, MemoryId], message: str) -> str: ...

    found = problems(
        Bot,
        chat_memory_provider=MessageWindowChatMemory.provider(),
        chat_memory_cache_size=size,
    )
    assert found == [f"chat_memory_cache_size={size!r}: must be an int, 1 or more"]


@pytest.mark.parametrize("option", ["max_tool_invocations", "max_output_retries"])
@pytest.mark.parametrize("count", [1.5, 2.0, True, None, "3"])
def test_a_retry_or_tool_limit_that_is_not_an_int_fails_the_build(
    option: str, count: object
) -> None:
    class Bot(Protocol):
        def chat(self, message: str) -> str: ...

    found = problems(Bot, **{option: count})
    assert found == [
        f"{option}={count!r}: must be a whole number (an int), 0 or more; 0 allows none"
    ]


def test_a_marker_used_as_the_type_itself_fails_the_build() -> None:
    class Bot(Protocol):
        @user_message("{{message}}")
        def chat(self, user: MemoryId, message: str) -> str: ...  # type: ignore[valid-type]

    [problem] = problems(Bot, chat_memory_provider=MessageWindowChatMemory.provider(max_messages=5))
    assert problem.startswith("Bot.chat(user):")
    assert "`user: Annotated[str, MemoryId]`" in problem


def test_a_parameter_no_template_uses_fails_the_build() -> None:
    class Bot(Protocol):
        @user_message("Summarise this.")
        def summarise(self, text: str) -> str: ...

        @user_message("Translate {text} into {{language}}")
        def translate(self, text: str, language: str) -> str: ...

        @system_message("Answer in {{language}}.")
        @user_message("{{text}}")
        def both(self, text: str, language: str) -> str: ...

    found = problems(Bot)
    assert len(found) == 2
    assert found[0].startswith("Bot.summarise(text): no template uses this parameter")
    assert "use {{text}} in @user_message" in found[0]
    assert found[1].startswith("Bot.translate(text):")
    assert "the template has `{text}`: a placeholder takes two braces, `{{text}}`" in found[1]


def test_single_braces_around_a_parameter_no_template_uses_fail_the_build() -> None:
    class Bot(Protocol):
        @system_message("You are a support agent for {product}.")
        def support(self, message: str, product: str) -> str: ...

        @system_message("You help {user}.")
        def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

        @user_message("{speaker} says: {{text}}")
        def relay(self, speaker: Annotated[str, UserName], text: str) -> str: ...

    found = problems(Bot, chat_memory_provider=MessageWindowChatMemory.provider())
    # The single braces are the mistake: not an ambiguous user message, nor text sent as is.
    assert found == [
        "Bot.support(product): no template uses this parameter, but the template has "
        "`{product}`: a placeholder takes two braces, `{{product}}`",
        "Bot.chat(user): no template uses this parameter, but the template has `{user}`: a "
        "placeholder takes two braces, `{{user}}`",
        "Bot.relay(speaker): no template uses this parameter, but the template has "
        "`{speaker}`: a placeholder takes two braces, `{{speaker}}`",
    ]


def test_single_braces_around_other_names_are_text() -> None:
    class Bot(Protocol):
        # A JSON example, a name that is no parameter, and a parameter a placeholder uses.
        @system_message('Answer as {"verdict": "..."}; fill {slot} for {{user}}, not {user}.')
        def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    model = ScriptedChatModel("ok")
    service: Any = build(Bot, model=model, chat_memory_provider=MessageWindowChatMemory.provider())
    service.chat("ann", "hi")
    assert model.last_system_text == (
        'Answer as {"verdict": "..."}; fill {slot} for ann, not {user}.'
    )


def test_a_class_given_for_an_instance_fails_the_build() -> None:
    class Bot(Protocol):
        def chat(self, user: Annotated[str, MemoryId], message: str) -> str: ...

    with pytest.raises(InterfaceError, match=r"model=ScriptedChatModel is a class"):
        build(Bot, model=ScriptedChatModel)
    [problem] = problems(Bot, chat_memory_provider=MessageWindowChatMemory)
    assert "MessageWindowChatMemory.provider(...)" in problem
    [problem] = problems(
        Bot,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=5),
        chat_memory=MessageWindowChatMemory,
    )
    assert "chat_memory=MessageWindowChatMemory is a class" in problem


def test_a_lone_tool_or_listener_where_a_list_belongs_fails_the_build() -> None:
    from aiservices import tool

    class Bot(Protocol):
        def chat(self, message: str) -> str: ...

    @tool
    def order_status(order: str) -> str:
        """Where an order is."""
        return "shipped"

    [problem] = problems(Bot, tools=order_status)
    assert problem.startswith("tools= takes a list")
    assert "tools=[order_status]" in problem
    [problem] = problems(Bot, tools="order_status")
    assert problem.startswith("tools= takes a list")


# -- methods with a body --------------------------------------------------------------------------


def test_a_method_with_a_body_runs_as_written_and_may_call_the_model_methods() -> None:
    class Bot(Protocol):
        def chat(self, message: str) -> str: ...

        def greet(self, name: str) -> str:
            return self.chat(f"Say hello to {name}.").upper()

        def stub_with_docstring(self, message: str) -> str:
            """Answered by the model."""

        def stub_that_raises(self, message: str) -> str:
            raise NotImplementedError("the model answers this")

    model = ScriptedChatModel(default="hello, ada")
    bot = ai_service(Bot, model=model)
    assert bot.greet("Ada") == "HELLO, ADA"
    assert [m.text for m in model.requests[0].messages] == ["Say hello to Ada."]
    assert bot.stub_with_docstring("x") == "hello, ada"
    assert bot.stub_that_raises("y") == "hello, ada"
    assert [m.text for r in model.requests for m in r.messages] == [
        "Say hello to Ada.",
        "x",
        "y",
    ]


async def test_an_async_method_with_a_body_awaits_the_model_methods() -> None:
    class Bot(Protocol):
        async def chat(self, message: str) -> str: ...

        async def twice(self, message: str) -> list[str]:
            return [await self.chat(message), await self.chat(message + "!")]

    model = ScriptedChatModel("a", "b")
    bot = ai_service(Bot, model=model)
    assert await bot.twice("hi") == ["a", "b"]


def test_a_body_in_an_extended_interface_overrides_a_declaration_and_back() -> None:
    class Base(Protocol):
        def chat(self, message: str) -> str: ...

        def summary(self, text: str) -> str:
            return "written"

    class Bot(Base, Protocol):
        def chat(self, message: str) -> str:
            return "chat written"

        def summary(self, text: str) -> str: ...

    bot = ai_service(Bot, model=ScriptedChatModel(default="from the model"))
    assert bot.chat("x") == "chat written"
    assert bot.summary("x") == "from the model"


def test_prompt_decorators_on_a_method_with_a_body_fail_the_build() -> None:
    class Bot(Protocol):
        def chat(self, message: str) -> str: ...

        @user_message("Translate {{text}}")
        def translate(self, text: str) -> str:
            return text

    [problem] = problems(Bot)
    assert problem.startswith("Bot.translate has a body, so it runs as written")
    assert "make its body `...`" in problem


def test_prompt_decorators_on_members_the_service_leaves_alone_fail_the_build() -> None:
    class Bot(Protocol):
        def chat(self, message: str) -> str: ...

        @staticmethod
        @user_message("Summarise: {{text}}")
        def summarise(text: str) -> str: ...

        @user_message("Summarise: {{text}}")
        @classmethod
        def shorten(cls, text: str) -> str: ...

        @property
        @system_message("Be brief.")
        def brief(self) -> str: ...

        @user_message("Summarise: {{text}}")
        def _summarise_raw(self, text: str) -> str: ...

        @staticmethod
        def helper(text: str) -> str:  # undecorated helpers stay allowed
            return text

    found = problems(Bot)
    assert [p.split(":")[0] for p in found] == [
        "Bot.summarise",
        "Bot.shorten",
        "Bot.brief",
        "Bot._summarise_raw",
    ]
    assert "it is a staticmethod" in found[0]
    assert "it is a classmethod" in found[1]
    assert "it is a property" in found[2]
    assert "starts with an underscore" in found[3]
    assert all("decorators would do nothing" in p for p in found)


def test_a_result_around_a_stream_or_a_class_template_error_says_where_to_look() -> None:
    class Streams(Protocol):
        def chat(self, message: str) -> Result[Iterator[str]]: ...

    [problem] = problems(Streams)
    assert "Result cannot wrap a stream (declare -> TextStream" in problem

    @system_message("You support {{product}}.")
    class Support(Protocol):
        def chat(self, message: str) -> str: ...

    [problem] = problems(Support)
    assert problem.startswith("Support.chat(): @system_message on Support uses {{product}}")


@pytest.mark.parametrize(
    "decorator",
    [system_message("Be brief."), user_message("{{text}}"), guardrails(input=[lambda t: t])],
)
def test_an_interface_decorator_above_the_class_decorator_is_refused(decorator: Any) -> None:
    # There it would decorate the service object, and do nothing.
    class Bot(Protocol):
        def __call__(self, text: str) -> str: ...

    service = ai_service(model=ScriptedChatModel(default="ok"))(Bot)
    with pytest.raises(TypeError, match="write it below @ai_service"):
        decorator(service)


def test_parameters_are_checked_when_made_and_when_given() -> None:
    from aiservices.models import ChatRequestParameters

    for wrong, said in [
        ({"temperature": -1}, "temperature must be a number >= 0"),
        ({"top_p": 5}, "top_p must be a number between 0 and 1"),
        ({"temperature": True}, "temperature must be a number"),
        ({"max_output_tokens": 0}, "max_output_tokens must be an int >= 1"),
        ({"max_output_tokens": 10.5}, "max_output_tokens must be an int >= 1"),
        ({"parallel_tool_calls": "no"}, "parallel_tool_calls must be True, False or None"),
    ]:
        with pytest.raises(ValueError, match=said):
            ChatRequestParameters(**wrong)

    class Bot(Protocol):
        def chat(self, text: str) -> str: ...

    assert problems(Bot, parameters={"temperature": 0.2}) == [
        "parameters is a dict; pass ChatRequestParameters(...), such as "
        "parameters=ChatRequestParameters(temperature=0.2)"
    ]
    [problem] = problems(Bot, parameters=ChatRequestParameters)
    assert problem.startswith("parameters is the class ChatRequestParameters; pass")


def test_a_method_named_like_the_memory_access_fails_the_build() -> None:
    class Tutor(Protocol):
        def chat(self, message: str) -> str: ...

        def forget(self, topic: str) -> str: ...

        def conversation_stats(self, text: str) -> str: ...

    found = problems(Tutor, chat_memory_provider=MessageWindowChatMemory.provider())
    assert [p.split(":")[0] for p in found] == ["Tutor.conversation_stats", "Tutor.forget"]
    assert all("rename it" in p for p in found)


def test_the_memory_access_declarations_may_be_repeated() -> None:
    from collections.abc import Hashable

    from aiservices import ChatMemoryAccess

    class Bot(ChatMemoryAccess, Protocol):
        def chat(self, user: Annotated[str, MemoryId], message: str) -> str: ...

        def forget(self, memory_id: Hashable) -> None: ...

    bot = build(Bot, chat_memory_provider=MessageWindowChatMemory.provider())
    bot.chat("a", "hi")  # type: ignore[attr-defined]
    bot.forget("a")  # type: ignore[attr-defined]
    assert bot.get_chat_memory("a").messages() == []  # type: ignore[attr-defined]


def test_a_user_name_that_is_not_text_fails_the_build() -> None:
    class Bot(Protocol):
        def chat(self, who: Annotated[int, UserName], message: str) -> str: ...

    [problem] = problems(Bot)
    assert problem.startswith("Bot.chat(who)")
    assert "annotate it str (or str | None)" in problem

    class Fine(Protocol):
        def chat(self, who: Annotated[str | None, UserName], message: str) -> str: ...

    build(Fine)


class Nothing(enum.Enum):
    """An enum without members."""


def test_return_types_no_answer_could_be_fail_the_build() -> None:
    class Bot(Protocol):
        def pick(self, text: str) -> Nothing: ...

        def none(self, text: str) -> Literal[None]: ...

    found = problems(Bot)
    assert any("has no members" in p for p in found)
    assert any("Literal[None] carries no answer" in p for p in found)


def test_a_declared_method_stays_the_models_when_decorated_or_raising_with_details() -> None:
    def logged(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs)

        return wrapper

    class Bot(Protocol):
        @logged
        def chat(self, message: str) -> str: ...

        def explain(self, topic: str) -> str:
            raise NotImplementedError(f"the model explains {topic}")

    bot = ai_service(Bot, model=ScriptedChatModel("from the model", "explained"))
    assert bot.chat("hi") == "from the model"
    assert bot.explain("tides") == "explained"


Handle = NewType("Handle", str)


def test_a_user_name_may_be_any_kind_of_text() -> None:
    class Bot(Protocol):
        def a(self, who: Annotated[Handle, UserName], message: str) -> str: ...

        def b(self, who: Annotated[Literal["ada", "bob"], UserName], message: str) -> str: ...

        def c(self, who: Annotated[LiteralString | None, UserName], message: str) -> str: ...

    bot = build(Bot)
    assert bot.a(Handle("ada"), "hi") == "ok"  # type: ignore[attr-defined]


class Account(BaseModel):
    number: str


def test_a_memory_id_whose_values_cannot_be_hashed_fails_the_build() -> None:
    class Bot(Protocol):
        def by_tags(self, tags: Annotated[list[str], MemoryId], text: str) -> str: ...

        def by_account(self, account: Annotated[Account, MemoryId], text: str) -> str: ...

        def by_name(self, name: Annotated[str | None, MemoryId], text: str) -> str: ...

    found = problems(Bot, chat_memory_provider=MessageWindowChatMemory.provider())
    assert [p.split(":")[0] for p in found] == ["Bot.by_tags(tags)", "Bot.by_account(account)"]
    assert all("a MemoryId must be hashable" in p for p in found)


def test_a_template_that_fails_to_parse_is_not_also_said_to_leave_out_its_parameters() -> None:
    class Bot(Protocol):
        @user_message("Hi {{}}, answer {{question}}")
        def ask(self, question: str) -> str: ...

    assert problems(Bot) == [
        "Bot.ask(): @user_message: template placeholder '{{}}' must hold a name, like {{topic}}"
    ]

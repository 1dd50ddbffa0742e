"""The public tool surface: @tool, ToolExecution, the error types."""

import asyncio
import dataclasses
import functools
import pickle

import pytest

from aiservices.errors import AiServiceError
from aiservices.messages import ToolExecutionRequest, ToolExecutionResultMessage
from aiservices.models import ToolSpecification as ModelsToolSpecification
from aiservices.tools import (
    ToolArgumentsError,
    ToolExecution,
    ToolExecutionError,
    ToolRaisedError,
    ToolSpecification,
    UnknownToolError,
    tool,
    tool_options,
)


def test_public_names() -> None:
    from aiservices import tools

    assert sorted(tools.__all__) == [
        "Tool",
        "ToolArgumentsError",
        "ToolErrorHandler",
        "ToolErrorKind",
        "ToolExecution",
        "ToolExecutionError",
        "ToolRaisedError",
        "ToolSpecification",
        "UnknownToolError",
        "tool",
    ]
    assert ToolSpecification is ModelsToolSpecification


def test_bare_decorator_returns_the_function_unchanged() -> None:
    def add(a: int, b: int) -> int:
        return a + b

    assert tool(add) is add
    assert add(1, b=2) == 3
    options = tool_options(add)
    assert options is not None
    assert (options.name, options.description, options.return_direct) == (None, None, False)


def test_decorator_with_options() -> None:
    @tool(name="lookup-order", description="Find an order.", return_direct=True)
    def lookup(order_id: str) -> str:
        return order_id

    assert lookup("A1") == "A1"
    options = tool_options(lookup)
    assert options is not None
    assert (options.name, options.description, options.return_direct) == (
        "lookup-order",
        "Find an order.",
        True,
    )


def test_empty_parentheses_work_like_the_bare_decorator() -> None:
    @tool()
    def ping() -> str:
        return "pong"

    assert ping() == "pong"
    assert tool_options(ping) is not None


async def test_async_functions_stay_coroutine_functions() -> None:
    @tool
    async def fetch(n: int) -> int:
        await asyncio.sleep(0)
        return n

    assert asyncio.iscoroutinefunction(fetch)
    assert await fetch(3) == 3


def test_methods_static_and_class_methods_are_marked() -> None:
    class Shop:
        @tool
        def price(self, item: str) -> int:
            return len(item)

        @tool
        @staticmethod
        def static_first(x: int) -> int:
            return x

        @staticmethod
        @tool
        def tool_first(x: int) -> int:
            return x

        @tool
        @classmethod
        def kind(cls) -> str:
            return cls.__name__

    shop = Shop()
    assert shop.price("abc") == 3
    assert Shop.static_first(1) == 1
    assert Shop.tool_first(2) == 2
    assert shop.kind() == "Shop"
    for name in ("price", "static_first", "tool_first", "kind"):
        assert tool_options(getattr(shop, name)) is not None, name


def test_unmarked_functions_have_no_options() -> None:
    def plain() -> None: ...

    assert tool_options(plain) is None


@pytest.mark.parametrize("name", ["", "has space", "a" * 65, "ümlaut", "dot.ted"])
def test_invalid_names_are_refused_at_once(name: str) -> None:
    with pytest.raises(ValueError, match="a tool name is 1 to 64 letters, digits"):
        tool(name=name)


def test_a_positional_name_is_a_clear_mistake() -> None:
    with pytest.raises(TypeError, match=r"@tool\(name='add'\)"):
        tool("add")  # type: ignore[call-overload]


def test_bad_option_types() -> None:
    with pytest.raises(TypeError, match="description"):
        tool(description=3)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="return_direct"):
        tool(return_direct="yes")  # type: ignore[call-overload]


def test_classes_bound_methods_and_non_callables_cannot_be_marked() -> None:
    class Thing:
        def method(self) -> None: ...

    with pytest.raises(TypeError, match=r"cannot mark the class .*Thing: mark the methods"):
        tool(Thing)
    with pytest.raises(TypeError, match="cannot mark the bound method"):
        tool(Thing().method)
    with pytest.raises(TypeError, match="not int"):
        tool(3)  # type: ignore[call-overload]


def test_builtins_without_attributes_cannot_be_marked() -> None:
    with pytest.raises(TypeError, match="takes no attributes; wrap it in a function"):
        tool(len)


def test_partials_can_be_marked() -> None:
    def power(base: int, exponent: int) -> int:
        return int(base**exponent)

    square = tool(name="square")(functools.partial(power, exponent=2))
    assert square(3) == 9
    options = tool_options(square)
    assert options is not None
    assert options.name == "square"


def test_tool_execution_is_frozen_and_becomes_a_message() -> None:
    request = ToolExecutionRequest("call_1", "add", '{"a": 1}')
    execution = ToolExecution(request, "3", 3)
    assert execution.error is None
    assert execution.return_direct is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        execution.result = "4"  # type: ignore[misc]
    assert execution.to_message() == ToolExecutionResultMessage("call_1", "add", "3")


@pytest.mark.parametrize(
    ("cls", "kind"),
    [
        (ToolArgumentsError, "arguments"),
        (UnknownToolError, "unknown_tool"),
        (ToolRaisedError, "raised"),
    ],
)
def test_error_kinds(cls: type[ToolExecutionError], kind: str) -> None:
    request = ToolExecutionRequest("1", "add", "{}")
    error = cls("the text", request)
    assert isinstance(error, ToolExecutionError)
    assert isinstance(error, AiServiceError)
    assert error.kind == kind
    assert error.request is request
    assert error.tool_name == "add"
    assert str(error) == "the text"
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert (str(copy), copy.request) == ("the text", request)

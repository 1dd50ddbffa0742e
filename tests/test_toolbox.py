"""Collecting tools and carrying out the model's tool requests."""

import asyncio
import dataclasses
import enum
import functools
import threading
import time
from typing import Annotated, Any

import pytest
from pydantic import BaseModel

from aiservices import _tool_schema
from aiservices._toolbox import Toolbox
from aiservices.errors import InterfaceError
from aiservices.markers import MemoryId
from aiservices.messages import ToolExecutionRequest, ToolExecutionResultMessage
from aiservices.tools import (
    ToolArgumentsError,
    ToolExecutionError,
    ToolRaisedError,
    UnknownToolError,
    tool,
)


def call(name: str, arguments: str = "{}", id: str = "call_1") -> ToolExecutionRequest:
    return ToolExecutionRequest(id, name, arguments)


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def echo(text: str) -> str:
    """Say it back.

    Exactly as given.
    """
    return text


class Order(BaseModel):
    id: str
    total: float


@dataclasses.dataclass
class Item:
    name: str
    qty: int


class Shop:
    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.calls: list[str] = []

    @tool
    def owner_of(self, shop: str) -> str:
        """Who runs the shop."""
        self.calls.append(shop)
        return f"{self.owner} runs {shop}"

    @tool(name="find_order", return_direct=True)
    def lookup(self, order_id: str) -> Order:
        return Order(id=order_id, total=9.5)

    @staticmethod
    @tool
    def vat(amount: float) -> float:
        return amount * 0.2

    @tool
    @classmethod
    def shop_kind(cls) -> str:
        return cls.__name__

    def not_a_tool(self) -> None:
        """Not a tool: no @tool."""


# -- collecting ---------------------------------------------------------------------------


def test_functions_and_object_methods_become_tools_in_order() -> None:
    shop = Shop("Ann")
    box = Toolbox.from_objects([add, echo, shop])
    assert box.names == ("add", "echo", "owner_of", "find_order", "vat", "shop_kind")
    assert len(box) == 6
    assert box
    assert "echo" in box
    assert "not_a_tool" not in box
    assert repr(box).startswith("Toolbox(['add', 'echo'")
    specs = {s.name: s for s in box.specifications}
    assert specs["add"].description == "Add two integers."
    assert specs["echo"].description == "Say it back.\n\nExactly as given."
    assert specs["find_order"].description == ""
    assert specs["owner_of"].parameters == {
        "type": "object",
        "properties": {"shop": {"type": "string"}},
        "required": ["shop"],
        "additionalProperties": False,
    }
    assert specs["shop_kind"].parameters["properties"] == {}


def test_methods_are_bound_to_their_object() -> None:
    ann, bob = Shop("Ann"), Shop("Bob")
    box_a = Toolbox.from_objects([ann])
    box_b = Toolbox.from_objects([bob])
    assert box_a.execute(call("owner_of", '{"shop": "X"}')).result == "Ann runs X"
    assert box_b.execute(call("owner_of", '{"shop": "Y"}')).result == "Bob runs Y"
    assert ann.calls == ["X"]
    assert bob.calls == ["Y"]
    assert box_a.execute(call("vat", '{"amount": 10}')).value == 2.0
    assert box_a.execute(call("shop_kind")).result == "Shop"


def test_bound_methods_and_partials_can_be_given_one_by_one() -> None:
    def power(base: int, exponent: int) -> int:
        """Raise base to exponent."""
        return int(base**exponent)

    shop = Shop("Ann")
    square = tool(name="square")(functools.partial(power, exponent=2))
    box = Toolbox.from_objects([shop.owner_of, square])
    assert box.names == ("owner_of", "square")
    assert box.specifications[1].description == "Raise base to exponent."
    assert box.specifications[1].parameters["required"] == ["base"]
    assert box.execute(call("square", '{"base": 3}')).result == "9"
    assert box.execute(call("owner_of", '{"shop": "Z"}')).result == "Ann runs Z"


def test_a_partials_fixed_keywords_are_neither_shown_nor_accepted() -> None:
    # Fixed by the application (an owner, a key): the model must not see or change them.
    def delete_order(owner: str, order_id: str) -> str:
        """Delete one of the owner's orders."""
        return f"deleted {order_id} of {owner}"

    box = Toolbox.from_objects([functools.partial(delete_order, owner="alice")])
    parameters = box.specifications[0].parameters
    assert list(parameters["properties"]) == ["order_id"]
    assert "alice" not in str(parameters)
    assert box.execute(call("delete_order", '{"order_id": "o1"}')).result == "deleted o1 of alice"
    overridden = box.execute(call("delete_order", '{"order_id": "o1", "owner": "bob"}'))
    assert isinstance(overridden.error, ToolArgumentsError)
    assert "owner" in overridden.result


def test_an_overriding_method_without_tool_is_not_a_tool() -> None:
    class Quiet(Shop):
        def owner_of(self, shop: str) -> str:
            return "secret"

    assert "owner_of" not in Toolbox.from_objects([Quiet("Ann")])


def test_subclasses_inherit_tool_methods() -> None:
    class Bigger(Shop):
        @tool
        def extra(self) -> str:
            return "more"

    names = Toolbox.from_objects([Bigger("Ann")]).names
    assert names == ("owner_of", "find_order", "vat", "shop_kind", "extra")


def test_a_callable_object_is_named_after_its_class_and_has_no_borrowed_description() -> None:
    class Weather:
        @tool
        def __call__(self, city: str) -> str:
            return city

    class Forecast:
        def __call__(self, city: str) -> str:
            """Tomorrow's weather in a city."""
            return city

    class Lookup:
        def __call__(self, key: str) -> str:
            """Look the key up."""
            return key

    class Orders(Lookup):
        pass

    class Customers(Lookup):
        pass

    class Tagged(Weather):
        pass

    items = [Weather(), tool(Forecast()), tool(Orders()), tool(Customers()), Tagged()]
    specs = Toolbox.from_objects(items).specifications
    # Not "__call__", and not object's "Call self as a function." Each object is named
    # after its own class, and takes the docstring of the __call__ it inherits.
    assert [(s.name, s.description) for s in specs] == [
        ("Weather", ""),
        ("Forecast", "Tomorrow's weather in a city."),
        ("Orders", "Look the key up."),
        ("Customers", "Look the key up."),
        ("Tagged", ""),
    ]


def test_empty_toolbox() -> None:
    box = Toolbox.from_objects([])
    assert not box
    assert len(box) == 0
    assert box.specifications == ()
    execution = box.execute(call("anything"))
    assert isinstance(execution.error, UnknownToolError)
    assert execution.result == "There is no tool named 'anything', nor any other tool."


def test_duplicate_names_are_an_interface_error_listing_them() -> None:
    @tool(name="add")
    def other_add(x: int) -> int:
        return x

    with pytest.raises(InterfaceError) as info:
        Toolbox.from_objects([add, other_add, Shop("a"), Shop("b")])
    problems = info.value.problems
    assert len(problems) == 5  # add, and each of Shop's four tools
    assert problems[0].startswith("tools: the tool name 'add' is used 2 times (add, ")
    assert ".<locals>.other_add)" in problems[0]
    assert "'owner_of' is used 2 times (Shop.owner_of, Shop.owner_of)" in problems[1]


def test_the_same_function_twice_is_a_duplicate() -> None:
    with pytest.raises(InterfaceError, match="'echo' is used 2 times"):
        Toolbox.from_objects([echo, echo])


def test_build_errors_are_gathered() -> None:
    def variadic(*args: int) -> None: ...

    class NoTools:
        def method(self) -> None: ...

    with pytest.raises(InterfaceError) as info:
        Toolbox.from_objects([add, variadic, NoTools(), Shop, "echo", lambda x: x])
    problems = info.value.problems
    assert len(problems) == 6, problems
    assert problems[0].startswith(
        "test_build_errors_are_gathered.<locals>.variadic(args): a tool cannot take *args"
    )
    assert problems[1].startswith("tools[2]: a test_build_errors_are_gathered.<locals>.NoTools ")
    assert "object is neither a function nor an object with @tool methods" in problems[1]
    assert problems[1].endswith("mark the methods the model may call with @tool")
    assert problems[2].startswith("tools[3]: Shop is a class; pass an instance")
    assert problems[3].startswith("tools[4]: 'echo' is neither a function nor an object")
    assert "'<lambda>' is not a valid tool name" in problems[4]
    assert "@tool(name=...)" in problems[4]
    # A parameter without a type would reach the model as {} (strict mode refuses it).
    assert "<lambda>(x): the parameter has no type; annotate it" in problems[5]


def test_tools_must_be_a_collection() -> None:
    with pytest.raises(TypeError, match=r"tools takes a list of functions and objects"):
        Toolbox.from_objects(add)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"tools takes a list"):
        Toolbox.from_objects("add")


def test_error_handler_must_be_callable() -> None:
    with pytest.raises(TypeError, match=r"error_handler must be a callable \(error, request\)"):
        Toolbox.from_objects([add], error_handler="ignore")  # type: ignore[arg-type]


def test_merge_adds_tools_and_checks_duplicates() -> None:
    def handler(error: ToolExecutionError, request: ToolExecutionRequest) -> str:
        return "handled"

    base = Toolbox.from_objects([add], error_handler=handler)
    merged = base.merge(Toolbox.from_objects([echo]))
    assert merged.names == ("add", "echo")
    assert [s.name for s in merged.specifications] == ["add", "echo"]
    assert base.names == ("add",)
    assert merged.execute(call("nope")).result == "handled"
    assert base.merge(Toolbox.from_objects([])) is base
    with pytest.raises(InterfaceError, match="'add' is used 2 times"):
        base.merge(Toolbox.from_objects([add]))


def test_analysis_is_cached_per_function(monkeypatch: pytest.MonkeyPatch) -> None:
    def fresh(a: int) -> int:
        return a

    class Fresh:
        @tool
        def one(self) -> None: ...

        @tool
        def two(self) -> None: ...

    calls: list[object] = []
    real = _tool_schema.read_signature

    def counting(fn: Any, **kwargs: Any) -> Any:
        calls.append(fn)
        return real(fn, **kwargs)

    monkeypatch.setattr(_tool_schema, "read_signature", counting)
    first = Toolbox.from_objects([fresh, Fresh()])
    second = Toolbox.from_objects([fresh, Fresh()])
    assert calls == [fresh, Fresh.one, Fresh.two]
    assert all(a is b for a, b in zip(first.specifications, second.specifications, strict=True))


def test_re_decorating_a_function_refreshes_its_analysis() -> None:
    def renamed(a: int) -> int:
        return a

    assert Toolbox.from_objects([renamed]).names == ("renamed",)
    tool(name="other")(renamed)
    assert Toolbox.from_objects([renamed]).names == ("other",)


# -- executing ----------------------------------------------------------------------------


def test_execute_validates_calls_and_returns_text() -> None:
    box = Toolbox.from_objects([add])
    request = call("add", '{"a": 2, "b": "3"}')
    execution = box.execute(request)
    assert execution.request is request
    assert execution.result == "5"
    assert execution.value == 5
    assert execution.error is None
    assert execution.return_direct is False
    assert execution.to_message() == ToolExecutionResultMessage("call_1", "add", "5")


def void() -> None:
    pass


def maybe() -> int | None:
    return None


def untyped():  # type: ignore[no-untyped-def]
    return None


def model() -> Order:
    return Order(id="A1", total=2.5)


def data() -> Item:
    return Item("pen", 2)


def mapping() -> dict[str, Any]:
    return {"a": [1, 2], "b": None, "c": "ü"}


def listing() -> list[Order]:
    return [Order(id="A", total=1)]


def text() -> str:
    return "plain text, not JSON"


def flag() -> bool:
    return True


class Label(str):
    def __str__(self) -> str:
        return f"Label({super().__str__()})"


def label() -> str:
    return Label('Left at "door 2"\nthanks')


class Status(enum.StrEnum):
    SHIPPED = "shipped"


def status() -> Status:
    return Status.SHIPPED


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (text, "plain text, not JSON"),
        (void, "Success"),
        (untyped, "Success"),
        (maybe, "null"),
        (model, '{"id":"A1","total":2.5}'),
        (data, '{"name":"pen","qty":2}'),
        (mapping, '{"a":[1,2],"b":null,"c":"ü"}'),
        (listing, '[{"id":"A","total":1.0}]'),
        (flag, "true"),
        (label, 'Left at "door 2"\nthanks'),  # a str subclass is a str, sent as it is
        (status, '"shipped"'),  # an enum, even a str one, is sent as JSON
    ],
)
def test_result_text(fn: Any, expected: str) -> None:
    execution = Toolbox.from_objects([fn]).execute(call(fn.__name__))
    assert execution.error is None
    assert execution.result == expected


def test_a_value_without_json_form_is_reported_to_the_model() -> None:
    def loop() -> list[Any]:
        items: list[Any] = []
        items.append(items)
        return items

    execution = Toolbox.from_objects([loop]).execute(call("loop"))
    assert isinstance(execution.error, ToolRaisedError)
    assert execution.result.startswith("Tool 'loop' returned a list that has no JSON form:")
    assert isinstance(execution.error.__cause__, ValueError)


def test_objects_without_json_form_are_sent_as_their_str() -> None:
    class Thing:
        def __str__(self) -> str:
            return "a thing"

    def make() -> Any:
        return {"thing": Thing()}

    assert Toolbox.from_objects([make]).execute(call("make")).result == '{"thing":"a thing"}'


def test_memory_id_is_injected() -> None:
    seen: list[object] = []

    def remember(fact: str, user: Annotated[str, MemoryId]) -> str:
        seen.append(user)
        return f"{user}: {fact}"

    box = Toolbox.from_objects([remember])
    assert box.specifications[0].parameters["properties"] == {"fact": {"type": "string"}}
    assert box.execute(call("remember", '{"fact": "f"}'), "alice").result == "alice: f"
    assert box.execute(call("remember", '{"fact": "g"}')).result == "None: g"
    assert seen == ["alice", None]


def test_return_direct_is_set_only_on_success() -> None:
    box = Toolbox.from_objects([Shop("Ann")])
    ok = box.execute(call("find_order", '{"order_id": "A7"}'))
    assert ok.return_direct is True
    assert ok.value == Order(id="A7", total=9.5)
    failed = box.execute(call("find_order", "{}"))
    assert failed.return_direct is False


# -- recoverable errors -------------------------------------------------------------------


def test_arguments_that_are_not_json() -> None:
    execution = Toolbox.from_objects([add]).execute(call("add", '{"a": 1,'))
    error = execution.error
    assert isinstance(error, ToolArgumentsError)
    assert error.kind == "arguments"
    assert execution.value is None
    assert execution.result.startswith("Invalid arguments for tool 'add': Invalid JSON: ")
    assert execution.result.endswith("Call it again with arguments that match its parameters.")
    assert type(error.__cause__).__name__ == "ValidationError"


def test_arguments_that_do_not_validate() -> None:
    execution = Toolbox.from_objects([add]).execute(call("add", '{"a": "one", "c": 3}'))
    assert isinstance(execution.error, ToolArgumentsError)
    assert execution.result == (
        "Invalid arguments for tool 'add': a: Input should be a valid integer, unable to "
        'parse string as an integer (got "one"); b: Field required; '
        "c: Extra inputs are not permitted. "
        "Call it again with arguments that match its parameters."
    )


def test_a_made_up_tool_name_lists_the_real_ones() -> None:
    execution = Toolbox.from_objects([add, echo]).execute(call("multiply"))
    assert isinstance(execution.error, UnknownToolError)
    assert execution.error.kind == "unknown_tool"
    assert execution.result == "There is no tool named 'multiply'. The tools are: add, echo."
    assert execution.to_message().tool_name == "multiply"


def test_a_tool_that_raises() -> None:
    def divide(a: int, b: int) -> int:
        return a // b

    def fail() -> None:
        raise KeyError

    box = Toolbox.from_objects([divide, fail])
    execution = box.execute(call("divide", '{"a": 1, "b": 0}'))
    assert isinstance(execution.error, ToolRaisedError)
    assert execution.error.kind == "raised"
    assert (
        execution.result
        == "Tool 'divide' raised ZeroDivisionError: integer division or modulo by zero"
    )
    assert isinstance(execution.error.__cause__, ZeroDivisionError)
    assert box.execute(call("fail")).result == "Tool 'fail' raised KeyError"


def test_a_tool_that_raises_an_exception_group_shows_what_it_holds() -> None:
    import asyncio

    async def forecast(city: str) -> str:
        raise LookupError(f"no weather station in {city}")

    async def forecasts(cities: list[str]) -> list[str]:
        async with asyncio.TaskGroup() as group:  # wraps what its tasks raise
            tasks = [group.create_task(forecast(city)) for city in cities]
        return [task.result() for task in tasks]

    box = Toolbox.from_objects([forecasts])
    execution = box.execute(call("forecasts", '{"cities": ["Atlantis"]}'))
    assert execution.result == (
        "Tool 'forecasts' raised LookupError: no weather station in Atlantis"
    )
    assert isinstance(execution.error, ToolRaisedError)
    assert isinstance(execution.error.__cause__, ExceptionGroup)
    several = box.execute(call("forecasts", '{"cities": ["Atlantis", "Mu"]}'))
    assert several.result == (
        "Tool 'forecasts' raised LookupError: no weather station in Atlantis; "
        "LookupError: no weather station in Mu"
    )


async def test_a_sync_tool_raising_stop_iteration_is_reported_in_an_async_call() -> None:
    # The everyday `next(...)` that finds nothing. asyncio can't hold a StopIteration as a
    # future's outcome, so carried as it is from the tool's thread the call never ended.
    def find(order_id: str) -> str:
        return next(o for o in ["1"] if o == order_id)

    box = Toolbox.from_objects([find])
    execution = await asyncio.wait_for(box.aexecute(call("find", '{"order_id": "9"}')), 5)
    assert isinstance(execution.error, ToolRaisedError)
    assert execution.result == "Tool 'find' raised StopIteration"
    assert isinstance(execution.error.__cause__, StopIteration)
    assert box.execute(call("find", '{"order_id": "9"}')).result == execution.result


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, asyncio.CancelledError])
def test_interrupts_are_never_converted(exc: type[BaseException]) -> None:
    def stop() -> None:
        raise exc

    with pytest.raises(exc):
        Toolbox.from_objects([stop]).execute(call("stop"))


@pytest.mark.parametrize("exc", [KeyboardInterrupt, asyncio.CancelledError])
async def test_interrupts_are_never_converted_async(exc: type[BaseException]) -> None:
    async def stop() -> None:
        raise exc

    with pytest.raises(exc):
        await Toolbox.from_objects([stop]).aexecute(call("stop"))


# -- error handler ------------------------------------------------------------------------


def test_error_handler_text_goes_to_the_model() -> None:
    seen: list[tuple[str, str]] = []

    def handler(error: ToolExecutionError, request: ToolExecutionRequest) -> str:
        assert error.request is request
        seen.append((error.kind, request.name))
        return f"sorry: {error.kind}"

    box = Toolbox.from_objects([add], error_handler=handler)
    assert box.execute(call("nope")).result == "sorry: unknown_tool"
    execution = box.execute(call("add", "{}"))
    assert execution.result == "sorry: arguments"
    assert isinstance(execution.error, ToolArgumentsError)
    assert box.execute(call("add", '{"a": 1, "b": 2}')).result == "3"
    assert seen == [("unknown_tool", "nope"), ("arguments", "add")]


def test_error_handler_may_raise_to_end_the_call() -> None:
    def boom() -> None:
        raise RuntimeError("disk on fire")

    def strict(error: ToolExecutionError, request: ToolExecutionRequest) -> str:
        raise error

    box = Toolbox.from_objects([boom], error_handler=strict)
    with pytest.raises(ToolRaisedError, match="disk on fire") as info:
        box.execute(call("boom"))
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(UnknownToolError):
        box.execute(call("nope"))


def test_error_handler_must_return_text() -> None:
    box = Toolbox.from_objects([add], error_handler=lambda error, request: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match=r"error_handler must return the text for the model"):
        box.execute(call("nope"))


async def test_error_handler_raising_in_aexecute_all_cancels_the_rest() -> None:
    finished: list[str] = []

    async def slow() -> str:
        await asyncio.sleep(5)
        finished.append("slow")
        return "late"

    def strict(error: ToolExecutionError, request: ToolExecutionRequest) -> str:
        raise error

    box = Toolbox.from_objects([slow, add], error_handler=strict)
    started = time.perf_counter()
    with pytest.raises(ToolArgumentsError):
        await box.aexecute_all([call("slow", id="1"), call("add", "{}", id="2")])
    assert time.perf_counter() - started < 2
    assert finished == []


async def test_error_handler_raising_in_aexecute_all_waits_for_a_sync_tools_thread() -> None:
    # The call ends only once the sibling's thread has: nothing of it runs on afterwards.
    state: list[str] = []

    def blocking() -> str:
        state.append("running")
        time.sleep(0.3)
        state.append("finished")
        return "late"

    def strict(error: ToolExecutionError, request: ToolExecutionRequest) -> str:
        raise error

    box = Toolbox.from_objects([blocking, add], error_handler=strict)
    with pytest.raises(ToolArgumentsError):
        await box.aexecute_all([call("blocking", id="1"), call("add", "{}", id="2")])
    assert state == ["running", "finished"]


# -- sync and async -----------------------------------------------------------------------


async def sleepy(name: str) -> str:
    await asyncio.sleep(0.1)
    return name


def test_async_tool_in_a_sync_call() -> None:
    execution = Toolbox.from_objects([sleepy]).execute(call("sleepy", '{"name": "n"}'))
    assert execution.result == "n"


async def test_async_tool_in_a_sync_call_inside_a_running_loop() -> None:
    box = Toolbox.from_objects([sleepy])
    # A sync call made from a coroutine: the tool cannot use this thread's busy loop.
    assert box.execute(call("sleepy", '{"name": "inner"}')).result == "inner"


def test_async_tool_errors_in_a_sync_call_inside_a_running_loop() -> None:
    async def broken() -> None:
        raise ValueError("bad")

    async def main() -> str:
        return Toolbox.from_objects([broken]).execute(call("broken")).result

    assert asyncio.run(main()) == "Tool 'broken' raised ValueError: bad"


async def test_aexecute_awaits_async_tools_and_runs_sync_ones_in_a_thread() -> None:
    threads: list[int] = []

    def where() -> str:
        threads.append(threading.get_ident())
        return "ok"

    box = Toolbox.from_objects([sleepy, where])
    assert (await box.aexecute(call("sleepy", '{"name": "a"}'))).result == "a"
    assert (await box.aexecute(call("where"))).result == "ok"
    assert threads != [threading.get_ident()]


async def test_a_sync_tool_does_not_block_the_loop() -> None:
    def blocking() -> str:
        time.sleep(0.2)
        return "done"

    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticking = asyncio.create_task(ticker())
    try:
        execution = await Toolbox.from_objects([blocking]).aexecute(call("blocking"))
    finally:
        ticking.cancel()
    assert execution.result == "done"
    assert ticks >= 5


async def test_aexecute_all_runs_concurrently_in_request_order() -> None:
    async def wait(ms: int, tag: str) -> str:
        await asyncio.sleep(ms / 1000)
        return tag

    box = Toolbox.from_objects([wait])
    requests = [
        call("wait", '{"ms": 100, "tag": "first"}', id="1"),
        call("wait", '{"ms": 60, "tag": "second"}', id="2"),
    ]
    started = time.perf_counter()
    executions = await box.aexecute_all(requests)
    elapsed = time.perf_counter() - started
    assert elapsed < 0.18
    assert [e.result for e in executions] == ["first", "second"]
    assert [e.request.id for e in executions] == ["1", "2"]


async def test_two_async_tools_of_100ms_take_about_100ms() -> None:
    box = Toolbox.from_objects([sleepy])
    started = time.perf_counter()
    executions = await box.aexecute_all(
        [call("sleepy", '{"name": "a"}', id="1"), call("sleepy", '{"name": "b"}', id="2")]
    )
    assert time.perf_counter() - started < 0.18
    assert [e.result for e in executions] == ["a", "b"]


async def test_aexecute_all_mixes_failures_and_successes_in_order() -> None:
    box = Toolbox.from_objects([add, sleepy])
    executions = await box.aexecute_all(
        [
            call("sleepy", '{"name": "a"}', id="1"),
            call("nope", id="2"),
            call("add", '{"a": 1, "b": 1}', id="3"),
        ]
    )
    assert [e.result for e in executions][::2] == ["a", "2"]
    assert isinstance(executions[1].error, UnknownToolError)
    assert await box.aexecute_all([]) == []


def test_execute_all_runs_in_order() -> None:
    order: list[str] = []

    def log(tag: str) -> str:
        order.append(tag)
        return tag

    box = Toolbox.from_objects([log])
    executions = box.execute_all(
        [call("log", '{"tag": "a"}', id="1"), call("log", '{"tag": "b"}', id="2")]
    )
    assert order == ["a", "b"]
    assert [e.to_message().id for e in executions] == ["1", "2"]


def test_a_sync_wrapper_returning_a_coroutine_is_awaited() -> None:
    def wrapped(name: str) -> Any:
        return sleepy(name)

    assert Toolbox.from_objects([wrapped]).execute(call("wrapped", '{"name": "w"}')).result == "w"


async def test_a_sync_wrapper_returning_a_coroutine_is_awaited_async() -> None:
    def wrapped(name: str) -> Any:
        return sleepy(name)

    box = Toolbox.from_objects([wrapped])
    assert (await box.aexecute(call("wrapped", '{"name": "w"}'))).result == "w"

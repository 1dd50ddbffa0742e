"""Collecting tools from ``tools=[...]`` and carrying out the model's tool requests.

Each function is analysed once (its schema, validator and options are cached on the function
object's identity), so a toolbox built per call, from a ``tool_provider``, costs a cache
lookup per tool.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypeGuard

from pydantic import ValidationError
from pydantic_core import to_json

from ._described import described
from ._locks import Reentered
from ._threads import Stopped, in_thread
from .errors import InterfaceError
from .messages import ToolExecutionRequest
from .models import ToolSpecification
from .tools import (
    Tool,
    ToolArgumentsError,
    ToolErrorHandler,
    ToolExecution,
    ToolExecutionError,
    ToolOptions,
    ToolRaisedError,
    UnknownToolError,
    tool_options,
    valid_tool_name,
)

if TYPE_CHECKING:
    from ._tool_schema import ToolSignature

__all__ = ["Toolbox"]

_iscoroutine: Final = inspect.iscoroutine
_VOID_TEXT: Final = "Success"


class _SchemaSignature:
    """A ``Tool``'s arguments: JSON checked against its schema, passed as keywords."""

    __slots__ = ("tool",)
    returns_nothing = False

    def __init__(self, tool: Tool) -> None:
        self.tool = tool

    def bind(
        self, arguments: str, memory_id: object, context: object = None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        import json

        try:
            kwargs = json.loads(arguments or "{}")
        except ValueError as exc:
            raise ValueError(f"the arguments are not JSON ({exc})") from None
        self.tool.check_arguments(kwargs)
        return (), kwargs


@dataclass(frozen=True, slots=True)
class _ToolPlan:
    """Everything about one function as a tool, bound to no object."""

    spec: ToolSpecification
    signature: ToolSignature | _SchemaSignature
    is_async: bool
    return_direct: bool
    none_text: str
    options: ToolOptions | None
    skip_first: bool
    where: str


class _Tool:
    """A plan and the callable that runs it (a function, or a method bound to its object).

    ``afn``, when given, is what async calls await instead of running a sync ``fn`` in a
    thread.
    """

    __slots__ = ("afn", "fn", "name", "plan")

    def __init__(
        self,
        plan: _ToolPlan,
        fn: Callable[..., Any],
        afn: Callable[..., Coroutine[Any, Any, Any]] | None = None,
    ) -> None:
        self.plan = plan
        self.fn = fn
        self.afn = afn
        self.name = plan.spec.name


# Keyed weakly by the function (a method's underlying function), so a dropped function is
# forgotten; an unhashable or unweakrefable callable is analysed each time instead.
_plans: weakref.WeakKeyDictionary[Any, _ToolPlan] = weakref.WeakKeyDictionary()
_class_tools: weakref.WeakKeyDictionary[type, tuple[str, ...]] = weakref.WeakKeyDictionary()


def _plan(function: Callable[..., Any], *, skip_first: bool) -> _ToolPlan:
    options = tool_options(function)
    try:
        plan = _plans.get(function)
    except TypeError:
        plan = None
    if plan is not None and plan.options is options and plan.skip_first is skip_first:
        return plan
    plan = _analyse(function, options, skip_first=skip_first)
    with contextlib.suppress(TypeError):
        _plans[function] = plan
    return plan


def _analyse(
    function: Callable[..., Any], options: ToolOptions | None, *, skip_first: bool
) -> _ToolPlan:
    where = _where(function)
    problems: list[str] = []
    name = options.name if options is not None and options.name else _name_of(function)
    if not valid_tool_name(name):
        problems.append(
            f"{where}: {name!r} is not a valid tool name (1 to 64 letters, digits, '_' or "
            "'-'); name it with @tool(name=...)"
        )
    if inspect.isasyncgenfunction(_target(function)):
        problems.append(
            f"{where}: an async generator can't be a tool (its result must be whole when the "
            "model reads it); collect its items in a list and return that"
        )
    # Schemas are read only for services that have tools, so not at `import aiservices`.
    from . import _tool_schema

    try:
        signature = _tool_schema.read_signature(function, skip_first=skip_first, where=where)
    except InterfaceError as exc:
        problems.extend(exc.problems)
    if problems:
        raise InterfaceError(problems)
    if options is not None and options.description is not None:
        description = options.description
    else:
        description = _doc_of(function)
    return _ToolPlan(
        spec=ToolSpecification(name, description, signature.schema),
        signature=signature,
        is_async=_is_async(function),
        return_direct=options is not None and options.return_direct,
        none_text=_VOID_TEXT if signature.returns_nothing else "null",
        options=options,
        skip_first=skip_first,
        where=where,
    )


def _target(function: Any) -> Any:
    """The Python function whose code runs: through partials, and to ``__call__``."""
    while isinstance(function, functools.partial):
        function = function.func
    if inspect.ismethod(function):
        function = function.__func__
    if inspect.isfunction(function) or inspect.isbuiltin(function):
        return function
    call = type(function).__call__ if callable(function) else None
    return call if inspect.isfunction(call) else function


def _name_of(function: Any) -> str:
    target = _target(function)
    name = getattr(target, "__name__", None)
    if name == "__call__":
        # A callable object is named after its class, as a function is after itself.
        is_object = not (
            target is function
            or inspect.ismethod(function)
            or isinstance(function, functools.partial)
        )
        if is_object:
            return type(function).__name__  # the object's own class
        owner = getattr(target, "__qualname__", "").split(".")
        return owner[-2] if len(owner) > 1 else type(function).__name__
    return name if isinstance(name, str) else type(function).__name__


def _where(function: Any) -> str:
    target = _target(function)
    where = getattr(target, "__qualname__", None) or repr(target)
    return f"partial({where})" if isinstance(function, functools.partial) else where


def _doc_of(function: Any) -> str:
    target = _target(function)
    if not inspect.isfunction(target):
        doc = target.__doc__
    else:
        # A method without a docstring of its own takes its base's, but never one of
        # Python's own (object's __call__ is "Call self as a function."): that says
        # nothing of a tool.
        doc = inspect.getdoc(target)
        builtin = getattr(object, target.__name__, None)
        if doc and target.__doc__ is None and builtin is not None:
            doc = None if doc == inspect.getdoc(builtin) else doc
    return inspect.cleandoc(doc) if doc else ""


def _is_async(function: Any) -> bool:
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(_target(function))


def _tool_method_names(cls: type) -> tuple[str, ...]:
    names = _class_tools.get(cls)
    if names is None:
        members: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            members.update(vars(klass))
        names = tuple(
            name
            for name, member in members.items()
            if tool_options(
                member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
            )
            is not None
        )
        _class_tools[cls] = names
    return names


def _is_function(item: object) -> TypeGuard[Callable[..., Any]]:
    return (
        inspect.isfunction(item)
        or inspect.ismethod(item)
        or inspect.isbuiltin(item)
        or isinstance(item, functools.partial)
        or (callable(item) and tool_options(item) is not None)
    )


def _collect(item: object, index: int, tools: list[_Tool], problems: list[str]) -> None:
    try:
        if isinstance(item, Tool):
            tools.append(_schema_tool(item))
        elif not isinstance(item, type) and callable(getattr(item, "aiservices_tools", None)):
            # A toolset (an MCP server's, say): the tools it offers now.
            offered: Iterable[Tool] = item.aiservices_tools()  # type: ignore[attr-defined]
            tools.extend(_schema_tool(found) for found in offered)
        elif isinstance(item, type):
            problems.append(
                f"tools[{index}]: {item.__qualname__} is a class; pass an instance, whose "
                "@tool methods become tools"
            )
        elif inspect.ismethod(item):
            plan = _plan(item.__func__, skip_first=True)
            tools.append(_Tool(plan, item))
        elif _is_function(item):
            tools.append(_Tool(_plan(item, skip_first=False), item))
        else:
            names = _tool_method_names(type(item))
            if not names:
                problems.append(
                    f"tools[{index}]: {_describe(item)} is neither a function nor an object "
                    "with @tool methods; mark the methods the model may call with @tool"
                )
            for name in names:
                bound = getattr(item, name)
                if inspect.ismethod(bound):
                    plan = _plan(bound.__func__, skip_first=True)
                else:
                    plan = _plan(bound, skip_first=False)
                if name == "__call__" and not (plan.options and plan.options.name):
                    # The object is named after its own class, wherever __call__ is defined.
                    spec = dataclasses.replace(plan.spec, name=type(item).__name__)
                    plan = dataclasses.replace(plan, spec=spec)
                tools.append(_Tool(plan, bound))
    except InterfaceError as exc:
        problems.extend(exc.problems)


def _schema_tool(item: Tool) -> _Tool:
    plan = _ToolPlan(
        spec=item.specification,
        signature=_SchemaSignature(item),
        is_async=_is_async(item.function),
        return_direct=False,
        none_text="null",
        options=None,
        skip_first=False,
        where=repr(item),
    )
    # A function with an awaitable form of its own (an MCP server's tool) is awaited by async
    # calls: a thread can't be stopped, so cancelling the call would wait for its end.
    awaited = getattr(item.function, "_aiservices_acall", None)
    return _Tool(plan, item.function, awaited if _is_async(awaited) else None)


def _describe(item: object) -> str:
    text = repr(item)
    if len(text) > 60:
        text = f"a {type(item).__qualname__} object"
    return text


ToolObserver: TypeAlias = tuple[
    Callable[[ToolExecutionRequest], None], Callable[[ToolExecution], None]
]
"""What is told of each tool run: its request when it starts, its execution when done."""


class Toolbox:
    """The tools of one call: their specifications, and the running of the model's requests.

    Build one with ``from_objects``. A request that fails (unknown tool, bad arguments,
    a tool that raises) becomes a ``ToolExecution`` whose ``result`` is the error text
    for the model, or whatever ``error_handler(error, request)`` returns; the handler may
    raise instead, and that exception ends the call. ``KeyboardInterrupt``, ``SystemExit``
    and ``asyncio.CancelledError`` always propagate.
    """

    __slots__ = ("_by_name", "_error_handler", "_tools", "names", "specifications")

    def __init__(
        self, tools: Sequence[_Tool] = (), *, error_handler: ToolErrorHandler | None = None
    ) -> None:
        """Prefer ``from_objects``; this takes already collected tools."""
        if error_handler is not None and not callable(error_handler):
            raise TypeError(
                "error_handler must be a callable (error, request) -> str, "
                f"got {type(error_handler).__name__}"
            )
        by_name: dict[str, _Tool] = {}
        duplicates: dict[str, list[str]] = {}
        for item in tools:
            first = by_name.setdefault(item.name, item)
            if first is not item:
                duplicates.setdefault(item.name, [first.plan.where]).append(item.plan.where)
        if duplicates:
            raise InterfaceError(
                [
                    f"tools: the tool name {name!r} is used {len(sources)} times "
                    f"({', '.join(sources)}); give each tool its own name with "
                    "@tool(name=...), or each McpToolset a prefix= of its own"
                    for name, sources in duplicates.items()
                ]
            )
        self._tools: tuple[_Tool, ...] = tuple(tools)
        self._by_name = by_name
        self._error_handler = error_handler
        self.names: tuple[str, ...] = tuple(by_name)
        """The tool names, in the order given."""
        self.specifications: tuple[ToolSpecification, ...] = tuple(t.plan.spec for t in self._tools)
        """What the model is shown, one specification per tool, in the order given."""

    @classmethod
    def from_objects(
        cls, items: Iterable[object], *, error_handler: ToolErrorHandler | None = None
    ) -> Toolbox:
        """Collect tools from functions and objects, as ``tools=[...]`` takes them.

        A function (``@tool`` or not; a plain function is named after itself, described by
        its docstring), a bound method, a ``functools.partial``, or an object whose class
        has ``@tool`` methods, each bound to the object. Every mistake (an object without
        tools, a parameter without a schema, ``*args``, a duplicate name) is reported in one
        ``InterfaceError``.
        """
        return cls(_collect_all(items), error_handler=error_handler)

    def merge(self, other: Toolbox) -> Toolbox:
        """This toolbox's tools, then ``other``'s, with this one's error handler.

        A name in both is an ``InterfaceError``, as in ``from_objects``.
        """
        if not other._tools:
            return self
        if not self._tools and other._error_handler is self._error_handler:
            return other
        return Toolbox([*self._tools, *other._tools], error_handler=self._error_handler)

    def __len__(self) -> int:
        return len(self._tools)

    def __bool__(self) -> bool:
        return bool(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __repr__(self) -> str:
        return f"Toolbox({list(self.names)!r})"

    def execute(
        self,
        request: ToolExecutionRequest,
        memory_id: object = None,
        context: object = None,
        observer: ToolObserver | None = None,
    ) -> ToolExecution:
        """Run one request in this thread; ``memory_id`` goes to ``MemoryId`` parameters,
        ``context`` to ``Context`` ones; ``observer``'s two functions are told when it
        starts and what came of it.

        An ``async def`` tool runs to completion on an event loop of its own (in a helper
        thread if this thread is already running one).
        """
        if observer is None:
            return self._execute(request, memory_id, context)
        started, finished = observer
        started(request)
        execution = self._execute(request, memory_id, context)
        finished(execution)
        return execution

    def _execute(
        self, request: ToolExecutionRequest, memory_id: object, context: object
    ) -> ToolExecution:
        tool = self._by_name.get(request.name)
        if tool is None:
            return self._failed(self._unknown(request))
        plan = tool.plan
        try:
            args, kwargs = plan.signature.bind(request.arguments, memory_id, context)
        except ValueError as exc:  # pydantic's ValidationError is one too
            error: ToolExecutionError = _arguments_error(request, exc)
        else:
            try:
                value = tool.fn(*args, **kwargs)
                if plan.is_async or _iscoroutine(value):
                    value = _run_coroutine(value)
            except Reentered:
                raise  # a call back into the conversation can never succeed: not the model's
            except Exception as exc:
                error = _raised_error(request, exc)
            else:
                return self._finish(plan, request, value)
        return self._failed(error)

    async def aexecute(
        self,
        request: ToolExecutionRequest,
        memory_id: object = None,
        context: object = None,
        observer: ToolObserver | None = None,
    ) -> ToolExecution:
        """Run one request without blocking the event loop: a sync tool runs in a thread."""
        if observer is None:
            return await self._aexecute(request, memory_id, context)
        started, finished = observer
        started(request)
        execution = await self._aexecute(request, memory_id, context)
        finished(execution)
        return execution

    async def _aexecute(
        self, request: ToolExecutionRequest, memory_id: object, context: object
    ) -> ToolExecution:
        tool = self._by_name.get(request.name)
        if tool is None:
            return self._failed(self._unknown(request))
        plan = tool.plan
        try:
            args, kwargs = plan.signature.bind(request.arguments, memory_id, context)
        except ValueError as exc:  # pydantic's ValidationError is one too
            error: ToolExecutionError = _arguments_error(request, exc)
        else:
            try:
                if plan.is_async:
                    value = await tool.fn(*args, **kwargs)
                elif tool.afn is not None:
                    value = await tool.afn(*args, **kwargs)
                else:
                    value = await in_thread(tool.fn, *args, **kwargs)
                    if _iscoroutine(value):
                        value = await value
            except Reentered:
                raise
            except Exception as exc:
                error = _raised_error(request, exc)
            else:
                return self._finish(plan, request, value)
        return self._failed(error)

    def execute_all(
        self,
        requests: Iterable[ToolExecutionRequest],
        memory_id: object = None,
        context: object = None,
        observer: ToolObserver | None = None,
    ) -> list[ToolExecution]:
        """Run requests one after another, in order."""
        return [self.execute(request, memory_id, context, observer) for request in requests]

    async def aexecute_all(
        self,
        requests: Iterable[ToolExecutionRequest],
        memory_id: object = None,
        context: object = None,
        observer: ToolObserver | None = None,
    ) -> list[ToolExecution]:
        """Run requests concurrently; the results come in request order.

        If one raises (through the error handler), the others are cancelled, and that
        exception propagates once they have stopped (a sync tool's thread runs to its end,
        as it does when the call itself is cancelled).
        """
        import asyncio

        pending = list(requests)
        if len(pending) <= 1:
            return [
                await self.aexecute(request, memory_id, context, observer) for request in pending
            ]
        tasks = [
            asyncio.ensure_future(self.aexecute(request, memory_id, context, observer))
            for request in pending
        ]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            for task in tasks:
                if not task.cancelled():
                    task.exception()  # retrieved, so asyncio does not log it as lost
            raise

    def _finish(self, plan: _ToolPlan, request: ToolExecutionRequest, value: Any) -> ToolExecution:
        if isinstance(value, str) and not isinstance(value, Enum):  # enums are sent as JSON
            text = str.__str__(value)  # a subclass's text as it is, not its __str__
        elif value is None:
            text = plan.none_text
        else:
            try:
                text = to_json(value, fallback=str).decode()
            except ValueError as exc:
                error = ToolRaisedError(
                    f"Tool {request.name!r} returned a {type(value).__name__} that has no "
                    f"JSON form: {exc}",
                    request,
                )
                error.__cause__ = exc
                return self._failed(error)
        return ToolExecution(request, text, value, None, plan.return_direct)

    def _failed(self, error: ToolExecutionError) -> ToolExecution:
        handler = self._error_handler
        request = error.request
        if handler is None:
            return ToolExecution(request, str(error), None, error, False)
        text = handler(error, request)
        if not isinstance(text, str):
            raise TypeError(
                "error_handler must return the text for the model (a str) or raise, "
                f"got {type(text).__name__}"
            )
        return ToolExecution(request, text, None, error, False)

    def _unknown(self, request: ToolExecutionRequest) -> UnknownToolError:
        if self.names:
            message = (
                f"There is no tool named {request.name!r}. The tools are: {', '.join(self.names)}."
            )
        else:
            message = f"There is no tool named {request.name!r}, nor any other tool."
        return UnknownToolError(message, request)


def _collect_all(items: Iterable[object]) -> list[_Tool]:
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise TypeError(
            f"tools takes a list of functions and objects (tools=[f, obj]), got {_describe(items)}"
        )
    tools: list[_Tool] = []
    problems: list[str] = []
    for index, item in enumerate(items):
        _collect(item, index, tools, problems)
    if problems:
        raise InterfaceError(problems)
    return tools


def _arguments_error(request: ToolExecutionRequest, exc: ValueError) -> ToolArgumentsError:
    from ._tool_schema import describe_validation_error

    detail = describe_validation_error(exc) if isinstance(exc, ValidationError) else str(exc)
    error = ToolArgumentsError(
        f"Invalid arguments for tool {request.name!r}: {detail}. "
        "Call it again with arguments that match its parameters.",
        request,
    )
    error.__cause__ = exc
    return error


def _raised_error(request: ToolExecutionRequest, exc: Exception) -> ToolRaisedError:
    if isinstance(exc, Stopped):
        exc = exc.stop
    error = ToolRaisedError(f"Tool {request.name!r} raised {described(exc)}", request)
    error.__cause__ = exc
    return error


def _run_coroutine(coroutine: Coroutine[Any, Any, Any]) -> Any:
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    # This thread's loop is busy running our caller, and cannot wait on itself: the
    # coroutine gets a loop of its own in a helper thread.
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        import asyncio

        try:
            outcome.append((True, asyncio.run(coroutine)))
        except BaseException as exc:
            outcome.append((False, exc))

    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(run,), name="aiservices-tool")
    thread.start()
    thread.join()
    ok, result = outcome[0]
    if ok:
        return result
    raise result
